"""Error messages on one line, as every command reports them."""

import sys
from typing import NoReturn


def one_line(error: BaseException) -> str:
    """The error's whole message on one line (YAML's and huggingface_hub's messages run over several)."""
    return " ".join(str(error).split())


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def exit_refused(prog: str, error: BaseException) -> NoReturn:
    """End a command whose argument was refused (an output folder it does not own): one line and exit status 2, as
    argparse ends on a bad flag."""
    print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
    sys.exit(2)
