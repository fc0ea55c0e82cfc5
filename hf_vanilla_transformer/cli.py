"""What the command lines (`run_translation.py`, `train_bpe.py`) share: a flag parser whose errors are one line,
recipe files (expanded to flags, which the parser then checks) and `--config_overrides`."""

import json
import re

import yaml
from transformers import HfArgumentParser

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .loading import one_line

RECIPE_EXTENSIONS = (".yaml", ".yml", ".json")
FLAG_NAME = re.compile(r"[A-Za-z][\w-]*")


class FlagParser(HfArgumentParser):
    """`HfArgumentParser` whose errors (a mistyped flag, a bad value) are a ValueError of one line: argparse would
    print the whole usage (hundreds of lines for the Trainer's flags) above the error."""

    def error(self, message: str):
        raise ValueError(f"{message} (see --help)")


def recipe_flags(recipe_file: str) -> list[str]:
    """The command-line flags a recipe file (.yaml/.json mapping flag names to values) stands for: `name: value`
    becomes `--name value`, a list one flag with several values, true/false `true`/`false`. A null value leaves
    the flag at its default. The command's parser then checks the flags as it checks those typed."""
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
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        for one in values:
            if one is None or isinstance(one, (dict, list)):
                raise ValueError(f"{recipe_file}: {name}: {one!r} is not a value (a number, a string or true/false)")
        flags += [f"--{name}", *(str(one).lower() if isinstance(one, bool) else str(one) for one in values)]
    return flags


def expand_recipe(argv: list[str]) -> list[str]:
    """`argv` with a leading recipe file replaced by its flags; flags after the recipe override it."""
    if argv and argv[0].endswith(RECIPE_EXTENSIONS):
        return [*recipe_flags(argv[0]), *argv[1:]]
    return argv


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
