"""Loading a model folder someone else wrote (a run's output, a download): each way it can be broken ends in one error
that names the file or folder and what is wrong, before memory is spent on it and without running the folder's code.

`AutoModelForSeq2SeqLM.from_pretrained` checks most of it; the few checks it lacks are added here, and what it
raises becomes a `ModelFolderError`. docs/loading.md lists which checks are ours and which are transformers'.
"""

import json
import logging
import math
import os
from decimal import Decimal
from typing import NamedTuple

from huggingface_hub.errors import StrictDataclassError

from hf_vanilla_transformer.errors import first_line, one_line, transformers_lines_left_out
from hf_vanilla_transformer.formats import (
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    MODEL_FILES,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    WEIGHTS_NAME,
)
from hf_vanilla_transformer.hardware import check_torch_device, default_device

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
    refused before it is loaded, naming the folder's config."""
    model_path = model_folder(model_path)
    config_file = os.path.join(model_path, CONFIG_NAME)
    if os.path.isfile(config_file):  # else load_model says what is missing
        model_type = read_json_object(config_file).get("model_type")
        if model_type != "vanilla_transformer":
            raise ModelFolderError(
                f"{config_file}: model_type {model_type!r} is not ours (vanilla_transformer); only our models are "
                "exported (CTranslate2's ct2-transformers-converter and transformers' exporters take others)"
            )
    return load_model_and_tokenizer(model_path, "cpu", dtype="float32")


def max_positions(generation_config, model_path: str | None = None) -> int:
    """The most tokens a source, or a translation with its start token, may hold in the model of a folder of any kind
    (ours or an export, at `model_path`), whose generation config is `generation_config`: its `max_length`,
    which is the model's `max_position_embeddings` (`length_limited_generation_config`) unless the run that trained
    it set a shorter one (`--generation_max_length`), which then bounds generate() too; every export carries that
    config. Where it sets none, the `max_position_embeddings` of the folder's config.json (ours and the Marian and
    ONNX exports' hold it)."""
    if generation_config.max_length:
        return generation_config.max_length
    folder = model_path or ""
    config_file = os.path.join(folder, CONFIG_NAME)
    config = read_json_object(config_file) if model_path and os.path.isfile(config_file) else {}
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int) or positions < 2:
        raise ModelFolderError(
            f"{os.path.join(folder, GENERATION_CONFIG_NAME)}: no max_length, and no config.json with "
            "max_position_embeddings beside it: the model's positions are unknown"
        )
    return positions


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
    except (OSError, ValueError, TypeError, KeyError, OverflowError) as error:  # Overflow: a size no float holds
        raise ModelFolderError(f"{config_file}: {first_line(error)}") from None
    check_config_fits(config, model_path, dtype)
    try:
        # transformers' load report is a line for each missing, unexpected or mis-shaped weight (thousands for a
        # config of thousands of layers): this function says the same in one line, below
        with transformers_lines_left_out("transformers.modeling_utils", "LOAD REPORT"):
            model, report = AutoModelForSeq2SeqLM.from_pretrained(
                model_path,
                config=config,
                trust_remote_code=False,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # reported in one line below, with the shapes
                dtype=dtype,
                attn_implementation=attn_implementation,
            )
    except Exception as error:  # safetensors' SafetensorError derives from Exception alone
        raise ModelFolderError(f"{model_path}: {first_line(error)}") from None
    weights_file = os.path.join(model_path, WEIGHTS_NAME)
    # transformers fills in missing and mis-shaped weights at random and drops extra ones
    for kind, names in (
        ("missing", sorted(report["missing_keys"])),
        ("unexpected", sorted(report["unexpected_keys"])),
        (
            "of another shape than the config gives",
            sorted(f"{name} {tuple(held)}, not {tuple(built)}" for name, held, built in report["mismatched_keys"]),
        ),
    ):
        if names:
            raise ModelFolderError(f"{weights_file}: {len(names)} weights {kind}: {first_few(names)}")
    for name, tensor in model.named_parameters():  # each tied matrix once
        # all values are finite where the least and the greatest are (a NaN is both): no mask the tensor's size
        if tensor.is_floating_point() and not torch.isfinite(torch.stack(torch.aminmax(tensor))).all():
            raise ModelFolderError(f"{weights_file}: {name} holds NaN or infinite values")
    return model.to(device)


def first_few(names: list[str], shown: int = 3) -> str:
    """The first `shown` names, and how many more there are."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown:,} more" if len(names) > shown else "")


def check_config_fits(config, model_path: str, dtype=None) -> None:
    """Refuse a config that describes a model larger than the weights file holds or than this machine's free
    memory can load in `dtype` (`from_pretrained`'s), before anything is allocated. Our models only: for others
    transformers' own checks apply."""
    if config.model_type != "vanilla_transformer":
        return
    config_file = os.path.join(model_path, CONFIG_NAME)
    weights_file = os.path.join(model_path, WEIGHTS_NAME)
    size = model_size(config)
    stored = stored_weights(weights_file)
    if stored is not None and size.weights > stored.count:
        raise ModelFolderError(
            f"{config_file}: describes a model of {size.weights:,} weights, but {weights_file} holds "
            f"{stored.count:,}; they do not belong together"
        )
    needed = memory_to_load(config, dtype, stored)
    available = available_memory()
    if available is not None and needed > available:
        raise ModelFolderError(
            f"{config_file}: the model it describes ({size.weights:,} weights in {size.tensors:,} tensors, "
            f"d_model={config.d_model}, max_position_embeddings={config.max_position_embeddings}) needs about "
            f"{gib(needed)} GiB to load, more than the {gib(available)} GiB free on this machine"
        )


def gib(size: int) -> str:
    """`size` bytes in GiB, to a tenth; a size of any number of digits (Decimal: no float holds some)."""
    return f"{Decimal(size) / 2**30:,.1f}"


class ModelSize(NamedTuple):
    weights: int  # values, each tied matrix once, as model.safetensors holds them
    tensors: int


def model_size(config) -> ModelSize:
    """The size of our model built from `config`, computed from the config alone so that a config of any size is
    judged before anything is built (tests/base/test_loading.py checks it against built models). Learned positions are
    weights; sinusoidal ones are computed, never stored, and not counted."""
    d_model = config.d_model

    def attention(heads: int) -> int:  # W^Q, W^K, W^V, W^O
        d_k, d_v = config.attention_head_dims(heads)
        return 2 * d_model * heads * (d_k + d_v)

    def feed_forward(width: int) -> int:  # W_1, b_1, W_2, b_2
        return 2 * d_model * width + width + d_model

    layer_norm = 2 * d_model
    encoder_layer = attention(config.encoder_attention_heads) + feed_forward(config.encoder_ffn_dim) + 2 * layer_norm
    decoder_layer = (
        2 * attention(config.decoder_attention_heads) + feed_forward(config.decoder_ffn_dim) + 3 * layer_norm
    )
    embeddings = 1 if config.tie_word_embeddings else 3  # shared, or the encoder's, the decoder's and the output's
    weights = (
        embeddings * config.vocab_size * d_model
        + config.encoder_layers * encoder_layer
        + config.decoder_layers * decoder_layer
    )
    tensors = embeddings + 11 * config.encoder_layers + 16 * config.decoder_layers
    if config.position_embedding_type == "learned":
        weights += 2 * config.max_position_embeddings * d_model
        tensors += 2
    if config.layer_norm_position == "pre":  # a LayerNorm after each stack
        weights += 2 * layer_norm
        tensors += 4
    return ModelSize(weights, tensors)


# What loading takes beyond the model's tensors (docs/loading.md, "What the memory estimate counts"): transformers'
# record of each weight tensor as it loads it, which makes a model of many tiny layers cost more than its weights
# say; and, on the weights and tables and in all, what the allocator holds beyond what is asked of it.
BYTES_PER_TENSOR = 16 * 2**10
SLACK_FRACTION = 4  # a quarter more
BASE_BYTES = 16 * 2**20


def memory_to_load(config, dtype, stored: "StoredWeights | None") -> int:
    """Bytes `load_model` takes at its peak to load our model of `config` in `dtype` (`from_pretrained`'s), from a
    weights file `stored`: the weights; the two sinusoidal tables (encoder and decoder) and a third while one is
    recomputed; the whole file mapped while its weights change dtype (in their own dtype the mapped file is the
    weights' memory); transformers' record of each tensor. docs/loading.md says how it compares with what loading
    takes."""
    size = model_size(config)
    built = loaded_dtype(dtype, config, stored)
    tables = (
        3 * config.max_position_embeddings * config.d_model if config.position_embedding_type == "sinusoidal" else 0
    )
    converted = stored is not None and stored.dtypes != {str(built).removeprefix("torch.")}
    model = (size.weights + tables) * built.itemsize + (stored.bytes if converted else 0)
    return model + model // SLACK_FRACTION + BYTES_PER_TENSOR * size.tensors + BASE_BYTES


def loaded_dtype(dtype, config, stored: "StoredWeights | None"):
    """The torch dtype `from_pretrained(dtype=dtype)` builds the model in: `dtype`, or for None and "auto" the
    config's (save_pretrained records it), else the stored weights', else torch's default."""
    import torch

    for value in (dtype, config.dtype, *sorted(stored.dtypes if stored else ())):
        if isinstance(value, str) and value != "auto":
            value = getattr(torch, value, None)
        if isinstance(value, torch.dtype):
            return value
    return torch.get_default_dtype()


def available_memory() -> int | None:
    """The bytes this machine can give a new allocation without swapping: Linux's MemAvailable, elsewhere its
    physical memory (`physical_memory`)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory()


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


# safetensors' names of the floating dtypes, as torch names them
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class StoredWeights(NamedTuple):
    count: int  # values
    dtypes: set[str]  # torch's names (safetensors' for a dtype torch's models do not load as weights)
    bytes: int  # the file's size


def stored_weights(weights_file: str) -> StoredWeights | None:
    """What a safetensors file holds, from its header; None if there is no such file (then transformers' error for
    the missing file applies). A header that cannot be read is an error naming the file."""
    if not os.path.isfile(weights_file):
        return None
    from safetensors import safe_open

    try:
        with safe_open(weights_file, framework="pt") as weights:
            tensors = [weights.get_slice(name) for name in weights.keys()]  # noqa: SIM118 (safe_open is no dict)
            return StoredWeights(
                count=sum(math.prod(tensor.get_shape()) for tensor in tensors),
                dtypes={SAFETENSORS_DTYPES.get(tensor.get_dtype(), tensor.get_dtype()) for tensor in tensors},
                bytes=os.path.getsize(weights_file),
            )
    except Exception as error:  # SafetensorError derives from Exception alone
        raise ModelFolderError(f"{weights_file}: not a readable safetensors file ({first_line(error)})") from None


def load_tokenizer(path: str):
    """The folder's tokenizer; a folder without a usable one is an error naming the file or folder."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise ModelFolderError(f"{path}: no such folder")
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE):
        if os.path.isfile(os.path.join(path, name)):
            read_json_object(os.path.join(path, name))
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as error:  # the tokenizers library raises a bare Exception for a file it cannot use
        why = (
            first_line(error)
            if os.path.isfile(os.path.join(path, TOKENIZER_FILE))
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
