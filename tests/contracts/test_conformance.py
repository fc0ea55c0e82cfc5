"""What transformers' own common model tests (`ModelTesterMixin`, `GenerationTesterMixin`) expect of a model,
written out for ours: loading by keyword and in half precision, determinism, the shapes of hidden states,
attentions and the cache, `inputs_embeds`, resizing, the attention implementations, the old name of the cache, every
`generate()` mode transformers offers an encoder-decoder here, static caches with and without `torch.compile`, PEFT
and `device_map`. The round trip, gradient checkpointing and dynamo's single graph are in model/test_modeling.py.

Not here: flash attention (it needs a GPU and the flash-attn package; the model declares it, as Marian does, on the
same attention interface) and contrastive search (transformers 5 moved it to a Hub repository, out of reach).
"""

import copy
import warnings

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, CompileConfig, EncoderDecoderCache

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)
from hf_vanilla_transformer.model.modeling_vanilla_transformer import CACHE_NAME
from support.models import BOS, EOS, PAD, cache_of, tiny_config, tiny_model

SOURCES = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, EOS, PAD, PAD, PAD]])
MASK = (SOURCES != PAD).long()
TARGETS = torch.tensor([[BOS, 20, 21, 22], [BOS, 23, 24, PAD]])
# equal head counts in both stacks, so that config.head_dim is set (tiny_config's differ on purpose)
EQUAL_HEADS = dict(decoder_attention_heads=4)


def forward(model, **kwargs):
    inputs = dict(input_ids=SOURCES, attention_mask=MASK, decoder_input_ids=TARGETS) | kwargs
    with torch.no_grad():
        return model(**{name: value for name, value in inputs.items() if value is not None})


def generate(model, **kwargs):
    inputs = dict(input_ids=SOURCES, attention_mask=MASK, max_new_tokens=8) | kwargs
    with torch.no_grad():
        return model.generate(**{name: value for name, value in inputs.items() if value is not None})


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved")
    tiny_model(**EQUAL_HEADS).save_pretrained(path)
    return path


@pytest.mark.parametrize("model_class", [VanillaTransformerForConditionalGeneration, VanillaTransformerModel])
def test_from_pretrained_takes_the_folder_by_keyword_as_by_position(folder, model_class):
    by_keyword = model_class.from_pretrained(pretrained_model_name_or_path=folder)
    by_position = model_class.from_pretrained(folder)
    assert (
        forward(by_keyword).last_hidden_state.equal(forward(by_position).last_hidden_state)
        if (model_class is VanillaTransformerModel)
        else forward(by_keyword).logits.equal(forward(by_position).logits)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("how", ["dtype argument", "auto class", "built under a default dtype"])
def test_a_model_loaded_in_half_precision_runs_in_it(folder, dtype, how):
    if how == "dtype argument":
        model = VanillaTransformerForConditionalGeneration.from_pretrained(folder, dtype=dtype)
    elif how == "auto class":
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=dtype)
    else:  # (from_pretrained itself reads the dtype from the saved config unless given one)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_pretrained(folder))
        finally:
            torch.set_default_dtype(previous)
        model.load_state_dict(AutoModelForSeq2SeqLM.from_pretrained(folder).state_dict())
        model.eval()
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    assert {name for name, tensor in tensors.items() if tensor.dtype != dtype} == set()
    logits = forward(model).logits
    assert logits.dtype == dtype
    full = forward(AutoModelForSeq2SeqLM.from_pretrained(folder)).logits
    torch.testing.assert_close(logits.float(), full, atol=0.1, rtol=0.05)
    assert generate(model).shape[0] == 2


def test_forwards_are_deterministic_in_evaluation_and_under_a_seed_in_training():
    model = tiny_model(dropout=0.3)
    assert forward(model).logits.equal(forward(model).logits)
    model.train()
    torch.manual_seed(1)
    first = forward(model).logits
    torch.manual_seed(1)
    assert forward(model).logits.equal(first) and not forward(model).logits.equal(first)


def test_hidden_states_and_attentions_have_one_entry_per_layer_in_transformers_shapes():
    config = tiny_config()
    output = forward(tiny_model(), output_hidden_states=True, output_attentions=True)
    batch, source, target = SOURCES.shape[0], SOURCES.shape[1], TARGETS.shape[1]
    # the embeddings' output, then each layer's
    assert [h.shape for h in output.encoder_hidden_states] == [(batch, source, 32)] * (config.encoder_layers + 1)
    assert [h.shape for h in output.decoder_hidden_states] == [(batch, target, 32)] * (config.decoder_layers + 1)
    assert [a.shape for a in output.encoder_attentions] == [(batch, 4, source, source)] * config.encoder_layers
    assert [a.shape for a in output.decoder_attentions] == [(batch, 2, target, target)] * config.decoder_layers
    assert [a.shape for a in output.cross_attentions] == [(batch, 2, target, source)] * config.decoder_layers
    as_tuple = tiny_model()(input_ids=SOURCES, attention_mask=MASK, decoder_input_ids=TARGETS, return_dict=False)
    assert isinstance(as_tuple, tuple) and as_tuple[0].equal(output.logits)


@pytest.mark.parametrize("model_class", [VanillaTransformerForConditionalGeneration, VanillaTransformerModel])
def test_inputs_embeds_give_what_the_input_ids_give(model_class):
    torch.manual_seed(0)
    model = model_class(tiny_config()).eval()
    embed = model.get_input_embeddings()
    from_ids, from_embeds = (
        forward(model),
        forward(
            model,
            input_ids=None,
            decoder_input_ids=None,
            inputs_embeds=embed(SOURCES),
            decoder_inputs_embeds=embed(TARGETS),
        ),
    )
    assert from_ids[0].equal(from_embeds[0])


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("new_size", [120, 80])
def test_resizing_the_vocabulary_resizes_every_table(tmp_path, tied, new_size):
    model = tiny_model(tie_word_embeddings=tied)
    tables = lambda m: (  # noqa: E731
        m.model.encoder.embeddings.embed_tokens,
        m.model.decoder.embeddings.embed_tokens,
        m.lm_head,
    )
    before = [table.weight.detach().clone() for table in tables(model)]
    model.resize_token_embeddings(new_size)
    assert model.config.vocab_size == new_size
    kept = min(new_size, 99)
    for old, table in zip(before, tables(model), strict=True):
        assert table.weight.shape == (new_size, 32) and table.weight[:kept].equal(old[:kept])
    assert (tables(model)[1].weight is tables(model)[0].weight is tables(model)[2].weight) == tied
    highest = torch.tensor([[new_size - 1] * 3, [4, 5, EOS]])
    output = forward(model, decoder_input_ids=highest, labels=highest)
    assert output.logits.shape[-1] == new_size and torch.isfinite(output.loss)
    model.save_pretrained(tmp_path)
    assert forward(
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager"), decoder_input_ids=highest
    ).logits.equal(forward(model, decoder_input_ids=highest).logits)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_attention_implementation_gives_the_eager_result(dtype):
    """sdpa decodes as eager does, greedy and beam search. flex_attention is compared on a forward pass and on a step
    continued from its cache, each shape compiled for itself: on a CPU, torch 2.13's kernel compiled for
    dynamic lengths (after its first recompilation) gets some lengths wrong, now and then, in plain torch as in
    MarianMTModel (docs/design.md), so flex is not compared on a whole generation here."""
    eager = tiny_model(**EQUAL_HEADS).to(dtype)
    tolerance = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    sdpa = copy.deepcopy(eager)
    sdpa.set_attn_implementation("sdpa")
    torch.testing.assert_close(forward(sdpa).logits, forward(eager).logits, **tolerance)
    for num_beams in (1, 4):
        assert generate(sdpa, num_beams=num_beams).equal(generate(eager, num_beams=num_beams))

    flex = copy.deepcopy(eager)
    flex.set_attn_implementation("flex_attention")
    torch.compiler.reset()  # the other dtype's kernels would count against the recompile limit
    # one static kernel per shape; past the limit, torch would fall back to uncompiled flex: an error instead
    with torch.compiler.config.patch(automatic_dynamic_shapes=False, fail_on_recompile_limit_hit=True):
        first = forward(flex, decoder_input_ids=TARGETS[:, :3], use_cache=True)
        step = forward(
            flex,
            encoder_outputs=(first.encoder_last_hidden_state,),
            decoder_input_ids=TARGETS[:, 3:],
            **{CACHE_NAME: cache_of(first)},
        )
    expected = forward(eager).logits
    torch.testing.assert_close(first.logits, expected[:, :3], **tolerance)
    torch.testing.assert_close(step.logits, expected[:, 3:], **tolerance)


def test_head_dim_is_filled_in_as_transformers_configs_do():
    assert VanillaTransformerConfig(d_model=512, encoder_attention_heads=8, decoder_attention_heads=8).head_dim == 64
    assert VanillaTransformerConfig(head_dim=16).head_dim == 16  # Table 3 row (B)
    # no one d_k when the stacks' head counts give different ones: each stack keeps d_model // its heads
    different = tiny_config()
    assert different.head_dim is None
    model = VanillaTransformerForConditionalGeneration(different)
    assert (model.model.encoder.layers[0].self_attn.head_dim, model.model.decoder.layers[0].self_attn.head_dim) == (
        8,
        16,
    )


def test_the_cache_is_transformers_encoder_decoder_cache_in_config_head_dim():
    model = tiny_model(**EQUAL_HEADS)
    cache = cache_of(forward(model, use_cache=True))
    config = model.config
    assert isinstance(cache, EncoderDecoderCache) and len(cache) == config.decoder_layers
    for layer in range(config.decoder_layers):
        assert cache.self_attention_cache.layers[layer].keys.shape == (2, 4, TARGETS.shape[1], config.head_dim)
        assert cache.cross_attention_cache.layers[layer].values.shape == (2, 4, SOURCES.shape[1], config.head_dim)
    assert cache_of(forward(model, use_cache=False)) is None


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_a_generation_continues_from_its_own_cache_as_if_never_stopped(cache_implementation):
    """generate() returns its cache (greedy decoding: transformers' beam search returns the running beams' cache),
    and a call given all the tokens so far, their mask (from which transformers tells how many the cache holds) and
    that cache goes on exactly as one longer call, scores included, over several continuations. The cache is
    checked by continuing from it, not only by its shape."""
    model = tiny_model()
    source = dict(input_ids=SOURCES, attention_mask=MASK, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        whole = model.generate(**source, cache_implementation=cache_implementation, max_new_tokens=9)
        so_far = model.generate(**source, cache_implementation=cache_implementation, max_new_tokens=3)
        scores = list(so_far.scores)
        for _ in range(2):  # 3 + 3 + 3 tokens
            cache = cache_of(so_far)
            assert cache.get_seq_length() == so_far.sequences.shape[1] - 1
            so_far = model.generate(
                **source,
                decoder_input_ids=so_far.sequences,
                decoder_attention_mask=torch.ones_like(so_far.sequences),
                **{CACHE_NAME: cache},
                max_new_tokens=3,
            )
            scores += so_far.scores
    assert so_far.sequences.equal(whole.sequences)
    for continued, at_once in zip(scores, whole.scores, strict=True):
        torch.testing.assert_close(continued, at_once)


def test_the_cache_is_taken_by_either_name_and_the_old_one_warns_where_transformers_deprecated_it():
    """transformers 5.24 renamed `past_key_values` to `cache`; earlier releases of the window pass the old name."""
    model = tiny_model()
    first = forward(model, decoder_input_ids=TARGETS[:, :2], use_cache=True)
    step = dict(encoder_outputs=(first.encoder_last_hidden_state,), decoder_input_ids=TARGETS[:, 2:3])
    new_name = forward(model, **step, cache=copy.deepcopy(cache_of(first)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old_name = forward(model, **step, past_key_values=copy.deepcopy(cache_of(first)))
    warned = any("past_key_values" in str(warning.message) for warning in caught)
    assert warned == (CACHE_NAME == "cache")
    assert old_name.logits.equal(new_name.logits) and cache_of(old_name).get_seq_length() == 3
    torch.testing.assert_close(new_name.logits, forward(model, decoder_input_ids=TARGETS[:, :3]).logits[:, 2:])


def test_generate_from_inputs_embeds_as_from_input_ids():
    model = tiny_model()
    source = SOURCES[:1]  # without padding: no attention mask, as transformers' tests call it
    embeds = model.get_input_embeddings()(source)
    for num_beams in (1, 4):
        expected = generate(model, input_ids=source, attention_mask=None, num_beams=num_beams)
        from_embeds = generate(model, input_ids=None, attention_mask=None, inputs_embeds=embeds, num_beams=num_beams)
        assert from_embeds.equal(expected)


def test_generate_without_a_source_encodes_bos_as_transformers_does():
    model = tiny_model()
    with torch.no_grad():
        assert model.generate(num_beams=1).equal(model.generate(input_ids=torch.tensor([[BOS]]), num_beams=1))


def test_the_decoder_without_the_encoder_output_is_a_clear_error():
    with pytest.raises(ValueError, match=r"attends to the encoder's output .*give encoder_hidden_states"):
        tiny_model().model.decoder(input_ids=TARGETS)


def test_assisted_and_prompt_lookup_decoding_give_greedy_decoding():
    model = tiny_model()
    one = dict(input_ids=SOURCES[:1], attention_mask=MASK[:1], num_beams=1)  # transformers: batch size 1 only
    greedy = generate(model, **one)
    assert generate(model, **one, assistant_model=tiny_model(seed=1)).equal(greedy)
    assert generate(model, **one, prompt_lookup_num_tokens=2).equal(greedy)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_sampling_is_reproducible_under_a_seed(num_beams):
    model = tiny_model()
    torch.manual_seed(3)
    first = generate(model, do_sample=True, num_beams=num_beams, top_k=20)
    torch.manual_seed(3)
    assert generate(model, do_sample=True, num_beams=num_beams, top_k=20).equal(first)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_static_cache_decodes_as_the_dynamic_one(num_beams):
    model = tiny_model()
    assert generate(model, num_beams=num_beams, cache_implementation="static").equal(
        generate(model, num_beams=num_beams)
    )


@pytest.mark.slow
def test_generate_with_a_static_cache_compiles_the_decoding_step_once_and_reuses_it():
    """With a static cache and a compile config, generate() compiles the model's step (one graph: fullgraph) and
    reuses it at every step and in a later, shorter call, decoding as eager does. Compilations are counted by a
    backend that records each graph dynamo hands it and runs it as traced."""
    model = tiny_model(**EQUAL_HEADS)
    graphs = []

    def counting_backend(graph_module, example_inputs, **options):
        graphs.append(graph_module)
        return graph_module.forward

    compile_config = CompileConfig(fullgraph=True, backend=counting_backend)
    # transformers compiles generate() on accelerators only, unless told by this switch, which its own tests use to
    # compile on a CPU; there is no public one
    compile_config._compile_all_devices = True
    static = dict(cache_implementation="static", compile_config=compile_config)
    torch.compiler.reset()
    compiled = generate(model, **static, max_new_tokens=8)
    assert len(graphs) == 1  # the decoding step; transformers runs the first step, the prefill, uncompiled
    assert compiled.equal(generate(model, max_new_tokens=8))
    shorter = generate(model, **static, max_new_tokens=4)  # the cache keeps its size: no new graph
    assert len(graphs) == 1 and shorter.equal(compiled[:, :5])


def test_peft_lora_on_the_attention_projections_trains_saves_and_loads(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    lora = LoraConfig(r=4, target_modules=["q_proj", "kv_proj", "out_proj"], task_type="SEQ_2_SEQ_LM")
    model = get_peft_model(tiny_model(), lora)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    labels = torch.tensor([[20, 21, 22, EOS], [23, 24, EOS, -100]])
    model.train()
    for _ in range(3):
        optimizer.zero_grad()
        model(input_ids=SOURCES, attention_mask=MASK, labels=labels).loss.backward()
        optimizer.step()
    model.eval()
    assert not forward(model).logits.equal(forward(tiny_model()).logits)
    model.save_pretrained(tmp_path)
    reloaded = PeftModel.from_pretrained(tiny_model(), tmp_path).eval()
    assert forward(reloaded).logits.equal(forward(model).logits)
    merged = reloaded.merge_and_unload()
    assert type(merged) is VanillaTransformerForConditionalGeneration
    torch.testing.assert_close(forward(merged).logits, forward(model).logits, atol=1e-5, rtol=1e-5)


def test_device_map_auto_loads_the_same_model(folder):
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, device_map="auto")
    assert {parameter.device.type for parameter in model.parameters()} == {"cpu"}
    assert generate(model).equal(generate(AutoModelForSeq2SeqLM.from_pretrained(folder)))
