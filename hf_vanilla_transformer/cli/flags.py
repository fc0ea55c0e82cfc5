"""What the command lines share: `FlagParser` (run_translation.py and train_bpe.py: transformers' `HfArgumentParser`
whose errors are one line), recipe files (expanded to flags, which the parser then checks) and `--config_overrides`;
and for the console scripts, `CommandParser` and the `type=` functions that check each flag's value as argparse
reads it (one line, exit status 2), so that a value that cannot work stops a command before it reads, loads or
writes anything.

Library functions raise plain exceptions that name their own parameters; each command reports them in its own
name, in one line, with a non-zero exit.
"""

import argparse
import contextlib
import io
import json
import math
import os
import re
import signal
import sys
from collections.abc import Collection

import yaml
from transformers import HfArgumentParser

from hf_vanilla_transformer.errors import one_line
from hf_vanilla_transformer.hardware import parse_device

RECIPE_EXTENSIONS = (".yaml", ".yml", ".json")
FLAG_NAME = re.compile(r"[A-Za-z][\w-]*")


class FlagParser(HfArgumentParser):
    """`HfArgumentParser` whose errors (a mistyped flag, a bad value) are a ValueError of one line: argparse would
    print the whole usage (hundreds of lines for the Trainer's flags) above the error."""

    def error(self, message: str):
        raise ValueError(f"{message} (see --help)")


def recipe_flags(recipe_file: str, left_out: Collection[str] = ()) -> list[str]:
    """The command-line flags a recipe file (.yaml/.json mapping flag names to values) stands for: `name: value`
    becomes `--name value`, a list one flag with several values, true/false `true`/`false`. A null value, or a
    name in `left_out`, leaves the flag at its default. The command's parser then checks the flags as it checks
    those typed."""
    try:
        with open(recipe_file, encoding="utf-8") as file:
            recipe = json.load(file) if recipe_file.endswith(".json") else yaml.safe_load(file)
    except OSError as error:
        raise ValueError(f"{recipe_file}: cannot read the recipe ({error.strerror})") from None
    except (ValueError, RecursionError, yaml.YAMLError) as error:  # JSON and UTF-8 errors are ValueErrors
        raise ValueError(f"{recipe_file}: not a valid recipe ({one_line(error)})") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"{recipe_file}: a recipe is a mapping of flag names to values")
    flags = []
    for name, value in recipe.items():
        if not (isinstance(name, str) and FLAG_NAME.fullmatch(name)):
            raise ValueError(f"{recipe_file}: {name!r} is not a flag name")
        if value is None or name in left_out:
            continue
        values = value if isinstance(value, list) else [value]
        for one in values:
            if one is None or isinstance(one, (dict, list)):
                raise ValueError(f"{recipe_file}: {name}: {one!r} is not a value (a number, a string or true/false)")
        flags += [f"--{name}", *(str(one).lower() if isinstance(one, bool) else str(one) for one in values)]
    return flags


def expand_recipe(argv: list[str], replaces: dict[str, Collection[str]] | None = None) -> list[str]:
    """`argv` with a leading recipe file replaced by its flags; flags after the recipe override it. `replaces` maps
    a flag to the recipe's flags that it replaces when given after the recipe: those that would otherwise still
    apply beside it."""
    if argv and argv[0].endswith(RECIPE_EXTENSIONS):
        replaces = replaces or {}
        given = {flag_name(flag) for flag in argv[1:] if flag.startswith("--")}
        left_out = {name for flag in given & replaces.keys() for name in replaces[flag]}
        return [*recipe_flags(argv[0], left_out), *argv[1:]]
    return argv


def flag_name(flag: str) -> str:
    """The name of a command-line flag as its dataclass field spells it: `--max-steps=5` -> `max_steps`."""
    return flag.removeprefix("--").partition("=")[0].replace("-", "_")


class CommandParser(argparse.ArgumentParser):
    """The console scripts' argparse: a bad flag or value is one line, `PROG: error: argument --flag: ...`, and exit
    status 2, where argparse would print the usage (several lines) above it. Each flag's value is checked by its
    `type=` (the functions below), so that nothing is loaded, read or written before every flag is known good."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def add_export_flags(self, written: str) -> None:
        """--model, --output_dir and --overwrite_output_dir of a command that writes one of our model folders as
        another: `written`, what --output_dir holds."""
        self.add_argument(
            "--model", required=True, help="One of our model folders (run_translation.py), or its Hub id."
        )
        self.add_argument("--output_dir", required=True, help=f"The {written} folder to write.")
        self.add_argument("--overwrite_output_dir", action="store_true", help="Replace a non-empty --output_dir.")


def positive_int(text: str) -> int:
    """A count of at least 1: a batch size, a number of beams, tokens, threads."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def finite_float(text: str) -> float:
    """A number, not NaN or infinite (float() takes both)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0: a temperature."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value


def probability(text: str) -> float:
    """A finite number above 0 and at most 1: a cumulative probability (top-p)."""
    value = finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} must be above 0 and at most 1")
    return value


def device_name(text: str) -> str:
    """A device torch can name (cpu, cuda, cuda:1, mps, ...); whether this machine has it is checked by the engine
    that runs on it (torch or CTranslate2), before the model is loaded."""
    try:
        parse_device(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def input_file(text: str) -> str:
    """A file to read ('-': standard input)."""
    if text != "-" and not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text}: {'a folder, not a file' if os.path.isdir(text) else 'no such file'}")
    return text


def output_file(text: str) -> str:
    """A file to write, in a folder that exists ('-': standard output); checked before any work, so that a mistyped
    folder does not fail once everything is translated."""
    if text == "-":
        return text
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder; give the name of a file to write")
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text}: there is no folder {folder} to write it in")
    return text


def hub_repo_id(text: str) -> str:
    """A repository id the Hub accepts (`name` or `namespace/name`), checked before the login is asked for."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError as error:
        raise argparse.ArgumentTypeError(one_line(error)) from None
    return text


def check_output_is_not_an_input(parser: argparse.ArgumentParser, output: str, inputs: dict[str, str | None]) -> None:
    """Refuses an --output that is one of the files the command reads (`inputs`: flag name -> path), by any path or
    link: it would be replaced."""
    for flag, path in inputs.items():
        if output != "-" and path not in (None, "-") and os.path.exists(output) and os.path.samefile(output, path):
            parser.error(f"argument --output: {output} is the {flag} file {path}; it would be replaced")


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM (a job scheduler's stop): unwinds like KeyboardInterrupt, so no half-written output stays."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


def raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def reported(prog: str):
    """The work of a command that reads and writes files: standard output in UTF-8 whatever the locale says; Ctrl-C
    or SIGTERM ends it with exit status 128 + the signal and nothing written; an OSError, ValueError or ImportError
    is one line and exit status 1. The signal handlers are this work's only: a caller (a test, a notebook) gets its
    own back afterwards."""
    previous = {stop: signal.signal(stop, raise_interrupted) for stop in (signal.SIGINT, signal.SIGTERM)}
    try:
        if isinstance(sys.stdout, io.TextIOWrapper):
            sys.stdout.reconfigure(encoding="utf-8")
        yield
    except Interrupted as interruption:
        print(f"\n{prog}: interrupted; nothing was written", file=sys.stderr)
        sys.exit(interruption.exit_code)
    except (OSError, ValueError, ImportError) as error:
        sys.exit(f"{prog}: error: {error}")
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
