"""generate(): the standard GenerationMixin strategies, the cache, and the paper's decoding defaults, which hold
under the Trainer's evaluation too."""

import json

import pytest
import torch
from transformers import (
    DataCollatorForSeq2Seq,
    EncoderDecoderCache,
    GenerationConfig,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.modeling_vanilla_transformer import CACHE_NAME, paper_generation_config
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.trainer import TranslationTrainer
from support.models import BOS, EOS, PAD, cache_of, letter_tokenizer, random_token_dataset, tiny_model

SOURCES = torch.tensor([[5, 6, 7, 8, 9, 10, EOS], [11, 12, 13, EOS, PAD, PAD, PAD]])
MASK = (SOURCES != PAD).long()


def new_tokens(sequence: list[int]) -> list[int]:
    """The generated tokens up to and including </s>, without the start token and the padding after."""
    tokens = sequence[1:]
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


def test_a_new_model_decodes_greedily_within_section_6_1s_length_rule_and_the_paper_decoding_is_one_call():
    """A model built from a config decodes as every transformers model does, greedily (transformers' common tests
    rely on it: compiling generate() and continuing from its cache need greedy decoding); run_translation.py
    writes the paper's beam search into every model it trains."""
    model = tiny_model()
    config = model.generation_config
    assert (config.num_beams or 1) == 1 and not config.do_sample  # unset (5.24) or transformers' default (5.16)
    default = model.generate(SOURCES, attention_mask=MASK, max_new_tokens=6)
    assert default.equal(model.generate(SOURCES, attention_mask=MASK, max_new_tokens=6, num_beams=1))
    paper = paper_generation_config(tiny_model().config)
    assert (paper.num_beams, paper.length_penalty) == (4, 0.6)
    assert paper.to_diff_dict() == {**config.to_diff_dict(), "num_beams": 4, "length_penalty": 0.6}
    assert (config.decoder_start_token_id, config.eos_token_id, config.pad_token_id) == (BOS, EOS, PAD)
    assert config.max_new_tokens_over_source == 50  # Section 6.1: input length + 50
    # set, so that transformers' defaults (max_length=20) never fill it in; the positions are the real ceiling
    assert config.max_length == tiny_model().config.max_position_embeddings == 128
    assert config.max_new_tokens is None


@pytest.mark.parametrize("num_beams", [1, 4])
def test_default_length_limit_is_source_length_plus_50(num_beams):
    # An untrained model never chooses </s>, so every output runs to its own limit.
    sequences = tiny_model().generate(SOURCES, attention_mask=MASK, num_beams=num_beams).tolist()
    assert [len(new_tokens(s)) for s in sequences] == [7 + 50, 4 + 50]
    assert all(new_tokens(s)[-1] == EOS for s in sequences)


def test_length_limit_from_encoder_outputs_alone():
    model = tiny_model()
    encoder_outputs = model.get_encoder()(input_ids=SOURCES[:1])
    sequences = model.generate(encoder_outputs=encoder_outputs, num_beams=1).tolist()
    assert len(new_tokens(sequences[0])) == 7 + 50


def test_a_shorter_length_given_by_the_caller_ends_every_sentence_there():
    model = tiny_model()
    assert model.generate(SOURCES, attention_mask=MASK, max_new_tokens=5).shape == (2, 6)
    assert model.generate(SOURCES, attention_mask=MASK, max_length=9).shape == (2, 9)
    assert EOS not in model.generate(SOURCES, attention_mask=MASK, max_new_tokens=5)[:, 1:]  # cut, as transformers does
    model.generation_config.max_new_tokens = 3
    assert model.generate(SOURCES, attention_mask=MASK).shape == (2, 4)


def test_a_longer_length_given_by_the_caller_keeps_each_sentences_own_limit():
    model = tiny_model()
    sequences = model.generate(SOURCES, attention_mask=MASK, num_beams=1, max_new_tokens=100).tolist()
    assert [len(new_tokens(s)) for s in sequences] == [7 + 50, 4 + 50]


@pytest.mark.parametrize("where", ["call", "generation_config argument", "model's generation config"])
def test_the_margin_over_the_source_length_can_be_changed_or_switched_off(where):
    model = tiny_model()

    def generate(margin, max_new_tokens=None):
        settings = dict(num_beams=1, max_new_tokens=max_new_tokens)
        if where == "call":
            kwargs = dict(**settings, max_new_tokens_over_source=margin)
        elif where == "generation_config argument":
            kwargs = dict(generation_config=GenerationConfig(**settings, max_new_tokens_over_source=margin))
        else:
            model.generation_config.max_new_tokens_over_source = margin
            kwargs = settings
        return model.generate(SOURCES, attention_mask=MASK, **kwargs).tolist()

    assert [len(new_tokens(s)) for s in generate(3)] == [7 + 3, 4 + 3]
    switched_off = generate(None, max_new_tokens=70)
    assert [len(new_tokens(s)) for s in switched_off] == [70, 70] and EOS not in switched_off[0]


def test_greedy_equals_argmax_of_teacher_forced_forwards():
    model = tiny_model()
    generated = model.generate(SOURCES, attention_mask=MASK, num_beams=1, max_new_tokens=8)
    decoder_input_ids = torch.full((2, 1), BOS)
    with torch.no_grad():
        for _ in range(8):
            logits = model(input_ids=SOURCES, attention_mask=MASK, decoder_input_ids=decoder_input_ids).logits
            decoder_input_ids = torch.cat([decoder_input_ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert generated.tolist() == decoder_input_ids.tolist()


def test_stepwise_decoding_with_cache_equals_one_teacher_forced_forward():
    model = tiny_model()
    targets = torch.tensor([[BOS, 20, 21, 22, 23, 24], [BOS, 25, 26, 27, 28, 29]])
    with torch.no_grad():
        teacher_forced = model(input_ids=SOURCES, attention_mask=MASK, decoder_input_ids=targets).logits
        encoder_outputs = model.get_encoder()(input_ids=SOURCES, attention_mask=MASK)
        cache, steps = None, []
        for t in range(targets.shape[1]):
            outputs = model(
                encoder_outputs=encoder_outputs,
                attention_mask=MASK,
                decoder_input_ids=targets[:, t : t + 1],
                **{CACHE_NAME: cache},
                use_cache=True,
            )
            cache = cache_of(outputs)
            steps.append(outputs.logits)
    assert isinstance(cache, EncoderDecoderCache) and cache.get_seq_length() == targets.shape[1]
    assert (torch.cat(steps, dim=1) - teacher_forced).abs().max().item() <= 1e-5


def test_cross_attention_keys_and_values_are_computed_once_per_source():
    model = tiny_model()
    calls = {"encoder_attn": 0, "self_attn": 0}

    def count(name):
        return lambda *_: calls.__setitem__(name, calls[name] + 1)

    for layer in model.model.decoder.layers:
        layer.encoder_attn.kv_proj.register_forward_hook(count("encoder_attn"))
        layer.self_attn.kv_proj.register_forward_hook(count("self_attn"))
    model.generate(SOURCES, attention_mask=MASK, num_beams=1, max_new_tokens=6)
    layers = len(model.model.decoder.layers)
    assert calls == {"encoder_attn": layers, "self_attn": 6 * layers}


@pytest.mark.parametrize(
    "strategy",
    [
        dict(num_beams=1),
        dict(num_beams=4),
        dict(num_beams=3, num_return_sequences=2),
        dict(do_sample=True, top_k=10, num_beams=1, num_return_sequences=2),
    ],
)
def test_cache_on_and_off_give_the_same_sequences(strategy):
    model = tiny_model()
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(0)
        outputs.append(model.generate(SOURCES, attention_mask=MASK, max_new_tokens=10, use_cache=use_cache, **strategy))
    assert outputs[0].tolist() == outputs[1].tolist()


def test_sampling_and_multiple_returned_sequences():
    model = tiny_model()

    def sample(seed):
        torch.manual_seed(seed)
        return model.generate(
            SOURCES, attention_mask=MASK, do_sample=True, num_beams=1, num_return_sequences=3, max_new_tokens=6
        )

    first, again, other = sample(1), sample(1), sample(2)
    assert first.shape == (6, 7) and first.tolist() == again.tolist() and first.tolist() != other.tolist()


def test_beam_search_returns_scores_and_ranked_sequences():
    model = tiny_model()
    outputs = model.generate(
        SOURCES,
        attention_mask=MASK,
        num_beams=4,
        num_return_sequences=3,
        max_new_tokens=5,
        return_dict_in_generate=True,
        output_scores=True,
    )
    assert outputs.sequences.shape == (6, 6)
    assert len(outputs.scores) == 5 and outputs.scores[0].shape == (8, 99)
    scores = outputs.sequences_scores.view(2, 3)
    assert torch.all(scores[:, :-1] >= scores[:, 1:])
    assert len({tuple(s) for s in outputs.sequences[:3].tolist()}) == 3


def test_greedy_scores_are_the_log_softmax_of_the_model():
    model = tiny_model()
    outputs = model.generate(
        SOURCES, attention_mask=MASK, num_beams=1, max_new_tokens=3, return_dict_in_generate=True, output_logits=True
    )
    with torch.no_grad():
        logits = model(input_ids=SOURCES, attention_mask=MASK, decoder_input_ids=outputs.sequences[:, :-1]).logits
    torch.testing.assert_close(torch.stack(outputs.logits, dim=1), logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_beams, dtype", [(1, torch.float32), (4, torch.float64)])
def test_a_sentence_decodes_the_same_alone_and_in_a_padded_batch(num_beams, dtype):
    # Beam search runs in float64 here: an untrained model has near-ties that float32 rounding can flip.
    model = tiny_model(seed=4).to(dtype)
    batch = model.generate(SOURCES, attention_mask=MASK, num_beams=num_beams).tolist()
    for row in range(2):
        length = int(MASK[row].sum())
        alone = model.generate(SOURCES[row : row + 1, :length], num_beams=num_beams).tolist()[0]
        assert new_tokens(batch[row]) == new_tokens(alone)


def output_lengths(predictions) -> list[int]:
    """Generated tokens per row, `</s>` included (the start token and the padding after </s> left out)."""
    lengths = []
    for row in predictions.tolist():
        tokens = [t for t in row[1:] if t not in (-100, PAD)]
        lengths.append(tokens.index(EOS) + 1 if EOS in tokens else len(tokens))
    return lengths


@pytest.mark.parametrize(
    "trainer_class, arguments_class",
    [(Seq2SeqTrainer, Seq2SeqTrainingArguments), (TranslationTrainer, TranslationTrainingArguments)],
)
def test_evaluation_keeps_the_length_limit_of_every_batch_and_of_the_saved_model(
    tmp_path, trainer_class, arguments_class
):
    """Seq2SeqTrainer fills the model's unset generation settings with transformers' defaults after its first
    evaluation batch (max_length=20 among them); every later batch, and every later call, must still decode each
    sentence to its source length + 50 tokens. An untrained model never chooses </s>, so each output reaches it.
    """
    model = tiny_model(encoder_layers=1, decoder_layers=1)  # a layer each: the limits are what is tested
    model.generation_config.update(num_beams=1, length_penalty=1.0)  # greedy, likewise
    dataset = random_token_dataset(12, seed=3)
    limits = [len(ids) + 50 for ids in dataset["input_ids"]]
    seen_in_training = []

    def record_lengths(prediction):
        seen_in_training.append(output_lengths(prediction.predictions))
        return {}

    args = arguments_class(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,  # 3 evaluation batches
        max_steps=4,
        learning_rate=0.0,  # the weights stay untrained, so that no output ends before its limit
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="no",
        predict_with_generate=True,
        report_to=[],
        use_cpu=True,
    )
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(letter_tokenizer(), model=model),
        compute_metrics=record_lengths,
    )
    trainer.train()  # evaluates at steps 2 and 4
    assert seen_in_training == [limits, limits]
    for _ in range(2):
        assert output_lengths(trainer.predict(dataset).predictions) == limits
        trainer.evaluate()
        assert seen_in_training[-1] == limits

    trainer.save_model(str(tmp_path / "model"))
    saved = json.loads((tmp_path / "model" / "generation_config.json").read_text())
    assert saved["max_length"] == model.config.max_position_embeddings and saved["max_new_tokens_over_source"] == 50
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path / "model")
    sources = DataCollatorForSeq2Seq(letter_tokenizer())([{"input_ids": ids} for ids in dataset["input_ids"]])
    assert output_lengths(reloaded.generate(**sources)) == limits
