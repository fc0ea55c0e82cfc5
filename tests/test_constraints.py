"""Terminology constraints (tools/constraints.py): every hypothesis contains its constraints, the search without
constraints is transformers' beam search, scores are the model's, and the decoder runs once per token."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_vanilla_transformer.model.modeling_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.tools.constraints import constrained_beam_search, constraint_token_ids
from hf_vanilla_transformer.training.tokenizer import train_shared_bpe
from support.models import EOS, PAD, beam_search_example, letter_tokenizer, tiny_model

VOCAB = 30


def short_model(seed: int, margin: int = 4):
    """A tiny model with the paper's beam search and a short length rule (source length + `margin`), so that a
    random model, which seldom ends by itself, decodes few steps."""
    model = tiny_model(seed, vocab_size=VOCAB)
    model.generation_config = paper_generation_config(model.config)
    model.generation_config.max_new_tokens_over_source = margin
    return model


def padded(sources: list[list[int]]) -> dict:
    longest = max(map(len, sources))
    input_ids = torch.tensor([source + [PAD] * (longest - len(source)) for source in sources])
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long()}


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[start : start + len(phrase)] == phrase for start in range(len(tokens)))


def test_a_phrase_has_the_tokens_it_has_inside_a_sentence():
    tokenizer = train_shared_bpe(["Ein Hund läuft im Schnee.", "Der Hund schläft.", "Zwei Hunde spielen."] * 20, 300)
    sentence = tokenizer(text_target="Ein Hund läuft im Schnee.", add_special_tokens=False)["input_ids"]
    phrases = constraint_token_ids(tokenizer, ["Hund", "im Schnee"])
    assert all(contains(sentence, phrase) for phrase in phrases)
    assert tokenizer.convert_ids_to_tokens(phrases[0])[0].startswith("Ġ")
    assert constraint_token_ids(letter_tokenizer(), ["a", "b c"]) == [[4], [5, 6]]


def test_a_phrase_without_tokens_is_refused():
    with pytest.raises(ValueError, match="constraint ' ' has no tokens"):
        constraint_token_ids(letter_tokenizer(), ["a", " "])
    batch = padded([[5, 6, EOS], [7, EOS]])
    with pytest.raises(ValueError, match="sentence 1: a constraint has no tokens"):
        constrained_beam_search(short_model(0), **batch, constraints=[[[5]], [[]]])


def test_constraints_longer_than_the_length_limit_are_refused():
    batch = padded([[5, 6, EOS], [7, EOS]])  # limits: 3 + 4 and 2 + 4 tokens, `</s>` included
    fits = [[[5, 6, 7]], [[8, 9], [10, 11, 12]]]
    assert constrained_beam_search(short_model(0), **batch, constraints=fits).sequences.shape[0] == 2
    with pytest.raises(ValueError, match=r"sentence 1: constraints \[\[8, 9\], \[10, 11, 12, 13\]\] need 6 tokens"):
        constrained_beam_search(short_model(0), **batch, constraints=[[[5]], [[8, 9], [10, 11, 12, 13]]])
    with pytest.raises(ValueError, match=r"sentence 0: constraints \[\[5, 6, 7\]\] need 3 tokens, .* room for 2"):
        constrained_beam_search(short_model(0), **batch, constraints=fits, max_new_tokens=2)


def test_a_special_token_in_a_constraint_is_refused():
    with pytest.raises(ValueError, match=r"sentence 0: constraint \[5, 2\] has a special token"):
        constrained_beam_search(short_model(0), **padded([[5, EOS]]), constraints=[[[5, EOS]]])


def assert_same_search(output, expected, alone: bool) -> None:
    """Token for token; score for score, exactly for a sentence alone, and in a batch up to the last bit: a sentence
    whose search is over leaves our batch, and a product over fewer rows may round differently."""
    assert torch.equal(output.sequences, expected.sequences)
    tolerance = {"rtol": 0.0, "atol": 0.0} if alone else {"rtol": 1e-6, "atol": 0.0}
    torch.testing.assert_close(output.sequences_scores, expected.sequences_scores, **tolerance)


@pytest.mark.parametrize("num_return_sequences", [1, 3])
@pytest.mark.parametrize("texts", [[], ["a b", "c d e f g h i j a b", "j"]])
def test_without_constraints_it_is_generates_beam_search(num_return_sequences, texts):
    model, tokenizer, text, generate_kwargs = beam_search_example()
    batch = tokenizer([text, *texts], return_tensors="pt", padding=True)
    kwargs = {**generate_kwargs, "num_return_sequences": num_return_sequences}
    expected = model.generate(**batch, **kwargs, output_scores=True, return_dict_in_generate=True)
    constraints = [[] for _ in batch["input_ids"]]
    output = constrained_beam_search(model, batch["input_ids"], batch["attention_mask"], constraints, **kwargs)
    assert_same_search(output, expected, alone=not texts)


def test_without_constraints_it_follows_the_generation_config_and_the_length_rule():
    model = short_model(3, margin=2)
    model.generation_config.update(num_beams=5, length_penalty=1.3)
    batch = padded([[5, 6, 7, 8, EOS], [9, EOS], [10, 11, EOS]])
    expected = model.generate(**batch, output_scores=True, return_dict_in_generate=True, num_return_sequences=2)
    output = constrained_beam_search(model, **batch, constraints=[[], [], []], num_return_sequences=2)
    assert_same_search(output, expected, alone=False)


phrase = st.lists(st.integers(4, VOCAB - 1), min_size=1, max_size=3)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 3),
    sources=st.lists(st.lists(st.integers(4, VOCAB - 1), min_size=1, max_size=5), min_size=1, max_size=3),
    constraints=st.lists(st.lists(phrase, min_size=1, max_size=3), min_size=3, max_size=3),
    num_beams=st.integers(1, 5),
    returned=st.integers(1, 5),
)
def test_every_hypothesis_contains_every_constraint(seed, sources, constraints, num_beams, returned):
    returned = min(returned, num_beams)
    constraints = constraints[: len(sources)]
    batch = padded([[*source, EOS] for source in sources])
    # the length rule: source length (with `</s>`) + 4 tokens, the last of them `</s>`
    fits = [sum(map(len, phrases)) <= len(source) + 4 for source, phrases in zip(sources, constraints, strict=True)]

    def run():
        return constrained_beam_search(
            short_model(seed), **batch, constraints=constraints, num_beams=num_beams, num_return_sequences=returned
        )

    if not all(fits):
        with pytest.raises(ValueError, match=f"sentence {fits.index(False)}: constraints"):
            run()
        return
    output = run()
    scores = output.sequences_scores.view(len(sources), returned)
    assert scores[:, 0].isfinite().all()  # the best hypothesis always exists
    for row, tokens in enumerate(output.sequences.tolist()):
        if scores.flatten()[row].isfinite():
            assert all(contains(tokens, phrase) for phrase in constraints[row // returned])
            assert EOS in tokens  # no `max_new_tokens` cut it


def test_scores_are_the_models_log_probabilities():
    model = short_model(1, margin=6)
    batch = padded([[5, 6, 7, EOS], [8, EOS]])
    constraints = [[[9, 10], [11]], [[12, 13, 14]]]
    output = constrained_beam_search(model, **batch, constraints=constraints, num_beams=3, num_return_sequences=2)
    labels = output.sequences[:, 1:]
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"].repeat_interleave(2, 0),
            attention_mask=batch["attention_mask"].repeat_interleave(2, 0),
            decoder_input_ids=output.sequences[:, :-1],
        ).logits
    # the model may write `<pad>` too: a hypothesis ends at its `</s>`
    lengths = (labels == EOS).int().argmax(-1) + 1
    generated = torch.arange(labels.shape[1]) < lengths[:, None]
    forced = torch.log_softmax(logits, -1).gather(2, labels[..., None]).squeeze(-1) * generated
    torch.testing.assert_close(output.token_log_probs, forced)
    torch.testing.assert_close(output.log_prob_sums, forced.sum(-1))
    torch.testing.assert_close(output.sequences_scores, forced.sum(-1) / lengths**0.6)


def test_the_encoder_runs_once_and_the_decoder_reads_one_token_a_step():
    """With the cache, each step feeds the decoder one new token per hypothesis; that the cached steps compute what
    a whole decoder pass computes is test_scores_are_the_models_log_probabilities."""
    model = short_model(2)
    calls = {"encoder": [], "decoder": []}
    hooks = [
        part.register_forward_pre_hook(
            lambda module, args, kwargs, name=name: calls[name].append(kwargs["input_ids"].shape), with_kwargs=True
        )
        for name, part in (("encoder", model.get_encoder()), ("decoder", model.model.decoder))
    ]
    try:
        output = constrained_beam_search(model, **padded([[5, 6, EOS], [7, EOS]]), constraints=[[[8]], [[9, 10]]])
    finally:
        for hook in hooks:
            hook.remove()
    assert calls["encoder"] == [torch.Size([2, 3])]
    assert calls["decoder"][0] == torch.Size([2 * 4, 1])  # the paper's 4 beams per sentence
    assert {length for _, length in calls["decoder"]} == {1}
    assert len(calls["decoder"]) >= output.sequences.shape[1] - 1
