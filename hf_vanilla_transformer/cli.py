"""What the command lines (`run_translation.py`, `train_bpe.py`) share: recipe files, `--config_overrides`, and
errors told in terms of their flags.

The library raises errors that name its Python parameters (`ParameterError`: `vocab_size`, `output_dir`, ...); a
command line shows the same error with its flags (`--vocab_size`, `--output_dir`): `command_line_error`.
"""

import json
import re
from collections.abc import Collection, Mapping

import yaml

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .errors import ParameterError

RECIPE_EXTENSIONS = (".yaml", ".yml", ".json")


def recipe_flags(recipe_file: str) -> list[str]:
    """The command-line flags a recipe file (.yaml/.json mapping flag names to values) stands for."""
    try:
        with open(recipe_file, encoding="utf-8") as file:
            recipe = json.load(file) if recipe_file.endswith(".json") else yaml.safe_load(file)
    except OSError as error:
        raise ValueError(f"{recipe_file}: cannot read the recipe ({error.strerror})") from None
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"{recipe_file}: not a valid recipe ({error})") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"{recipe_file}: a recipe is a mapping of flag names to values")
    flags = []
    for name, value in recipe.items():
        values = value if isinstance(value, list) else [value]
        flags += [f"--{name}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
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
            raise ParameterError(
                f"config_overrides: {item!r} is not NAME=VALUE with a config attribute NAME", "config_overrides"
            )
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


def command_line_error(error: Exception, flags: Mapping[str, str] | Collection[str]) -> str:
    """The error's message, with each parameter a `ParameterError` names written as its flag: `flags` maps parameter
    names to flag names, or lists the parameters whose flags have the same name."""
    flags = flags if isinstance(flags, Mapping) else {name: name for name in flags}
    message = str(error)
    for parameter in getattr(error, "parameters", ()):
        if parameter in flags:
            message = re.sub(rf"(?<![\w-]){re.escape(parameter)}(?!\w)", f"--{flags[parameter]}", message)
    return message
