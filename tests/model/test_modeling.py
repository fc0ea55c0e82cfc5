"""The architecture: each piece against the paper's formula, and the whole against torch.nn.Transformer; and
save_pretrained / from_pretrained: exact round trips in safetensors, auto classes, and remote code."""

import json
import math
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    VanillaTransformerAttention,
    VanillaTransformerDropout,
    VanillaTransformerLayer,
    VanillaTransformerSinusoidalPositionalEncoding,
    shift_tokens_right,
)
from support.models import BOS, EOS, PAD, cache_of, enable_checkpointing, tiny_config, tiny_model
from support.processes import peak_growth


def paper_positional_encoding(num_positions: int, d_model: int) -> torch.Tensor:
    """Section 3.5, written out term by term."""
    table = torch.zeros(num_positions, d_model, dtype=torch.float64)
    for pos in range(num_positions):
        for i in range(0, d_model, 2):
            table[pos, i] = math.sin(pos / 10000 ** (i / d_model))
            if i + 1 < d_model:
                table[pos, i + 1] = math.cos(pos / 10000 ** (i / d_model))
    return table.float()


@pytest.mark.parametrize("d_model", [32, 33])
def test_sinusoidal_encoding_is_the_papers_interleaved_formula(d_model):
    encoding = VanillaTransformerSinusoidalPositionalEncoding(64, d_model).encoding
    torch.testing.assert_close(encoding, paper_positional_encoding(64, d_model), atol=1e-6, rtol=0)
    assert encoding[0, 0::2].abs().max() == 0 and torch.all(encoding[0, 1::2] == 1)


def float64_positional_encoding(num_positions: int, d_model: int) -> torch.Tensor:
    """Section 3.5 computed whole in float64."""
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model
    )
    table = torch.empty(num_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_sinusoidal_table_is_the_float64_one_rounded_to_the_models_dtype(dtype):
    """Over several of the blocks it is computed in, and at far positions, where the angles need float64."""
    encoding = VanillaTransformerSinusoidalPositionalEncoding.compute_encoding(5000, 512, dtype)
    assert encoding.dtype == dtype and torch.equal(encoding, float64_positional_encoding(5000, 512).to(dtype))
    far = VanillaTransformerSinusoidalPositionalEncoding.compute_encoding(1_000_001, 4, dtype)[1_000_000]
    expected = torch.tensor([math.sin(1e6), math.cos(1e6), math.sin(1e4), math.cos(1e4)], dtype=torch.float64)
    torch.testing.assert_close(far.double(), expected, atol=torch.finfo(dtype).eps, rtol=0)  # within one rounding


def test_a_model_loaded_in_bfloat16_has_the_float64_table_rounded_to_bfloat16(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    expected = float64_positional_encoding(128, 32).to(torch.bfloat16)
    for stack in (model.model.encoder, model.model.decoder):
        assert torch.equal(stack.embeddings.embed_positions.encoding, expected)


def test_building_the_sinusoidal_table_takes_little_memory_beyond_the_table():
    table = 250_000 * 128 * 4  # bytes, float32
    taken = peak_growth(
        "from hf_vanilla_transformer.model.modeling_vanilla_transformer import "
        "VanillaTransformerSinusoidalPositionalEncoding as Encoding\n"
        "Encoding.compute_encoding(1000, 128)",
        "Encoding.compute_encoding(250_000, 128)",
    )
    # a whole float64 table and its angles took 4 times the table; blocks, the allocator and torch's threads a little
    assert table <= taken < 1.5 * table, taken / 2**20


def test_embeddings_scale_by_sqrt_d_model_then_add_positions():
    model = tiny_model()
    input_ids = torch.tensor([[5, 6, 7, EOS]])
    embedded = model.model.encoder.embeddings(input_ids)
    expected = model.model.shared(input_ids) * math.sqrt(32) + paper_positional_encoding(4, 32)
    torch.testing.assert_close(embedded, expected, atol=1e-5, rtol=0)

    unscaled = tiny_model(scale_embedding=False).model.encoder.embeddings(input_ids)
    expected = tiny_model(scale_embedding=False).model.shared(input_ids) + paper_positional_encoding(4, 32)
    torch.testing.assert_close(unscaled, expected, atol=1e-5, rtol=0)


def test_embedding_dropout_applies_to_the_sum_in_training():
    model = tiny_model(dropout=0.5).train()
    embedded = model.model.encoder.embeddings(torch.tensor([[5, 6, 7, EOS]]))
    zero_fraction = (embedded == 0).float().mean().item()
    assert 0.3 < zero_fraction < 0.7


def test_three_way_tied_embeddings():
    model = tiny_model()
    shared = model.model.shared.weight
    assert model.model.encoder.embeddings.embed_tokens.weight is shared
    assert model.model.decoder.embeddings.embed_tokens.weight is shared
    assert model.lm_head.weight is shared
    assert model.get_input_embeddings().weight is shared and model.get_output_embeddings().weight is shared


def test_untied_embeddings_are_three_matrices():
    model = tiny_model(tie_word_embeddings=False)
    weights = [
        model.model.encoder.embeddings.embed_tokens.weight,
        model.model.decoder.embeddings.embed_tokens.weight,
        model.lm_head.weight,
    ]
    assert len({id(w) for w in weights}) == 3 and model.model.shared is None


def test_attention_is_equation_one_with_separate_key_and_value_sizes():
    config = tiny_config(head_dim=6, v_head_dim=10, attn_implementation="eager")
    torch.manual_seed(1)
    attention = VanillaTransformerAttention(config, num_heads=4)
    x = torch.randn(2, 5, 32)
    output, weights = attention(x)

    q = (x @ attention.q_proj.weight.T).view(2, 5, 4, 6).transpose(1, 2)
    k, v = (x @ attention.kv_proj.weight.T).split([24, 40], dim=-1)
    k, v = k.view(2, 5, 4, 6).transpose(1, 2), v.view(2, 5, 4, 10).transpose(1, 2)
    expected_weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(6), dim=-1)
    heads = (expected_weights @ v).transpose(1, 2).reshape(2, 5, 40)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(output, heads @ attention.out_proj.weight.T)
    assert attention.q_proj.bias is None and attention.kv_proj.bias is None and attention.out_proj.bias is None


@pytest.mark.parametrize("position, expected", [("post", "norm(x + f(x))"), ("pre", "x + f(norm(x))")])
def test_sublayer_connection(position, expected):
    config = tiny_config(layer_norm_position=position)
    torch.manual_seed(2)
    layer = VanillaTransformerLayer(config).eval()
    f, norm = nn.Linear(32, 32), nn.LayerNorm(32)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x = torch.randn(3, 32)
    reference = {"norm(x + f(x))": norm(x + f(x)), "x + f(norm(x))": x + f(norm(x))}[expected]
    torch.testing.assert_close(layer.residual(x, f, norm), reference)


def test_residual_dropout_applies_to_the_sublayer_output_before_the_sum():
    config = tiny_config(dropout=0.5)
    layer = VanillaTransformerLayer(config).train()
    f, norm = nn.Linear(32, 32), nn.LayerNorm(32)
    x = torch.randn(3, 32)
    torch.manual_seed(5)
    output = layer.residual(x, f, norm)
    torch.manual_seed(5)
    dropped = layer.dropout(f(x))
    assert (dropped == 0).any()
    torch.testing.assert_close(output, norm(x + dropped))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_zeroes_each_element_with_probability_p_and_scales_the_rest(p, dtype):
    size = 400_001  # odd: the last element has half a draw of its own
    torch.manual_seed(0)
    output = VanillaTransformerDropout(p).train()(torch.ones(size, dtype=dtype))
    dropped = round(p * 2**15) / 2**15
    assert abs(dropped - p) <= 2**-16
    # both halves of each 32-bit draw: even and odd positions alike, and the last element
    for part in (output[0::2], output[1::2]):
        assert abs((part == 0).double().mean().item() - p) < 0.005
    assert set(output.float().unique().tolist()) == {0.0, torch.tensor(1 / (1 - dropped), dtype=dtype).item()}
    assert abs(output.double().mean().item() - 1) < 0.01
    # the same statistics as nn.Dropout's
    reference = nn.Dropout(p).train()(torch.ones(size, dtype=dtype))
    assert abs((reference == 0).double().mean().item() - (output == 0).double().mean().item()) < 0.006


def test_dropout_repeats_under_a_seed_passes_gradients_through_its_mask_and_is_off_in_evaluation():
    dropout = VanillaTransformerDropout(0.3).train()
    x = torch.randn(6, 7, requires_grad=True)
    torch.manual_seed(3)
    first = dropout(x)
    torch.manual_seed(3)
    assert dropout(x).equal(first) and not dropout(x).equal(first)
    first.sum().backward()
    torch.testing.assert_close(x.grad, (first != 0).float() / (1 - round(0.3 * 2**15) / 2**15))
    assert dropout.eval()(x) is x
    assert VanillaTransformerDropout(0.0).train()(x) is x
    assert VanillaTransformerDropout(1.0).train()(x).eq(0).all()


def test_pre_norm_stacks_end_with_a_layer_norm_and_post_norm_ones_do_not():
    assert tiny_model().model.encoder.layer_norm is None
    pre = tiny_model(layer_norm_position="pre")
    assert isinstance(pre.model.encoder.layer_norm, nn.LayerNorm)
    assert isinstance(pre.model.decoder.layer_norm, nn.LayerNorm)


# Every weight of a 1+1-layer model, under the name of its role, with Marian's name for the same weight beside it
# (Marian splits kv_proj into k_proj and v_proj, adds biases to the attention projections, and calls the
# feed-forward network's LayerNorm final_layer_norm).
STATE_DICT_KEYS_AND_MARIANS = {
    "model.shared.weight": "model.shared.weight",
    "model.encoder.embeddings.embed_tokens.weight": "model.encoder.embed_tokens.weight",
    "model.encoder.layers.0.self_attn.q_proj.weight": "model.encoder.layers.0.self_attn.q_proj.weight",
    "model.encoder.layers.0.self_attn.kv_proj.weight": "model.encoder.layers.0.self_attn.{k,v}_proj.weight",
    "model.encoder.layers.0.self_attn.out_proj.weight": "model.encoder.layers.0.self_attn.out_proj.weight",
    "model.encoder.layers.0.self_attn_layer_norm.weight": "model.encoder.layers.0.self_attn_layer_norm.weight",
    "model.encoder.layers.0.self_attn_layer_norm.bias": "model.encoder.layers.0.self_attn_layer_norm.bias",
    "model.encoder.layers.0.feed_forward.fc1.weight": "model.encoder.layers.0.fc1.weight",
    "model.encoder.layers.0.feed_forward.fc1.bias": "model.encoder.layers.0.fc1.bias",
    "model.encoder.layers.0.feed_forward.fc2.weight": "model.encoder.layers.0.fc2.weight",
    "model.encoder.layers.0.feed_forward.fc2.bias": "model.encoder.layers.0.fc2.bias",
    "model.encoder.layers.0.feed_forward_layer_norm.weight": "model.encoder.layers.0.final_layer_norm.weight",
    "model.encoder.layers.0.feed_forward_layer_norm.bias": "model.encoder.layers.0.final_layer_norm.bias",
    "model.decoder.embeddings.embed_tokens.weight": "model.decoder.embed_tokens.weight",
    "model.decoder.layers.0.self_attn.q_proj.weight": "model.decoder.layers.0.self_attn.q_proj.weight",
    "model.decoder.layers.0.self_attn.kv_proj.weight": "model.decoder.layers.0.self_attn.{k,v}_proj.weight",
    "model.decoder.layers.0.self_attn.out_proj.weight": "model.decoder.layers.0.self_attn.out_proj.weight",
    "model.decoder.layers.0.self_attn_layer_norm.weight": "model.decoder.layers.0.self_attn_layer_norm.weight",
    "model.decoder.layers.0.self_attn_layer_norm.bias": "model.decoder.layers.0.self_attn_layer_norm.bias",
    "model.decoder.layers.0.encoder_attn.q_proj.weight": "model.decoder.layers.0.encoder_attn.q_proj.weight",
    "model.decoder.layers.0.encoder_attn.kv_proj.weight": "model.decoder.layers.0.encoder_attn.{k,v}_proj.weight",
    "model.decoder.layers.0.encoder_attn.out_proj.weight": "model.decoder.layers.0.encoder_attn.out_proj.weight",
    "model.decoder.layers.0.encoder_attn_layer_norm.weight": "model.decoder.layers.0.encoder_attn_layer_norm.weight",
    "model.decoder.layers.0.encoder_attn_layer_norm.bias": "model.decoder.layers.0.encoder_attn_layer_norm.bias",
    "model.decoder.layers.0.feed_forward.fc1.weight": "model.decoder.layers.0.fc1.weight",
    "model.decoder.layers.0.feed_forward.fc1.bias": "model.decoder.layers.0.fc1.bias",
    "model.decoder.layers.0.feed_forward.fc2.weight": "model.decoder.layers.0.fc2.weight",
    "model.decoder.layers.0.feed_forward.fc2.bias": "model.decoder.layers.0.fc2.bias",
    "model.decoder.layers.0.feed_forward_layer_norm.weight": "model.decoder.layers.0.final_layer_norm.weight",
    "model.decoder.layers.0.feed_forward_layer_norm.bias": "model.decoder.layers.0.final_layer_norm.bias",
    "lm_head.weight": "lm_head.weight",
}


def test_every_weight_is_named_by_its_role():
    model = tiny_model(encoder_layers=1, decoder_layers=1)
    assert list(model.state_dict()) == list(STATE_DICT_KEYS_AND_MARIANS)
    # pre-LN stacks end with a LayerNorm each; learned positions are weights
    variant = tiny_model(
        encoder_layers=1, decoder_layers=1, layer_norm_position="pre", position_embedding_type="learned"
    )
    assert set(variant.state_dict()) - set(model.state_dict()) == {
        "model.encoder.embeddings.embed_positions.weight",
        "model.encoder.layer_norm.weight",
        "model.encoder.layer_norm.bias",
        "model.decoder.embeddings.embed_positions.weight",
        "model.decoder.layer_norm.weight",
        "model.decoder.layer_norm.bias",
    }


def copy_into_torch_transformer(model) -> nn.Transformer:
    """A torch.nn.Transformer (post-LN, ReLU, no final norms) holding our model's weights."""
    config = model.config

    def encoder_layer():
        return nn.TransformerEncoderLayer(
            32, config.encoder_attention_heads, config.encoder_ffn_dim, 0.0, batch_first=True
        )

    def decoder_layer():
        return nn.TransformerDecoderLayer(
            32, config.decoder_attention_heads, config.decoder_ffn_dim, 0.0, batch_first=True
        )

    reference = nn.Transformer(
        d_model=32,
        custom_encoder=nn.TransformerEncoder(encoder_layer(), config.encoder_layers, enable_nested_tensor=False),
        custom_decoder=nn.TransformerDecoder(decoder_layer(), config.decoder_layers),
        batch_first=True,
    )

    def copy_attention(theirs: nn.MultiheadAttention, attention):
        theirs.in_proj_weight.data = torch.cat([attention.q_proj.weight, attention.kv_proj.weight]).clone()
        theirs.in_proj_bias.data.zero_()
        theirs.out_proj.weight.data = attention.out_proj.weight.clone()
        theirs.out_proj.bias.data.zero_()

    def copy_layer_norm(theirs: nn.LayerNorm, ours: nn.LayerNorm):
        theirs.load_state_dict(ours.state_dict())

    def copy_feed_forward(theirs, ours):
        theirs.linear1.load_state_dict(ours.fc1.state_dict())
        theirs.linear2.load_state_dict(ours.fc2.state_dict())

    for theirs, ours in zip(reference.encoder.layers, model.model.encoder.layers, strict=False):
        copy_attention(theirs.self_attn, ours.self_attn)
        copy_feed_forward(theirs, ours.feed_forward)
        copy_layer_norm(theirs.norm1, ours.self_attn_layer_norm)
        copy_layer_norm(theirs.norm2, ours.feed_forward_layer_norm)
    for theirs, ours in zip(reference.decoder.layers, model.model.decoder.layers, strict=False):
        copy_attention(theirs.self_attn, ours.self_attn)
        copy_attention(theirs.multihead_attn, ours.encoder_attn)
        copy_feed_forward(theirs, ours.feed_forward)
        copy_layer_norm(theirs.norm1, ours.self_attn_layer_norm)
        copy_layer_norm(theirs.norm2, ours.encoder_attn_layer_norm)
        copy_layer_norm(theirs.norm3, ours.feed_forward_layer_norm)
    return reference.eval()


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_logits_equal_torch_nn_transformer(padded_batch, attn_implementation):
    model = tiny_model(seed=3, attn_implementation=attn_implementation, decoder_attention_heads=4)
    reference = copy_into_torch_transformer(model)
    embedding = model.model.shared.weight
    src, tgt = padded_batch["input_ids"], padded_batch["decoder_input_ids"]

    def embed(ids):
        return embedding[ids] * math.sqrt(32) + paper_positional_encoding(ids.shape[1], 32)

    with torch.no_grad():
        hidden = reference(
            embed(src),
            embed(tgt),
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1]),
            src_key_padding_mask=src == PAD,
            memory_key_padding_mask=src == PAD,
            tgt_is_causal=True,
        )
        expected = hidden @ embedding.T
        logits = model(**padded_batch).logits
    assert (logits - expected).abs().max().item() <= 1e-5


def test_decoder_is_causal(padded_batch):
    model = tiny_model()
    with torch.no_grad():
        logits = model(**padded_batch).logits
        for t in range(1, 5):
            changed = padded_batch["decoder_input_ids"].clone()
            changed[:, t] = 42
            changed_logits = model(**{**padded_batch, "decoder_input_ids": changed}).logits
            torch.testing.assert_close(changed_logits[:, :t], logits[:, :t], atol=1e-6, rtol=0)
            assert (changed_logits[:, t:] - logits[:, t:]).abs().max() > 1e-3


def test_source_padding_changes_nothing():
    model = tiny_model()
    source = torch.tensor([[11, 12, 13, EOS]])
    padded = torch.tensor([[11, 12, 13, EOS, PAD, PAD, PAD]])
    target = torch.tensor([[BOS, 24, 25, 26]])
    with torch.no_grad():
        alone = model(input_ids=source, decoder_input_ids=target).logits
        with_padding = model(input_ids=padded, attention_mask=(padded != PAD).long(), decoder_input_ids=target).logits
    torch.testing.assert_close(with_padding, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"layer_norm_position": "pre"}, {"position_embedding_type": "learned"}, {"head_dim": 12, "v_head_dim": 4}],
)
def test_eager_and_sdpa_agree(padded_batch, overrides):
    eager = tiny_model(attn_implementation="eager", **overrides)
    sdpa = tiny_model(attn_implementation="sdpa", **overrides)
    with torch.no_grad():
        difference = (eager(**padded_batch).logits - sdpa(**padded_batch).logits).abs().max().item()
    assert difference <= 1e-5


def test_output_attentions(padded_batch):
    model = tiny_model()
    with torch.no_grad():
        outputs = model(**padded_batch, output_attentions=True, output_hidden_states=True)
    assert [a.shape for a in outputs.encoder_attentions] == [torch.Size([2, 4, 7, 7])] * 2
    assert [a.shape for a in outputs.decoder_attentions] == [torch.Size([2, 2, 5, 5])] * 3
    assert [a.shape for a in outputs.cross_attentions] == [torch.Size([2, 2, 5, 7])] * 3
    assert len(outputs.encoder_hidden_states) == 3 and len(outputs.decoder_hidden_states) == 4
    for weights in outputs.encoder_attentions + outputs.decoder_attentions + outputs.cross_attentions:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    for weights in outputs.decoder_attentions:
        assert torch.all(weights.triu(diagonal=1) == 0)
    for weights in outputs.cross_attentions + outputs.encoder_attentions:
        assert torch.all(weights[1, :, :, 4:] == 0)  # the second source's padding is never attended to


def test_labels_give_cross_entropy_ignoring_minus_100_and_shift_right():
    model = tiny_model()
    input_ids = torch.tensor([[5, 6, 7, EOS], [8, 9, EOS, PAD]])
    labels = torch.tensor([[20, 21, 22, EOS], [23, EOS, -100, -100]])
    outputs = model(input_ids=input_ids, attention_mask=(input_ids != PAD).long(), labels=labels)

    decoder_input_ids = shift_tokens_right(labels, PAD, BOS)
    assert decoder_input_ids.tolist() == [[BOS, 20, 21, 22], [BOS, 23, EOS, PAD]]
    explicit = model(input_ids=input_ids, attention_mask=(input_ids != PAD).long(), decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(outputs.logits, explicit.logits)
    log_probs = torch.log_softmax(explicit.logits, dim=-1)
    picked = [log_probs[b, t, labels[b, t]] for b in range(2) for t in range(4) if labels[b, t] != -100]
    torch.testing.assert_close(outputs.loss, -torch.stack(picked).mean())


def test_a_training_step_builds_no_cache_and_decoding_still_does(padded_batch):
    """The Trainer's label smoother calls the model without labels; a training step must not fill a cache then."""
    model = tiny_model().train()
    assert cache_of(model(**padded_batch)) is None
    with torch.no_grad():  # generate() from a model in training mode, or any forward without gradients
        assert cache_of(model(**padded_batch)).get_seq_length() == padded_batch["decoder_input_ids"].shape[1]
    assert cache_of(model(**padded_batch, use_cache=True)) is not None  # asked for, it is built
    assert cache_of(model.eval()(**padded_batch)) is not None
    model.config.use_cache = False
    assert cache_of(model(**padded_batch)) is None


def checkpointing_step(checkpointing: bool) -> dict:
    """One training step of a tiny model: its gradients, the attention modules' forward calls in the forward and
    the backward pass, and the bytes the forward saved for the backward (autograd's saved-tensor hooks)."""
    input_ids = torch.tensor([[5, 6, 7, 8, 9, EOS], [8, 9, EOS, PAD, PAD, PAD]])
    batch = {
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD).long(),
        "labels": torch.tensor([[20, 21, 22, 23, EOS]] * 2),
    }
    model = tiny_model().train()
    if checkpointing:
        enable_checkpointing(model)
    layers = [*model.model.encoder.layers, *model.model.decoder.layers]
    assert all(layer.gradient_checkpointing == checkpointing for layer in layers)
    calls = []
    for module in model.modules():
        if isinstance(module, VanillaTransformerAttention):
            module.register_forward_hook(lambda module, args, output: calls.append(module))
    saved = []

    def count(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
        loss = model(**batch).loss
    forward_calls = len(calls)
    loss.backward()
    return {
        "gradients": {name: p.grad for name, p in model.named_parameters()},
        "forward_calls": forward_calls,
        "backward_calls": len(calls) - forward_calls,
        "saved_bytes": sum(saved),
    }


def test_gradient_checkpointing_reruns_every_layer_in_the_backward_and_keeps_only_its_inputs():
    """transformers checkpoints each `GradientCheckpointingLayer`: our encoder and decoder layers, whole. The
    backward runs each layer's forward again (every attention once more), and the forward keeps a fraction of what
    it keeps otherwise (bench/scale/bench_memory.py measures the `base` model). The gradients are the same."""
    plain, checkpointed = checkpointing_step(False), checkpointing_step(True)
    attentions = 2 + 3 * 2  # tiny_config: 2 encoder layers, 3 decoder layers with two attentions each
    assert (plain["forward_calls"], plain["backward_calls"]) == (attentions, 0)
    assert (checkpointed["forward_calls"], checkpointed["backward_calls"]) == (attentions, attentions)
    assert checkpointed["saved_bytes"] < 0.25 * plain["saved_bytes"]
    assert plain["gradients"].keys() == checkpointed["gradients"].keys()
    for name, gradient in plain["gradients"].items():
        torch.testing.assert_close(checkpointed["gradients"][name], gradient, msg=name)


def batches_of_changing_shape(count: int, seed: int = 0):
    """Padded batches of random lengths and sizes, as token budgets give: every step a new shape."""
    generator = torch.Generator().manual_seed(seed)
    for step in range(count):
        rows, source, target = 2 + step % 3, 4 + 3 * step % 11, 3 + 5 * step % 9
        input_ids = torch.randint(4, 99, (rows, source), generator=generator)
        input_ids[0, -2:] = torch.tensor([EOS, PAD])  # padding too
        yield {
            "input_ids": input_ids,
            "attention_mask": (input_ids != PAD).long(),
            "labels": torch.randint(4, 99, (rows, target), generator=generator),
        }


@pytest.mark.slow
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_dynamo_sees_the_model_as_one_graph_in_training_and_evaluation(attn_implementation):
    """No graph break anywhere in a forward pass (so none inside a layer): with `fullgraph=True` a break is an
    error, and a backend that records what it is handed counts one graph."""
    batch = next(batches_of_changing_shape(1))
    for training in (True, False):
        graphs = []

        def recording_backend(graph_module, example_inputs, graphs=graphs):
            graphs.append(graph_module)
            return graph_module.forward

        torch.compiler.reset()
        model = tiny_model(attn_implementation=attn_implementation, dropout=0.1).train(training)
        torch.compile(model, fullgraph=True, backend=recording_backend)(**batch)
        assert len(graphs) == 1


@pytest.mark.slow
def test_compiled_training_matches_eager_over_steps_of_changing_shape():
    """torch.compile (inductor) against eager: losses and logits within 1e-5 at every step of 8 Adam steps on
    batches of 8 shapes, all from one compilation with dynamic sizes (nothing in the model fixes a length), so no
    padding to length buckets is needed: after the first shape, torch is told to fail rather than compile again.
    (Without `dynamic=True`, as under `--torch_compile`, torch compiles the first shape, then once more with dynamic
    sizes.)"""
    torch.compiler.reset()
    layers = {"encoder_layers": 1, "decoder_layers": 1}  # one of each holds all the code: less to compile
    eager = tiny_model(seed=1, dropout=0.0, **layers).train()
    compiled_model = tiny_model(seed=1, dropout=0.0, **layers).train()
    compiled = torch.compile(compiled_model, dynamic=True)
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (eager, compiled_model)]
    for step, batch in enumerate(batches_of_changing_shape(8)):
        stance = "default" if step == 0 else "fail_on_recompile"
        with torch.compiler.set_stance(stance):
            outputs = [eager(**batch), compiled(**batch)]
        torch.testing.assert_close(outputs[1].logits, outputs[0].logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(outputs[1].loss, outputs[0].loss, rtol=0, atol=1e-5)
        for output, optimizer in zip(outputs, optimizers, strict=True):
            output.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        batch = next(batches_of_changing_shape(1, seed=9))
        torch.testing.assert_close(compiled.eval()(**batch).logits, eager.eval()(**batch).logits, rtol=0, atol=1e-5)


def test_learned_positions_are_parameters_that_matter(padded_batch):
    model = tiny_model(position_embedding_type="learned")
    positions = model.model.encoder.embeddings.embed_positions
    assert isinstance(positions, nn.Embedding) and positions.weight.requires_grad
    with torch.no_grad():
        before = model(**padded_batch).logits
        positions.weight[1].add_(1.0)
        after = model(**padded_batch).logits
    assert (after - before).abs().max() > 1e-3


def test_too_long_input_is_a_clear_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="130 positions is longer than max_position_embeddings=128"):
        model(input_ids=torch.full((1, 130), 5), decoder_input_ids=torch.tensor([[BOS]]))


# Saving and loading

SOURCES = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
TARGETS = torch.tensor([[0, 20, 21, 22], [0, 23, 24, 25]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=SOURCES, attention_mask=(SOURCES != PAD).long(), decoder_input_ids=TARGETS).logits


def saved_tensor_names(folder) -> set[str]:
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as weights:
        return set(weights.keys())


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": False}, {"position_embedding_type": "learned", "layer_norm_position": "pre"}],
)
def test_round_trip_is_exact_and_silent(tmp_path, capfd, overrides):
    model = tiny_model(**overrides)
    model.generation_config.num_beams = 5
    model.save_pretrained(tmp_path)
    capfd.readouterr()

    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert type(loaded) is VanillaTransformerForConditionalGeneration
    assert {key: list(value) for key, value in info.items() if value} == {}
    assert "missing" not in capfd.readouterr().err.lower()
    original, reloaded = model.state_dict(), loaded.state_dict()
    assert original.keys() == reloaded.keys()
    assert all(torch.equal(original[name], reloaded[name]) for name in original)
    torch.testing.assert_close(logits(loaded.eval()), logits(model), atol=0, rtol=0)
    assert loaded.generation_config.num_beams == 5
    assert (loaded.model.shared is None) == (overrides.get("tie_word_embeddings") is False)


def test_tied_embedding_is_stored_once_and_sinusoids_not_at_all(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    names = saved_tensor_names(tmp_path)
    embedding_names = {name for name in names if "embed" in name or "shared" in name or "lm_head" in name}
    assert embedding_names == {"model.shared.weight"}
    assert not any("embed_positions" in name for name in names)

    tiny_model(tie_word_embeddings=False).save_pretrained(tmp_path / "untied")
    untied = {name for name in saved_tensor_names(tmp_path / "untied") if "embed" in name or "lm_head" in name}
    assert untied == {
        "lm_head.weight",
        "model.encoder.embeddings.embed_tokens.weight",
        "model.decoder.embeddings.embed_tokens.weight",
    }


def test_loaded_model_keeps_the_three_way_tie(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    shared = loaded.model.shared.weight
    assert loaded.lm_head.weight is shared and loaded.model.decoder.embeddings.embed_tokens.weight is shared


def test_auto_model_loads_the_base_model(tmp_path):
    torch.manual_seed(0)
    VanillaTransformerModel(tiny_model().config).save_pretrained(tmp_path)
    assert type(AutoModel.from_pretrained(tmp_path)) is VanillaTransformerModel
    assert type(AutoConfig.from_pretrained(tmp_path)) is VanillaTransformerConfig


def test_auto_classes_build_the_model_from_its_config():
    config = tiny_model().config
    assert type(AutoModelForSeq2SeqLM.from_config(config)) is VanillaTransformerForConditionalGeneration
    assert type(AutoModel.from_config(config)) is VanillaTransformerModel


def test_saved_folder_carries_its_code(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "vanilla_transformer"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    assert (tmp_path / "configuration_vanilla_transformer.py").exists()
    assert (tmp_path / "modeling_vanilla_transformer.py").exists()


@pytest.mark.slow  # a fresh Python: 8 s of imports, too many for the quick tier
def test_loads_with_remote_code_where_the_package_is_not_importable(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    expected = logits(model)
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["hf_vanilla_transformer"] = None  # any import of the package now fails
        import torch
        from transformers import AutoModelForSeq2SeqLM
        folder = {str(tmp_path / "model")!r}
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True, attn_implementation="eager")
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        sources = torch.tensor({SOURCES.tolist()})
        with torch.no_grad():
            logits = model(input_ids=sources, attention_mask=(sources != {PAD}).long(),
                           decoder_input_ids=torch.tensor({TARGETS.tolist()})).logits
        torch.save(logits, {str(tmp_path / "logits.pt")!r})
        print(model.generate(sources, attention_mask=(sources != {PAD}).long(), max_new_tokens=4).tolist())
        """
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected, atol=0, rtol=0)
    generated = model.generate(SOURCES, attention_mask=(SOURCES != PAD).long(), max_new_tokens=4).tolist()
    assert result.stdout.strip() == str(generated)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("bfloat16", [False, True], ids=["float32", "bfloat16-autocast"])
def test_edge_batches_give_finite_losses_gradients_and_scores(attn_implementation, bfloat16):
    """A source row of padding only, a source of `</s>` alone, one of exactly max_position_embeddings tokens, and
    targets of `</s>` alone: nothing becomes NaN or Inf, in training or in beam search."""
    model = tiny_model(attn_implementation=attn_implementation, dropout=0.1).train()
    positions = model.config.max_position_embeddings
    input_ids = torch.full((4, positions), PAD)
    input_ids[1, 0] = EOS
    input_ids[2] = torch.randint(4, 99, (positions,), generator=torch.Generator().manual_seed(0))
    input_ids[2, -1] = EOS
    input_ids[3, :5] = torch.tensor([5, 6, 7, 8, EOS])
    attention_mask = (input_ids != PAD).long()  # row 0: no token at all
    labels = torch.full((4, 6), -100)
    labels[:, 0] = EOS
    labels[2] = torch.tensor([9, 10, 11, 12, 13, EOS])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
        output = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    output.loss.backward()
    assert torch.isfinite(output.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
        generated = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_beams=2,
            max_new_tokens=5,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
        )
    assert all(torch.isfinite(logits).all() for logits in generated.logits)
    assert torch.isfinite(generated.sequences_scores).all()
    assert not any(torch.isnan(scores).any() for scores in generated.scores)  # -inf marks tokens a rule forbids


class RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (exec, ("open('ran', 'w').write('the pickle ran code')",))


def test_pickled_weights_load_as_transformers_loads_them_without_running_code(tmp_path, monkeypatch):
    # transformers 5 reads a pytorch_model.bin with torch.load(weights_only=True): tensors load, code does not run
    model = tiny_model()
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert all(torch.equal(tensor, model.state_dict()[name]) for name, tensor in loaded.state_dict().items())
    torch.save({**model.state_dict(), "payload": RunsCodeWhenUnpickled()}, tmp_path / "pytorch_model.bin")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert not (tmp_path / "ran").exists()
