"""Loading a model folder someone else wrote (a run's output, a download): each way it can be broken ends in one error
that names the file or folder and what is wrong, before memory is spent on it and without running the folder's code.

`AutoModelForSeq2SeqLM.from_pretrained` checks most of it; the few checks it lacks are added here, and what it
raises becomes a `ModelFolderError`. docs/loading.md lists which checks are ours and which are transformers'.
"""

import json
import logging
import math
import os

from huggingface_hub.errors import StrictDataclassError

from hf_vanilla_transformer.errors import first_line, one_line
from hf_vanilla_transformer.hardware import check_torch_device, default_device

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
RUN_RECORD = "run_record.json"  # what the run that trained the model did (training/run.py), which its card shows

logger = logging.getLogger(__name__)


class ModelFolderError(ValueError):
    """A model or tokenizer folder that cannot be used; the message names the file and the problem."""


def load_model_and_tokenizer(model_path: str, device: str | None = None, dtype=None, attn_implementation=None):
    """The model (on `device`; default: cuda if available; in `dtype`, default: as saved; on the attention path
    `attn_implementation`, default: transformers') and tokenizer of a folder or of a Hub id (`model_folder`)."""
    model_path = model_folder(model_path)
    return load_model(model_path, device, dtype, attn_implementation), load_tokenizer(model_path)


def load_ours(model_path: str):
    """The model (float32, on the CPU) and tokenizer of one of our folders, for an export; another model type is
    refused, naming the folder's config."""
    model, tokenizer = load_model_and_tokenizer(model_path, "cpu", dtype="float32")
    if model.config.model_type != "vanilla_transformer":
        raise ModelFolderError(
            f"{os.path.join(model_path, CONFIG_NAME)}: model_type {model.config.model_type!r} is not ours "
            "(vanilla_transformer); only our models are exported (CTranslate2's ct2-transformers-converter and "
            "transformers' exporters take others)"
        )
    return model, tokenizer


# What the model folders we load hold (ours, and our CTranslate2 and ONNX exports): a Hub download takes these files
# and nothing else. No code (no folder's code is ever run here), no pickles, no checkpoints or training state.
MODEL_FILES = [
    CONFIG_NAME,
    "generation_config.json",
    WEIGHTS_NAME,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.bin",  # CTranslate2
    "shared_vocabulary.*",
    "onnx/*.onnx",  # ONNX
    "onnx/*.onnx_data",
]


def model_folder(model: str) -> str:
    """`model` if it names a local path, else the folder of the Hub model of that id, downloaded (its MODEL_FILES
    only) or found in the cache (`snapshot_download`, which works offline from the cache).

    A local path is a folder that exists, anything no Hub id looks like ("/data/model", "./model"), or an id-like
    name whose first part exists here: `runs/multi30k-smal`, mistyped where `runs/` is, is a missing folder, not a
    repository `multi30k-smal` of a Hub user `runs` to be downloaded and run. The loaders then say what is missing."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        return model
    if os.path.exists(model.split("/")[0]):
        return model
    logger.warning("%s: no such folder here; loading the model of that id from the Hugging Face Hub", model)
    try:
        return snapshot_download(model, allow_patterns=MODEL_FILES)
    except (OSError, ValueError) as error:  # huggingface_hub's errors for a bad id, a missing repo, no network
        raise ModelFolderError(f"{model}: not a model folder, nor a model on the Hub ({first_line(error)})") from None


def load_model(model_path: str, device: str | None = None, dtype=None, attn_implementation: str | None = None):
    """The folder's sequence-to-sequence model, checked: its config fits its weights and this machine's memory,
    model.safetensors holds exactly the model's weights, and all are finite. `dtype` (a torch dtype or its name)
    and `attn_implementation` are `from_pretrained`'s (default: as saved; transformers' choice). What is checked
    here and what is left to transformers: docs/loading.md."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    device = default_device(device)
    check_torch_device(device)  # before the folder is read
    config_file = os.path.join(model_path, CONFIG_NAME)
    if not os.path.isfile(config_file):
        raise ModelFolderError(f"{model_path}: not a model folder (no {CONFIG_NAME})")
    read_json_object(config_file)
    try:  # trust_remote_code=False: a model type transformers does not know is refused, not prompted for
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=False)
    except StrictDataclassError as error:  # a field of the wrong type or value: its message takes two lines
        raise ModelFolderError(f"{config_file}: {one_line(error)}") from None
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise ModelFolderError(f"{config_file}: {first_line(error)}") from None
    check_config_fits(config, model_path)
    try:
        model, report = AutoModelForSeq2SeqLM.from_pretrained(
            model_path,
            config=config,
            trust_remote_code=False,
            output_loading_info=True,
            dtype=dtype,
            attn_implementation=attn_implementation,
        )
    except Exception as error:  # safetensors' SafetensorError derives from Exception alone
        raise ModelFolderError(f"{model_path}: {first_line(error)}") from None
    weights_file = os.path.join(model_path, WEIGHTS_NAME)
    for kind in ("missing", "unexpected"):  # transformers fills in missing weights at random and drops extra ones
        if report[f"{kind}_keys"]:
            names = sorted(report[f"{kind}_keys"])
            raise ModelFolderError(f"{weights_file}: {len(names)} weights {kind}, the first {names[0]}")
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


def device_memory(device) -> int | None:
    """The memory of `device` (a torch.device) in bytes: a GPU's own, else the machine's (`physical_memory`)."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).total_memory
    return physical_memory()


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


def load_tokenizer(path: str):
    """The folder's tokenizer; a folder without a usable one is an error naming the file or folder."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise ModelFolderError(f"{path}: no such folder")
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
        raise ModelFolderError(f"{path}: no usable tokenizer ({why})") from None


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
