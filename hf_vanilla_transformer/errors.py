"""The library's error for a bad argument: its message names Python parameters, which command lines show as flags."""


class ParameterError(ValueError):
    """A bad argument. `parameters` are the parameter names its message mentions, so that a command line can show
    the same message with its flags (`hf_vanilla_transformer.cli.command_line_error`)."""

    def __init__(self, message: str, *parameters: str):
        super().__init__(message)
        self.parameters = parameters
