"""What the command lines (`run_translation.py`, `train_bpe.py`) share: recipe files and `--config_overrides`."""

import json
from argparse import Action, ArgumentParser, ArgumentTypeError

import yaml
from transformers import HfArgumentParser

from .configuration_vanilla_transformer import VanillaTransformerConfig

RECIPE_EXTENSIONS = (".yaml", ".yml", ".json")


def recipe_flags(recipe_file: str, parser: ArgumentParser) -> list[str]:
    """The command-line flags a recipe file (.yaml/.json mapping flag names to values) stands for, each checked
    against `parser` so that an error names the recipe and the key. A null value leaves the flag at its default."""
    try:
        with open(recipe_file, encoding="utf-8") as file:
            recipe = json.load(file) if recipe_file.endswith(".json") else yaml.safe_load(file)
    except OSError as error:
        raise ValueError(f"{recipe_file}: cannot read the recipe ({error.strerror})") from None
    except (ValueError, RecursionError, yaml.YAMLError) as error:  # JSON and UTF-8 errors are ValueErrors
        reason = " ".join(str(error).split())  # YAML's messages run over several lines
        raise ValueError(f"{recipe_file}: not a valid recipe ({reason})") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"{recipe_file}: a recipe is a mapping of flag names to values")
    flags = []
    for name, value in recipe.items():
        action = parser._option_string_actions.get(f"--{name}") if isinstance(name, str) else None
        if action is None or not action.option_strings:
            raise ValueError(f"{recipe_file}: {name!r} is not a flag of this command")
        if value is None:
            continue
        values = [str(v).lower() if isinstance(v, bool) else v for v in (value if isinstance(value, list) else [value])]
        check_recipe_values(action, values, f"{recipe_file}: {name}")
        flags += [f"--{name}", *map(str, values)]
    return flags


def check_recipe_values(action: Action, values: list, where: str) -> None:
    """Values a recipe gives one flag, checked as argparse would check them on the command line."""
    if len(values) != 1 and action.nargs not in ("+", "*"):
        raise ValueError(f"{where}: takes one value, not a list of {len(values)}")
    for value in values:
        if isinstance(value, (dict, list)) or value is None:
            raise ValueError(f"{where}: {value!r} is not a value (a number, a string or true/false)")
        try:
            converted = action.type(str(value)) if action.type else str(value)
        except (ValueError, TypeError, ArgumentTypeError):
            expected = getattr(action.type, "__name__", "value")
            expected = {"int": "integer", "float": "number", "string_to_bool": "true/false"}.get(expected, expected)
            raise ValueError(f"{where}: {value!r} is not a valid {expected}") from None
        if action.choices is not None and converted not in action.choices:
            raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}")


def expand_recipe(argv: list[str], parser: ArgumentParser) -> list[str]:
    """`argv` with a leading recipe file replaced by its flags; flags after the recipe override it."""
    if argv and argv[0].endswith(RECIPE_EXTENSIONS):
        return [*recipe_flags(argv[0], parser), *argv[1:]]
    return argv


def parse_flags(parser: HfArgumentParser, argv: list[str]) -> tuple:
    """`parser.parse_args_into_dataclasses(argv)`, with a bad flag a ValueError of one line: argparse would print
    the whole usage (hundreds of lines for the Trainer's flags) above the error."""

    def one_line_error(message: str):
        raise ValueError(f"{message} (see --help)")

    parser.error = one_line_error
    return parser.parse_args_into_dataclasses(argv)


def parse_config_overrides(config_overrides: str | None) -> dict:
    """'d_model=256,dropout=0.2,position_embedding_type=learned' -> {"d_model": 256, "dropout": 0.2, ...}.

    Values are read as YAML scalars (numbers, true/false, null, strings; 1e-2 is a number too, which YAML 1.1
    would read as a string). transformers' own
    `PretrainedConfig.update_from_string` cannot set attributes whose default is None (`head_dim`) and sets them
    after the config is built, past its validation; these overrides go to the constructor instead.
    """
    overrides = {}
    for item in filter(None, (config_overrides or "").split(",")):
        name, separator, value = item.partition("=")
        if not separator or not hasattr(VanillaTransformerConfig(), name.strip()):
            raise ValueError(f"config_overrides: {item!r} is not NAME=VALUE with a config attribute NAME")
        overrides[name.strip()] = scalar(value)
    return overrides


def scalar(text: str):
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)  # exponent forms that YAML 1.1 leaves as strings: 1e-2, 5E3
        except ValueError:
            return value
    return value
