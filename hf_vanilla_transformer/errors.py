"""Error messages on one line, as every command reports them, and transformers' log lines that we say otherwise."""

import contextlib
import logging
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


@contextlib.contextmanager
def transformers_lines_left_out(logger_name: str, phrase: str):
    """For the call only, the records of transformers' logger `logger_name` whose message holds `phrase` are left
    out, by a filter on that logger (public `logging` API; removed after): for lines that are false for our models
    or that we say in one line. Every other record of that logger, and every other logger, is untouched."""

    def without_phrase(record: logging.LogRecord) -> bool:
        return phrase not in record.getMessage()

    chosen = logging.getLogger(logger_name)
    chosen.addFilter(without_phrase)
    try:
        yield
    finally:
        chosen.removeFilter(without_phrase)
