"""Configuration of the encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Attribute names follow Marian and BART, so code written for those models reads ours unchanged. The defaults are
the paper's base model (Table 3, row "base") except for the vocabulary, which a tokenizer built by `train_bpe.py`
sets; `VanillaTransformerConfig.from_preset` gives the paper's "base" and "big" models and a "small" one that
trains on Multi30k on a laptop CPU.
"""

import copy
import math
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

# The oldest releases the model is tested with (.ci/run runs the quick tests at the transformers floor). This file
# travels with every saved folder and runs first when a folder is loaded as remote code, so the check comes before
# anything that an older release lacks: there, loading fails with one line naming both versions. A saved config also
# records them (`required_versions`), and loading it where they are not met fails the same way.
REQUIRED_VERSIONS = {"transformers": "5.16.0", "torch": "2.6.0"}


def release(text: str) -> tuple[int, ...]:
    """'5.16.0' -> (5, 16, 0); a local or pre-release suffix ('2.13.0+cpu', '2.7.0a0') is left out."""
    match = re.match(r"\d+(?:\.\d+)*", text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a version number")
    return tuple(int(part) for part in match.group().split("."))


def check_versions(required: dict, what: str = "hf-vanilla-transformer", error: type[Exception] = ImportError) -> None:
    """Raise `error`, in one line, where an installed package is older than `required` ({package: version}) says."""
    if not isinstance(required, dict):
        raise ValueError(f"{what}: required_versions={required!r} is not a mapping of packages to versions")
    for package, oldest in required.items():
        try:
            installed = version(package)
        except (ValueError, PackageNotFoundError):
            raise error(f"{what} needs {package} >= {oldest}, which is not installed") from None
        if release(installed) < release(oldest):
            raise error(
                f"{what} needs {package} >= {oldest}; this Python has {package} {installed} "
                f"(pip install -U '{package}>={oldest}')"
            )


check_versions(REQUIRED_VERSIONS)

from huggingface_hub.dataclasses import strict  # noqa: E402 (after the version check, which an old release needs)
from transformers import PretrainedConfig  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402

# The config names our pipeline (`custom_pipelines`, its default below), and a saved folder must carry the file it
# names. transformers ships the files a class needs by its relative imports (`custom_object_save`): this import is
# that dependency, the way transformers knows it, not an import for a side effect of running the module.
from .pipeline_translation import CUSTOM_PIPELINES  # noqa: E402

# the attributes filled in from others when not given, and what they are derived from (`derived`)
DERIVED = {"head_dim": ("d_model", "encoder_attention_heads", "decoder_attention_heads"), "init_std": ("d_model",)}

PositionEmbeddingType = Literal["sinusoidal", "learned"]
LayerNormPosition = Literal["post", "pre"]

# Section 6.1 and Table 3. "small" is ours: half of base's width and half its depth, sized so that one
# epoch of Multi30k (29k pairs) takes minutes on 2 CPU cores; vocab_size matches the 8k joint BPE that
# train_bpe.py builds for it.
PRESETS = {
    "small": dict(
        vocab_size=8000,
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        dropout=0.1,
    ),
    "base": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        dropout=0.1,
    ),
    "big": dict(
        d_model=1024,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        dropout=0.3,
    ),
}


@strict
class VanillaTransformerConfig(PretrainedConfig):
    r"""
    Configuration of [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`].

    Args:
        vocab_size (`int`, defaults to 37000):
            Size of the one vocabulary shared by source and target (Section 5.1: about 37,000 BPE tokens for
            English-German).
        d_model (`int`, defaults to 512):
            Width of every sub-layer output and of the embeddings (Section 3.1).
        encoder_layers / decoder_layers (`int`, defaults to 6):
            N, the number of identical layers in each stack (Section 3.1).
        encoder_attention_heads / decoder_attention_heads (`int`, defaults to 8):
            h, the number of attention heads (Section 3.2.2).
        encoder_ffn_dim / decoder_ffn_dim (`int`, defaults to 2048):
            d_ff, the inner size of the position-wise feed-forward networks (Section 3.3).
        head_dim (`int`, *optional*):
            d_k, the per-head size of queries and keys in both stacks. Defaults to `d_model // heads` (Section
            3.2.2), filled in at construction as transformers' own configs do; Table 3 row (B) varies it. When the
            two stacks' head counts give different `d_model // heads` and `head_dim` is not given, there is no one
            d_k: `head_dim` stays `None` and each stack uses its own `d_model // heads`.
        v_head_dim (`int`, *optional*):
            d_v, the per-head size of values. Defaults to `head_dim` when that is set, else `d_model // heads`.
        activation_function (`str`, defaults to `"relu"`):
            Non-linearity of the feed-forward network (Equation 2 uses ReLU); any key of `transformers.ACT2FN`.
        dropout (`float`, defaults to 0.1):
            P_drop, the residual dropout on every sub-layer output and on the sums of embeddings and positional
            encodings (Section 5.4).
        attention_dropout (`float`, defaults to 0.0):
            Dropout on the attention probabilities. Not in the paper; an option for variants.
        activation_dropout (`float`, defaults to 0.0):
            Dropout inside the feed-forward network after the activation. Not in the paper; an option for variants.
        max_position_embeddings (`int`, defaults to 1024):
            The longest source or target sequence the model accepts (sinusoids are precomputed up to it).
        position_embedding_type (`str`, defaults to `"sinusoidal"`):
            `"sinusoidal"` (Section 3.5) or `"learned"` (Table 3 row (E)).
        layer_norm_position (`str`, defaults to `"post"`):
            `"post"`: LayerNorm(x + Dropout(Sublayer(x))) as in Section 3.1. `"pre"`:
            x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm after each stack, the later variant studied
            by Xiong et al. (2020).
        layer_norm_eps (`float`, defaults to 1e-5):
            Epsilon of every LayerNorm (the paper does not give one; PyTorch's default).
        scale_embedding (`bool`, defaults to `True`):
            Multiply the token embeddings by sqrt(d_model) (Section 3.4).
        tie_word_embeddings (`bool`, defaults to `True`):
            Share one weight matrix between the encoder embedding, the decoder embedding and the pre-softmax
            projection (Section 3.4). When `False` all three are separate.
        init_std (`float`, *optional*):
            Standard deviation of the normal initialisation of the token embeddings. Defaults to d_model ** -0.5,
            which with the sqrt(d_model) scale gives embeddings of unit variance (the paper gives no initialisation;
            this and Xavier-uniform projections are those of its reference code, tensor2tensor).
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id (`int`):
            Special token ids; the defaults (1, 0, 2, 0) are the fairseq/BART layout that `train_bpe.py` assigns:
            `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3. The decoder starts from `<s>`. (Padding is not 0 because
            transformers' beam search fills finished rows with `pad_token_id or eos_token_id`.)
        custom_pipelines (`dict`, *optional*):
            Defaults to our `TranslationPipeline` for the `translation` task, so that `pipeline()` finds it in any
            saved folder (transformers 5 has no translation pipeline of its own).
        required_versions (`dict`, *optional*):
            The oldest transformers and torch the model's code runs on (`REQUIRED_VERSIONS`), recorded in every
            saved config. A loaded config whose record the installed packages do not meet is refused.

    `head_dim` and `init_std`, when not given, are filled from `d_model` and the head counts at construction, and
    follow them when those change later (`config.d_model = 512` on a loaded config gives d_k = 512 / h, not the
    loaded d_k); a value that differs from what they would give was chosen, and stays.
    """

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    head_dim: int | None = None
    v_head_dim: int | None = None
    activation_function: str = "relu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    max_position_embeddings: int = 1024
    position_embedding_type: PositionEmbeddingType = "sinusoidal"
    layer_norm_position: LayerNormPosition = "post"
    layer_norm_eps: float = 1e-5
    scale_embedding: bool = True
    init_std: float | None = None
    use_cache: bool = True
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | None = 2
    decoder_start_token_id: int | None = 0
    custom_pipelines: dict | None = None
    required_versions: dict | None = None

    def __post_init__(self, **kwargs):
        if self.required_versions is not None:  # a saved config: the versions the code that wrote it needed
            check_versions(self.required_versions, "this model (required_versions in its config)", ValueError)
        self.required_versions = dict(REQUIRED_VERSIONS)
        super().__post_init__(**kwargs)
        # Checked here so that a bad value raises a plain ValueError at construction; `validate()` (run again by
        # `save_pretrained`) calls the same check for values changed later.
        self.validate_hyperparameters()
        for name in DERIVED:
            if getattr(self, name) is None:
                setattr(self, name, self.derived(name))
        if self.custom_pipelines is None:
            self.custom_pipelines = copy.deepcopy(CUSTOM_PIPELINES)

    def derived(self, name: str) -> int | float | None:
        """What `name` (a key of `DERIVED`) is when not given: d_k = d_model / h (Section 3.2.2) when both stacks'
        head counts give the same whole number (else None), and init_std = d_model^-0.5."""
        if name == "init_std":
            return self.d_model**-0.5
        d_ks = {self.d_model / self.encoder_attention_heads, self.d_model / self.decoder_attention_heads}
        d_k = d_ks.pop()
        return int(d_k) if not d_ks and d_k.is_integer() else None

    def __setattr__(self, name, value):
        # a filled-in head_dim or init_std follows the attributes it was derived from (see the class docstring)
        name = self.attribute_map.get(name, name)
        following = [
            derived
            for derived, sources in DERIVED.items()
            if name in sources and derived in self.__dict__ and getattr(self, derived) == self.derived(derived)
        ]
        super().__setattr__(name, value)
        for derived in following:
            super().__setattr__(derived, self.derived(derived))

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VanillaTransformerConfig":
        """The paper's "base" or "big" model (Table 3), or our "small" one, with any attribute overridden."""
        if name not in PRESETS:
            raise ValueError(f"preset: unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def attention_head_dims(self, num_heads: int) -> tuple[int, int]:
        """(d_k, d_v) for a stack with `num_heads` heads."""
        head_dim = self.head_dim or self.d_model // num_heads
        return head_dim, self.v_head_dim or head_dim

    def _require(self, condition: bool, name: str, problem: str) -> None:
        if not condition:
            raise ValueError(f"VanillaTransformerConfig.{name}={getattr(self, name)!r} is invalid: it {problem}")

    def validate_hyperparameters(self):
        """Raise a ValueError naming the first attribute whose value the model cannot be built with."""
        for name in (
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        ):
            self._require(getattr(self, name) > 0, name, "must be a positive integer")
        for name in ("head_dim", "v_head_dim"):
            value = getattr(self, name)
            self._require(value is None or value > 0, name, "must be a positive integer or None")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            self._require(
                self.head_dim is not None or self.d_model % getattr(self, name) == 0,
                name,
                f"must divide d_model={self.d_model} when head_dim is not set",
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            self._require(0 <= getattr(self, name) < 1, name, "must be in [0, 1)")
        self._require(
            self.init_std is None or 0 < self.init_std < math.inf, "init_std", "must be positive and finite, or None"
        )
        self._require(0 < self.layer_norm_eps < math.inf, "layer_norm_eps", "must be positive and finite")
        # position_embedding_type and layer_norm_position are Literal fields: @strict checks them on assignment
        choices = ", ".join(map(repr, sorted(ACT2FN)))
        self._require(self.activation_function in ACT2FN, "activation_function", f"must be one of {choices}")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            self._require(
                value is None or 0 <= value < self.vocab_size,
                name,
                f"must be a token id in the vocabulary [0, {self.vocab_size})",
            )
