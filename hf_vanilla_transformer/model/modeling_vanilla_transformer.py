"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

The file follows the paper: embeddings and positional encoding (Sections 3.4, 3.5), scaled dot-product and
multi-head attention (3.2), the position-wise feed-forward network (3.3), the residual connection around every
sub-layer (3.1, 5.4), encoder and decoder layers and stacks (3.1), the model, and the generation head with its
tied pre-softmax projection (3.4) and the paper's decoding (6.1).

Where the paper is silent we follow its reference code, tensor2tensor: Xavier-uniform projections, N(0, d_model^-0.5)
embeddings, and no biases in the attention projections (Equation 1's W^Q, W^K, W^V, W^O are plain matrices).
"""

import dataclasses
import functools
import math
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.loss.loss_utils import fixed_cross_entropy
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig

# Section 6.1: "We set the maximum output length during inference to input length + 50". The generation config
# holds it under this name, so that it is saved with the model and can be changed or switched off (None); read it
# with `max_new_tokens_over_source_of`.
PAPER_MAX_NEW_TOKENS_OVER_SOURCE = 50

# transformers 5.24 renamed the decoder's cache from `past_key_values` to `cache` (in model arguments, model outputs
# and the masking functions) and takes the old name until 5.40; earlier releases know only `past_key_values`. The
# model follows the release it runs on: its outputs hold the cache under that release's name, and its forward takes
# both names, warning about the old one only where transformers has deprecated it.
CACHE_NAME = (
    "cache" if "cache" in {field.name for field in dataclasses.fields(Seq2SeqModelOutput)} else "past_key_values"
)


def accepts_both_cache_names(forward: Callable) -> Callable:
    """`forward(cache=...)` also called as `forward(past_key_values=...)`, the name transformers before 5.24 passes."""
    if CACHE_NAME == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)

    @functools.wraps(forward)
    def forward_taking_the_old_name(*args, past_key_values: Cache | None = None, **kwargs):
        if past_key_values is not None:
            kwargs["cache"] = past_key_values
        return forward(*args, **kwargs)

    return forward_taking_the_old_name


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: the decoder reads the target shifted one position right, starting from `<s>`."""
    decoder_input_ids = labels.new_full(labels.shape, decoder_start_token_id)
    decoder_input_ids[:, 1:] = labels[:, :-1]
    return decoder_input_ids.masked_fill_(decoder_input_ids == -100, pad_token_id)


# --- Embeddings and positional encoding (Sections 3.4, 3.5) -------------------------------------------------------


class VanillaTransformerSinusoidalPositionalEncoding(nn.Module):
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Sines on the even features and cosines on the odd ones, interleaved as in the paper (Marian, BART and FSMT put
    all sines first). A fixed function of the position, so it is kept as a non-persistent buffer: never saved, and
    recomputed by `_init_weights` when a model is loaded. It is built in the model's dtype (the default dtype while
    the model is built, as the weights are), so that `from_pretrained(..., dtype=torch.bfloat16)` gives a model whose
    activations stay in that dtype.
    """

    def __init__(self, num_positions: int, d_model: int):
        super().__init__()
        self.register_buffer("encoding", self.compute_encoding(num_positions, d_model), persistent=False)

    @staticmethod
    def compute_encoding(num_positions: int, d_model: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The table in `dtype` (default: the default dtype), each value the float64 one rounded to it.

        The angles need float64: in float32, pos x 10000^(-2i/d_model) is off by up to pos x 2^-24 radians, a
        visible error in the sines of far positions. They are computed a block of positions at a time, so that
        building the table takes little memory beyond the table itself (a whole float64 table and its angles
        would take several times as much).
        """
        encoding = torch.empty(num_positions, d_model, dtype=dtype or torch.get_default_dtype())
        inverse_wavelength = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        block = max(1, 2**20 // d_model)  # positions at a time: a few MiB of float64
        for start in range(0, num_positions, block):
            position = torch.arange(start, min(start + block, num_positions), dtype=torch.float64).unsqueeze(1)
            angles = position * inverse_wavelength
            encoding[start : start + block, 0::2] = torch.sin(angles)
            encoding[start : start + block, 1::2] = torch.cos(angles[:, : d_model // 2])
        return encoding

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.encoding[position_ids]


class VanillaTransformerEmbeddings(nn.Module):
    """Sections 3.4, 3.5 and 5.4: token embedding x sqrt(d_model) + positional encoding, then dropout.

    The token table is the one shared by encoder, decoder and pre-softmax projection when `tie_word_embeddings`;
    positions are sinusoidal or, as in Table 3 row (E), a learned `nn.Embedding`.
    """

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        if config.position_embedding_type == "sinusoidal":
            self.embed_positions = VanillaTransformerSinusoidalPositionalEncoding(
                config.max_position_embeddings, config.d_model
            )
        else:
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.d_model)
        self.max_positions = config.max_position_embeddings
        self.dropout = VanillaTransformerDropout(config.dropout)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_length: int = 0,
    ) -> torch.Tensor:
        """`inputs_embeds`, when given, replace the token lookup and are scaled like it."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        length = inputs_embeds.shape[1]
        # A static cache counts its length in a tensor, which torch.compile cannot branch on: compiled runs skip
        # the check (generate() never passes the table's end: its length limits are clamped to it).
        if not is_torchdynamo_compiling() and past_length + length > self.max_positions:
            raise ValueError(
                f"Sequence of {int(past_length) + length} positions is longer than max_position_embeddings="
                f"{self.max_positions}; truncate the input (tokenizer(..., truncation=True, max_length=...)) or "
                "build a config with more."
            )
        position_ids = torch.arange(length, device=inputs_embeds.device) + past_length
        return self.dropout(inputs_embeds * self.embed_scale + self.embed_positions(position_ids))


# --- Attention (Section 3.2) ----------------------------------------------------------------------------------------


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Section 3.2.1, Equation 1: Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V.

    `attention_mask` is additive (0 where allowed, the dtype's minimum where not): padding, and in the decoder the
    illegal connections to later positions (Section 3.2.3).
    """
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


class VanillaTransformerAttention(nn.Module):
    """Section 3.2.2: MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(QW_i^Q, KW_i^K, VW_i^V).

    The h heads' W_i^Q are stored side by side in `q_proj`, and W_i^K, W_i^V in one `kv_proj` so keys and values
    take one matrix product. Section 3.2.3 uses it three ways: encoder self-attention, masked decoder
    self-attention (`is_causal`), and encoder-decoder attention (`is_cross_attention`: queries from the decoder,
    keys and values from the encoder output, computed once per source and then read from the cache).
    The scaled dot product runs through transformers' attention interface (`config._attn_implementation`).
    """

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        is_causal: bool = False,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim, self.v_head_dim = config.attention_head_dims(num_heads)
        self.scaling = self.head_dim**-0.5
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx
        self.attention_dropout = config.attention_dropout
        self.q_proj = nn.Linear(config.d_model, num_heads * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(config.d_model, num_heads * (self.head_dim + self.v_head_dim), bias=False)
        self.out_proj = nn.Linear(num_heads * self.v_head_dim, config.d_model, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, query_length = hidden_states.shape[:2]
        query = self.q_proj(hidden_states).view(batch_size, query_length, self.num_heads, self.head_dim).transpose(1, 2)
        key, value = self._keys_and_values(key_value_states if self.is_cross_attention else hidden_states, cache)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = self.out_proj(output.reshape(batch_size, query_length, -1))
        return output, weights

    def _keys_and_values(self, states: torch.Tensor, cache: Cache | None) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of shape (batch, heads, length, d_k or d_v): from the cache, freshly projected, or both."""
        if isinstance(cache, EncoderDecoderCache):
            if self.is_cross_attention and cache.is_updated.get(self.layer_idx):
                cached = cache.cross_attention_cache.layers[self.layer_idx]
                return cached.keys, cached.values
            layer_cache = cache.cross_attention_cache if self.is_cross_attention else cache.self_attention_cache
        else:
            layer_cache = cache
        batch_size, length = states.shape[:2]
        key, value = self.kv_proj(states).split([self.num_heads * self.head_dim, self.num_heads * self.v_head_dim], -1)
        key = key.view(batch_size, length, self.num_heads, self.head_dim).transpose(1, 2)
        value = value.view(batch_size, length, self.num_heads, self.v_head_dim).transpose(1, 2)
        if layer_cache is not None:
            key, value = layer_cache.update(key, value, self.layer_idx)
            if self.is_cross_attention:
                cache.is_updated[self.layer_idx] = True
        return key, value


# --- Position-wise feed-forward network (Section 3.3) -------------------------------------------------------------


class VanillaTransformerFeedForward(nn.Module):
    """Section 3.3, Equation 2: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, the same at every position."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = VanillaTransformerDropout(config.activation_dropout)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation_fn(self.fc1(hidden_states))))


# --- Residual connection around each sub-layer, and the encoder and decoder layers (Sections 3.1, 5.4) ---------


class VanillaTransformerDropout(nn.Dropout):
    """Section 5.4's dropout: in training, each element is zeroed with probability p and the rest scaled by 1/(1-p).

    On a CPU it draws its own mask: `nn.Dropout` draws one random number an element (`bernoulli_`), a large share
    of a bfloat16 training step on a CPU (docs/findings.md, "Dropout's random masks"). Here each draw of 32 random bits
    makes the masks of two elements: each half's lowest 15 bits, against a threshold of round(p x 2^15). That
    rounds p to a multiple of 2^-15 (0.1 becomes 0.100006), and the scale follows the rounded p, so the expected
    output is still the input. Other devices, p of 0 or 1, and torch.compile (which cannot trace `random_`, and
    generates its own masks) use `nn.Dropout` itself. The masks come from torch's generator: `torch.manual_seed`
    repeats them.
    """

    levels = 2**15

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        own_mask = hidden_states.device.type == "cpu" and 0 < self.p < 1 and not is_torchdynamo_compiling()
        if not (self.training and own_mask):
            return super().forward(hidden_states)
        size = hidden_states.numel()
        bits = torch.empty((size + 1) // 2, dtype=torch.int32).random_()  # 31 random bits: [0, 2^31)
        halves = bits.view(torch.int16)[:size].view(hidden_states.shape)
        dropped = round(self.p * self.levels)
        keep = (halves & (self.levels - 1)) >= dropped
        return hidden_states * keep.to(hidden_states.dtype).mul_(self.levels / (self.levels - dropped))


class VanillaTransformerLayer(GradientCheckpointingLayer):
    """Sections 3.1 and 5.4: the output of each sub-layer is LayerNorm(x + Dropout(Sublayer(x))).

    With `layer_norm_position="pre"` it is x + Dropout(Sublayer(LayerNorm(x))) instead (a later variant; the stacks
    then end with a LayerNorm of their own). Each layer owns its sub-layers and their LayerNorms under names that
    say their role, as in BART and Marian (`self_attn` and `self_attn_layer_norm`, ...), and passes each sub-layer
    to `residual` when it runs, as the Annotated Transformer does.
    """

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.dropout = VanillaTransformerDropout(config.dropout)
        self.pre_norm = config.layer_norm_position == "pre"

    def residual(
        self, hidden_states: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor], layer_norm: nn.LayerNorm
    ) -> torch.Tensor:
        if self.pre_norm:
            return hidden_states + self.dropout(sublayer(layer_norm(hidden_states)))
        return layer_norm(hidden_states + self.dropout(sublayer(hidden_states)))


def new_layer_norm(config: VanillaTransformerConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


class VanillaTransformerEncoderLayer(VanillaTransformerLayer):
    """Section 3.1, encoder layer: multi-head self-attention, then the position-wise feed-forward network."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads)
        self.self_attn_layer_norm = new_layer_norm(config)
        self.feed_forward = VanillaTransformerFeedForward(config, config.encoder_ffn_dim)
        self.feed_forward_layer_norm = new_layer_norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        # attention also returns its weights ([1]); the output recorders collect those from the attention module
        hidden_states = self.residual(
            hidden_states,
            lambda x: self.self_attn(x, attention_mask=attention_mask, **kwargs)[0],
            self.self_attn_layer_norm,
        )
        return self.residual(hidden_states, self.feed_forward, self.feed_forward_layer_norm)


class VanillaTransformerDecoderLayer(VanillaTransformerLayer):
    """Section 3.1, decoder layer: masked self-attention, encoder-decoder attention, feed-forward network."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__(config)
        heads = config.decoder_attention_heads
        self.self_attn = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = new_layer_norm(config)
        self.encoder_attn = VanillaTransformerAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = new_layer_norm(config)
        self.feed_forward = VanillaTransformerFeedForward(config, config.decoder_ffn_dim)
        self.feed_forward_layer_norm = new_layer_norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        hidden_states = self.residual(
            hidden_states,
            lambda x: self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)[0],
            self.self_attn_layer_norm,
        )
        hidden_states = self.residual(
            hidden_states,
            lambda x: self.encoder_attn(
                x, key_value_states=encoder_hidden_states, attention_mask=encoder_attention_mask, cache=cache, **kwargs
            )[0],
            self.encoder_attn_layer_norm,
        )
        return self.residual(hidden_states, self.feed_forward, self.feed_forward_layer_norm)


# --- Encoder and decoder stacks (Section 3.1) ---------------------------------------------------------------------


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    """Weight initialisation and the features shared by every class of the model.

    The paper gives no initialisation; we use its reference code's (tensor2tensor): Xavier-uniform weights for every
    linear map, zero biases, N(0, init_std) token embeddings with init_std = d_model^-0.5 by default.
    """

    config: VanillaTransformerConfig
    model_tags = ["translation", "vanilla-transformer"]  # added to the card that push_to_hub writes
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    # the attention runs through transformers' attention interface (as Marian's does), and nothing branches on
    # data: every implementation it offers, and torch.compile with fullgraph=True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = True
    _can_compile_fullgraph = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]

    def _init_weights(self, module: nn.Module):
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.init_std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, VanillaTransformerSinusoidalPositionalEncoding):
            init.copy_(module.encoding, module.compute_encoding(*module.encoding.shape, module.encoding.dtype))

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True) -> nn.Embedding:
        """transformers resizes the input embeddings (the encoder's table) and an untied output projection. Our one
        vocabulary has a third table when `tie_word_embeddings=False`, the decoder's, which is resized with them:
        its rows kept, new rows the old rows' mean (`mean_resizing`, as transformers centres its new rows) or drawn
        as `_init_weights` draws them. (transformers' own table resizing is private, so this small piece is ours.)"""
        resized = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        decoder_embeddings = self.get_decoder().embeddings
        old = decoder_embeddings.embed_tokens
        if old is not resized and old.num_embeddings != resized.num_embeddings:
            new = nn.Embedding(
                resized.num_embeddings, old.embedding_dim, device=old.weight.device, dtype=old.weight.dtype
            )
            kept = min(old.num_embeddings, new.num_embeddings)
            with torch.no_grad():
                new.weight[:kept] = old.weight[:kept]
                if mean_resizing:
                    new.weight[kept:] = old.weight.mean(0)
                else:
                    new.weight[kept:].normal_(0.0, self.config.init_std)
            decoder_embeddings.embed_tokens = new
        return resized


class VanillaTransformerEncoder(VanillaTransformerPreTrainedModel):
    """Section 3.1: the encoder, a stack of N identical layers over the embedded source."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.embeddings = VanillaTransformerEmbeddings(config)
        self.layers = nn.ModuleList([VanillaTransformerEncoderLayer(config) for _ in range(config.encoder_layers)])
        self.layer_norm = new_layer_norm(config) if config.layer_norm_position == "pre" else None
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        hidden_states = self.embeddings(input_ids, inputs_embeds)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(VanillaTransformerPreTrainedModel):
    """Section 3.1: the decoder, a stack of N identical layers over the embedded target shifted right."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.embeddings = VanillaTransformerEmbeddings(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.layer_norm = new_layer_norm(config) if config.layer_norm_position == "pre" else None
        self.post_init()

    @capture_outputs
    @accepts_both_cache_names
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """`use_cache` defaults to `config.use_cache`, except in a training step (training mode with gradients):
        the cache serves decoding one token at a time, and a training step, which decodes the whole target at once,
        would fill it for nothing (the Trainer's label smoother calls the model without labels, so the loss does not
        switch it off). `generate()` passes its own cache, also from a model in training mode.
        """
        if encoder_hidden_states is None:
            raise ValueError(
                "The decoder attends to the encoder's output in every layer (Section 3.2.3): give "
                "encoder_hidden_states (or, to the whole model, input_ids or encoder_outputs)"
            )
        if use_cache is None:
            use_cache = self.config.use_cache and not (self.training and torch.is_grad_enabled())
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embeddings(input_ids, inputs_embeds, past_length=past_length)

        self_attention_mask = create_causal_mask(  # the cache by position: its keyword's name depends on the release
            self.config,
            hidden_states,
            attention_mask,
            cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                self_attention_mask,
                encoder_hidden_states,  # positional, so that gradient checkpointing sees it
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, **{CACHE_NAME: cache})


# --- The model (Section 3) ----------------------------------------------------------------------------------------


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """Section 3, Figure 1: encoder and decoder, without the output projection.

    With `tie_word_embeddings` (the default, Section 3.4) source and target share one embedding matrix, `shared`.
    """

    _tied_weights_keys = {
        "encoder.embeddings.embed_tokens.weight": "shared.weight",
        "decoder.embeddings.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model) if config.tie_word_embeddings else None
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embeddings.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding):
        self.encoder.embeddings.embed_tokens = value
        if self.config.tie_word_embeddings:
            self.shared = value
            self.decoder.embeddings.embed_tokens = value

    @can_return_tuple
    @accepts_both_cache_names
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        r"""
        input_ids, attention_mask: the source tokens and their padding mask (1 for tokens, 0 for padding).
        decoder_input_ids, decoder_attention_mask: the target shifted right (starting with `decoder_start_token_id`)
            and its padding mask; the causal mask is always applied.
        encoder_outputs: a precomputed encoder output, to run the decoder alone (as `generate()` does).
        cache: an `EncoderDecoderCache` of earlier decoder steps' keys and values.
        """
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)

        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_NAME: getattr(decoder_outputs, CACHE_NAME)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# --- The head: tied pre-softmax projection, loss and decoding (Sections 3.4, 5.4, 6.1) ------------------------------


class SourceLengthLimitLogitsProcessor(LogitsProcessor):
    """Section 6.1: each sentence's output ends by its source length + 50 tokens.

    Forces `</s>` as a sentence's last allowed token. `generate()` stops the batch at the longest limit; this makes
    every sentence keep its own, so a sentence decodes the same alone as in a padded batch.
    """

    def __init__(self, max_new_tokens: torch.LongTensor, eos_token_id: int | list[int], decoder_prompt_length: int):
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.decoder_prompt_length = decoder_prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        # generate() repeats each sentence's row once per beam or returned sequence
        rows_per_sentence = input_ids.shape[0] // self.max_new_tokens.shape[0]
        limits = self.max_new_tokens.to(input_ids.device).repeat_interleave(rows_per_sentence)
        at_limit = input_ids.shape[1] - self.decoder_prompt_length >= limits - 1
        # `</s>` keeps the model's own score, so that a hypothesis ended here is scored as the model scores it
        only_eos = torch.full_like(scores, -math.inf)
        only_eos[:, self.eos_token_id] = scores[:, self.eos_token_id]
        return torch.where(at_limit[:, None], only_eos, scores)


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """Section 3 with Section 3.4's output: decoder output x the shared embedding matrix^T, then softmax.

    `labels` give the cross-entropy loss over non-ignored (-100) positions; label smoothing (Section 5.4) is the
    Trainer's `label_smoothing_factor`. `generate()` decodes as the generation config says: a new model greedily
    within Section 6.1's length rule (source length + 50 tokens), as transformers' models built from a config do;
    `paper_generation_config` is Section 6.1's beam search (beam 4, length penalty 0.6), which `run_translation.py`
    writes into every model it trains.
    """

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        self.generation_config = length_limited_generation_config(config)

    @can_return_tuple
    @accepts_both_cache_names
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        labels: target token ids, -100 where no loss is wanted. When `decoder_input_ids` are not given they are the
            labels shifted right (`shift_tokens_right`).
        num_items_in_batch: the number of target tokens in the whole (accumulated) batch, which the Trainer passes
            so that the loss is the mean over all of them; otherwise the mean over this batch's targets.

        Other arguments as in [`VanillaTransformerModel.forward`].
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = fixed_cross_entropy(
                logits.flatten(0, 1).float(), labels.flatten().to(logits.device), num_items_in_batch
            )

        decoder_and_encoder_outputs = {name: value for name, value in outputs.items() if name != "last_hidden_state"}
        return Seq2SeqLMOutput(loss=loss, logits=logits, **decoder_and_encoder_outputs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def generate(self, inputs=None, generation_config=None, logits_processor=None, **kwargs):
        """`GenerationMixin.generate`, with Section 6.1's length limit for every sentence.

        Each sentence may produce at most its source length (its non-padding tokens) + `max_new_tokens_over_source`
        tokens, `</s>` included: 50 in the paper's generation config; `None`, or no such setting, switches the rule
        off. The limit is a logits processor given to transformers' `generate()`, which reads every other setting as
        it always does: `max_length` / `max_new_tokens` hold as well, and a sentence ends at whichever limit comes
        first. The model's own `max_length` is `max_position_embeddings`, so that the batch runs until each sentence
        has ended at its own limit (transformers' default would be 20).
        """
        limit = source_length_limit(self, inputs, generation_config, kwargs)
        if limit is not None:
            logits_processor = LogitsProcessorList([*(logits_processor or []), limit])
        return super().generate(inputs, generation_config, logits_processor=logits_processor, **kwargs)


def source_length_limit(
    model, inputs: torch.Tensor | None, generation_config: GenerationConfig | None, kwargs: dict
) -> SourceLengthLimitLogitsProcessor | None:
    """Section 6.1's limit for `model.generate(inputs, generation_config, **kwargs)` (our model's, or anything that
    decodes as it does: an ensemble of ours): each sentence may produce at most its source length (its non-padding
    tokens) + `max_new_tokens_over_source` tokens, `</s>` included, within the model's positions. The setting is the
    call's (popped from `kwargs`, which generate() would not know), else the given generation config's, else the
    model's, as transformers fills settings; None where it is None or missing: no such limit."""
    holding = [c for c in (generation_config, model.generation_config) if hasattr(c, "max_new_tokens_over_source")]
    max_new_tokens_over_source = kwargs.pop(
        "max_new_tokens_over_source", max_new_tokens_over_source_of(holding[0]) if holding else None
    )
    if max_new_tokens_over_source is None:
        return None
    decoder_input_ids = kwargs.get("decoder_input_ids")
    prompt_length = 1 if decoder_input_ids is None else decoder_input_ids.shape[1]
    sources = source_lengths(inputs, kwargs, model.config.pad_token_id, model.device)
    limits = length_limits(
        sources, model.config.max_position_embeddings, max_new_tokens_over_source, None, prompt_length
    )
    eos_token_id = next(
        value
        for value in (
            kwargs.get("eos_token_id"),
            getattr(generation_config, "eos_token_id", None),
            model.generation_config.eos_token_id,
            model.config.eos_token_id,
        )
        if value is not None
    )
    return SourceLengthLimitLogitsProcessor(limits, eos_token_id, prompt_length)


def source_lengths(inputs: torch.Tensor | None, kwargs: dict, pad_token_id: int, device) -> torch.LongTensor:
    """Non-padding tokens per source sentence of a generate() call: from the attention mask, else from the input
    ids, else every position of the input embeddings or of the encoder output, else the one `<s>` transformers
    starts from."""
    if kwargs.get("attention_mask") is not None:
        return kwargs["attention_mask"].sum(-1)
    input_ids = inputs if inputs is not None else kwargs.get("input_ids")
    if input_ids is not None:
        return (input_ids != pad_token_id).sum(-1)
    if kwargs.get("inputs_embeds") is not None:
        states = kwargs["inputs_embeds"]
    elif kwargs.get("encoder_outputs") is not None:
        states = kwargs["encoder_outputs"][0]
    else:  # no source at all: transformers encodes a one-token source, `<s>`
        return torch.ones(1, dtype=torch.long, device=device)
    return torch.full((states.shape[0],), states.shape[1], device=states.device)


def length_limits(
    source_lengths: torch.LongTensor,
    positions: int,
    max_new_tokens_over_source: int | None,
    max_new_tokens: int | None = None,
    prompt_length: int = 1,
) -> torch.LongTensor:
    """Section 6.1's rule, the one place it is computed: the most tokens each source of `source_lengths` tokens may
    be translated into, `</s>` included. That is its length (at most the `positions`) + `max_new_tokens_over_source`
    (None: no such limit), within what the positions leave after the decoder's `prompt_length` start tokens, and
    within `max_new_tokens` (None or 0: no such limit). Every route decodes by it: our `generate()`
    (`source_length_limit`), constrained beam search, CTranslate2, ONNX Runtime and the checks of prefixes and
    constraints."""
    limits = torch.full_like(source_lengths, positions - prompt_length)
    if max_new_tokens_over_source is not None:
        limits = torch.minimum(limits, source_lengths.clamp(max=positions) + max_new_tokens_over_source)
    return limits.clamp(max=max_new_tokens) if max_new_tokens else limits


def max_new_tokens_over_source_of(generation_config: GenerationConfig) -> int | None:
    """Section 6.1's `max_new_tokens_over_source` as a generation config holds it (None: no such limit)."""
    return getattr(generation_config, "max_new_tokens_over_source", None)


def length_limited_generation_config(config: VanillaTransformerConfig) -> GenerationConfig:
    """A new model's decoding: transformers' defaults (greedy, as every transformers model built from a config
    decodes), within Section 6.1's length rule: each sentence ends by its source length + 50 tokens, and
    `max_length` is the longest sequence the positions allow (transformers would otherwise stop at 20). A trained
    model carries its own decoding in its generation config: `run_translation.py` writes the paper's
    (`paper_generation_config`) into every model it trains.
    """
    return GenerationConfig(
        max_length=config.max_position_embeddings,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        max_new_tokens_over_source=PAPER_MAX_NEW_TOKENS_OVER_SOURCE,
    )


def paper_generation_config(config: VanillaTransformerConfig) -> GenerationConfig:
    """Section 6.1's decoding: beam size 4, length penalty alpha = 0.6, output length at most input length + 50.

    transformers' beam search divides a hypothesis' log-probability by |Y|^alpha, where |Y| counts generated
    tokens; the paper (after GNMT, Wu et al. 2016) divides by ((5 + |Y|) / 6)^alpha. Both favour longer outputs
    as alpha grows; their rankings can differ for short outputs.
    """
    generation_config = length_limited_generation_config(config)
    generation_config.update(num_beams=4, length_penalty=0.6)
    return generation_config


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "paper_generation_config",
]
