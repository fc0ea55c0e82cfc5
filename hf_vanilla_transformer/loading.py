"""Loading a model folder someone else wrote (a run's output, a download): each way it can be broken ends in one error
that names the file and what is wrong, before memory is spent on it.

`AutoModelForSeq2SeqLM.from_pretrained` alone is not enough for a command that takes a folder from a user. What it
does with a broken folder (transformers 5.24):
- a config.json asking for a huge model (d_model=10**12, 10**9 layers) is built as asked, until memory runs out;
- a truncated model.safetensors raises safetensors' own `SafetensorError`, a tensor of the wrong shape a
  RuntimeError after a table printed to the log, a truncated tokenizer.json a JSONDecodeError that names no file;
- a missing tensor is filled with random values and NaN or Inf weights load silently, with a warning at most;
  the model then translates garbage;
- a config.json of an unknown model type asks on standard input whether to run the folder's code.
So the functions here check what transformers does not, turn what it raises into `ModelFolderError`, and never run
a folder's code (`trust_remote_code=False`: our package registers our model with the auto classes).
"""

import json
import math
import os

from .errors import ParameterError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class ModelFolderError(ParameterError):
    """A model or tokenizer folder that cannot be used; the message names the file and the problem."""


def load_model_and_tokenizer(model_path: str, device: str | None = None, dtype=None):
    """The folder's model (on `device`; default: cuda if available; in `dtype`, default: as saved) and tokenizer."""
    return load_model(model_path, device, dtype=dtype), load_tokenizer(model_path, "model_path")


def load_model(model_path: str, device: str | None = None, parameter: str = "model_path", dtype=None):
    """The folder's sequence-to-sequence model, checked: its config fits its weights and this machine's memory,
    every weight is in model.safetensors with the right shape, and all are finite. `parameter` is the name errors
    give the folder; `dtype` (a torch dtype or its name) is `from_pretrained`'s (default: as saved)."""
    import torch
    import transformers
    from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForSeq2SeqLM

    import hf_vanilla_transformer  # noqa: F401  (registers our model with the auto classes)

    config_file = os.path.join(model_path, CONFIG_NAME)
    if not os.path.isfile(config_file):
        raise ModelFolderError(f"{parameter} {model_path}: not a model folder (no {CONFIG_NAME})", parameter)
    model_type = read_json_object(config_file).get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        unknown = f"model_type {model_type!r}, which transformers does not know" if model_type else "no model_type"
        raise ModelFolderError(f"{config_file}: {unknown}")
    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise ModelFolderError(f"{config_file}: {first_line(error)}") from None
    if type(config) not in AutoModelForSeq2SeqLM._model_mapping:
        raise ModelFolderError(f"{config_file}: model_type {model_type!r} is not a sequence-to-sequence model")
    check_config_fits(config, model_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the load report's table: what it says is raised below in one line
    try:
        model, report = AutoModelForSeq2SeqLM.from_pretrained(
            model_path,
            config=config,
            trust_remote_code=False,
            ignore_mismatched_sizes=True,
            output_loading_info=True,
            dtype=dtype,
        )
    except Exception as error:  # safetensors' SafetensorError derives from Exception alone
        raise ModelFolderError(f"{os.path.join(model_path, WEIGHTS_NAME)}: {first_line(error)}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    weights_file = os.path.join(model_path, WEIGHTS_NAME)
    if report["mismatched_keys"]:
        name, found, expected = min(report["mismatched_keys"])
        raise ModelFolderError(
            f"{weights_file}: {name} has shape {list(found)}, but {CONFIG_NAME} makes it {list(expected)}"
        )
    if report["missing_keys"]:
        missing = sorted(report["missing_keys"])
        raise ModelFolderError(f"{weights_file}: {len(missing)} weights missing, the first {missing[0]}")
    for name, tensor in model.named_parameters():  # each tied matrix once
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ModelFolderError(f"{weights_file}: {name} holds NaN or infinite values")
    return model.to(device)


def check_config_fits(config, model_path: str) -> None:
    """Refuse a config that describes a model larger than the weights file holds or than this machine's memory,
    before anything is allocated. Our models only: for others transformers' own checks apply."""
    if config.model_type != "vanilla_transformer":
        return
    config_file = os.path.join(model_path, CONFIG_NAME)
    weights_file = os.path.join(model_path, WEIGHTS_NAME)
    # at least the shared embedding and every feed-forward network: far fewer than the model has, never more
    needed = config.vocab_size * config.d_model + 2 * config.d_model * (
        config.encoder_layers * config.encoder_ffn_dim + config.decoder_layers * config.decoder_ffn_dim
    )
    held = stored_weight_count(weights_file)
    if held is not None and needed > held:
        raise ModelFolderError(
            f"{config_file}: describes a model of at least {needed:,} weights, but {weights_file} holds {held:,}; "
            "they do not belong together"
        )
    # the sinusoidal encoding is computed, not stored: only memory bounds it
    needed_bytes = 4 * (needed + config.max_position_embeddings * config.d_model)
    available = physical_memory()
    if available is not None and needed_bytes > available:
        raise ModelFolderError(
            f"{config_file}: the model it describes (d_model={config.d_model}, "
            f"max_position_embeddings={config.max_position_embeddings}, ...) needs at least "
            f"{needed_bytes / 2**30:,.1f} GiB, more than this machine's {available / 2**30:,.1f} GiB"
        )


def physical_memory() -> int | None:
    """The machine's memory in bytes, where the system says (POSIX); None elsewhere."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def stored_weight_count(weights_file: str) -> int | None:
    """The number of values in a safetensors file, from its header; None if there is no such file (then
    transformers' error for the missing file applies). A header that cannot be read is an error naming the file."""
    if not os.path.isfile(weights_file):
        return None
    from safetensors import safe_open

    try:
        with safe_open(weights_file, framework="pt") as weights:
            return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118 (safe_open is no dict)
    except Exception as error:  # SafetensorError derives from Exception alone
        raise ModelFolderError(f"{weights_file}: not a readable safetensors file ({first_line(error)})") from None


def load_tokenizer(path: str, parameter: str = "tokenizer_name"):
    """The folder's tokenizer; a folder without a usable one is an error naming the file. `parameter` is the name
    errors give the folder."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise ModelFolderError(f"{parameter} {path}: no such folder", parameter)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.isfile(os.path.join(path, name)):
            read_json_object(os.path.join(path, name))
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as error:  # the tokenizers library raises a bare Exception for a file it cannot use
        why = (
            first_line(error)
            if os.path.isfile(os.path.join(path, "tokenizer.json"))
            else "no tokenizer.json, and transformers could build none from the other files"
        )
        raise ModelFolderError(f"{parameter} {path}: no usable tokenizer ({why})", parameter) from None


def read_json_object(file: str) -> dict:
    """The JSON object a file holds; anything else is an error naming the file."""
    try:
        with open(file, encoding="utf-8") as text:
            value = json.load(text)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ModelFolderError(f"{file}: not a valid JSON file ({first_line(error)})") from None
    if not isinstance(value, dict):
        raise ModelFolderError(f"{file}: holds a JSON {type(value).__name__}, not an object")
    return value


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
