"""Error messages on one line, as every command reports them."""


def one_line(error: BaseException) -> str:
    """The error's whole message on one line (YAML's and huggingface_hub's messages run over several)."""
    return " ".join(str(error).split())


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
