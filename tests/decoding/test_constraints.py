"""Terminology constraints (decoding/constraints.py): every hypothesis contains its constraints, the search without
constraints is transformers' beam search, scores are the model's, and the decoder runs once per token."""

import functools
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_vanilla_transformer.decoding.constraints import (
    ConstraintTables,
    allocate_beam,
    constrained_beam_search,
    constrained_beams,
    meet_constraints,
)
from hf_vanilla_transformer.decoding.words import TokenWords, encode_phrases, holds
from hf_vanilla_transformer.model.modeling_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.training.tokenizer import train_shared_bpe
from support.models import EOS, PAD, beam_search_example, german_tokenizer, letter_tokenizer, tiny_model

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


def test_a_phrase_has_the_tokens_it_has_inside_a_sentence_and_at_its_start():
    tokenizer = train_shared_bpe(["Ein Hund läuft im Schnee.", "Der Hund schläft.", "Zwei Hunde spielen."] * 20, 300)
    words = TokenWords.of(tokenizer)
    inside = tokenizer(text_target="Der Hund läuft im Schnee.", add_special_tokens=False)["input_ids"]
    first = tokenizer(text_target="Hund läuft.", add_special_tokens=False)["input_ids"]
    hund, schnee = encode_phrases(tokenizer, ["Hund", " im Schnee "], "word", words)
    assert hund.text == "Hund" and schnee.text == "im Schnee"
    spaced, bare = hund.forms
    assert contains(inside, list(spaced)) and first[: len(bare)] == list(bare)
    assert tokenizer.convert_ids_to_tokens(list(spaced))[0].startswith("Ġ")
    # the spaced form stands anywhere; the bare one only where a word may start; both end a word
    assert hund.opens == (False, True) and hund.closes
    assert all(contains(inside, list(form)) for form in schnee.forms[:1])
    letters = encode_phrases(letter_tokenizer(), ["a", "b c"], "word", TokenWords.of(letter_tokenizer()))
    assert [phrase.forms for phrase in letters] == [((4,),), ((5, 6),)]
    assert [phrase.opens for phrase in letters] == [(False,), (False,)]  # a word-level tokenizer: every token a word


def test_a_phrase_without_tokens_is_refused():
    with pytest.raises(ValueError, match="phrase ' ' has no tokens"):
        encode_phrases(letter_tokenizer(), ["a", " "], "subword")
    batch = padded([[5, 6, EOS], [7, EOS]])
    with pytest.raises(ValueError, match="sentence 1: a constraint has no tokens"):
        constrained_beam_search(short_model(0), **batch, constraints=[[[5]], [[]]])


def test_constraints_longer_than_the_length_limit_are_refused():
    batch = padded([[5, 6, EOS], [7, EOS]])  # limits: 3 + 4 and 2 + 4 tokens, `</s>` included
    fits = [[[5, 6, 7]], [[8, 9], [10, 11, 12]]]
    assert constrained_beam_search(short_model(0), **batch, constraints=fits).sequences.shape[0] == 2
    with pytest.raises(ValueError, match=r"sentence 1: constraints \['\[8, 9\]', '\[10, 11, 12, 13\]'\] need 6 tokens"):
        constrained_beam_search(short_model(0), **batch, constraints=[[[5]], [[8, 9], [10, 11, 12, 13]]])
    with pytest.raises(ValueError, match=r"sentence 0: constraints \['\[5, 6, 7\]'\] need 3 tokens, .* room for 2"):
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


@pytest.fixture(scope="module")
def german():
    return german_tokenizer()


def test_a_term_is_met_as_whole_words_wherever_a_word_may_stand(german):
    """As the search reads tokens (`meet_constraints`) and as a reader reads the text (`holds`), whatever tokens
    write it: after a space, as the first word, after an opening quote, before `</s>`; not inside a longer word."""
    tokenizer, words = german
    tables = ConstraintTables.build([encode_phrases(tokenizer, ["Hund"], "word", words)], words, "cpu")

    def met(*pieces: str) -> bool:
        ids = [t for piece in pieces for t in tokenizer(text_target=piece, add_special_tokens=False)["input_ids"]]
        by_search = bool(meet_constraints(tables, torch.tensor([0]), torch.tensor([[*ids, EOS]]))[0])
        assert by_search == holds("".join(pieces), "Hund")
        return by_search

    assert met("Der", " Hund", ".") and met("Der", " Hund")
    assert met("Hund", " bellt", ".") and met("Der", " „", "Hund", "“", ".")
    assert not met("Der", " Hund", "e", ".")  # "Hunde": the word goes on
    assert not met("Der", "Hund", ".")  # "DerHund": the word started before
    assert not met("Der", " Hun", "d", "e")


def test_a_translation_that_already_holds_its_terms_is_left_as_it_was():
    """A beam whose best hypothesis meets the terms returns it: the constrained search's rows are the plain
    search's, token for token and score for score (those that lack a term left out)."""
    model, tokenizer, text, generate_kwargs = beam_search_example()
    batch = tokenizer([text, "j", "d e f"], return_tensors="pt", padding=True)
    kwargs = {**generate_kwargs, "num_return_sequences": 1}
    expected = model.generate(**batch, **kwargs, output_scores=True, return_dict_in_generate=True)
    words = TokenWords.of(tokenizer)
    terms = [[tokenizer.decode(row[1:2])] for row in expected.sequences.tolist()]  # the first word of each
    constraints = [encode_phrases(tokenizer, sentence_terms, "word", words) for sentence_terms in terms]
    output = constrained_beam_search(model, batch["input_ids"], batch["attention_mask"], constraints, words, **kwargs)
    assert_same_search(output, expected, alone=False)


def test_a_sentence_that_lacks_its_terms_is_searched_again_on_a_wider_beam():
    model, tokenizer, text, generate_kwargs = beam_search_example()
    batch = tokenizer([text], return_tensors="pt")
    plain = model.generate(**batch, **generate_kwargs)
    words = TokenWords.of(tokenizer)
    missing = " ".join(
        [letter for letter in "abcdefghij" if tokenizer.convert_tokens_to_ids(letter) not in plain[0]][:2]
    )
    calls = []
    hook = model.model.decoder.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        output = constrained_beam_search(
            model,
            **batch,
            constraints=[encode_phrases(tokenizer, [missing], "word", words)],
            words=words,
            **generate_kwargs,
        )
    finally:
        hook.remove()
    assert holds(tokenizer.decode(output.sequences[0], skip_special_tokens=True), missing)
    # the plain search's 3 beams, then for a term of two tokens a beam of max(3 x 3, 2 + 2) rows
    assert set(calls) == {3, 9} and calls[0] == 3 and calls[-1] == 9
    assert constrained_beams(4, 1) == 12 and constrained_beams(4, 15) == 17


def test_the_beam_always_keeps_a_hypothesis_that_has_begun_no_term():
    """Dynamic beam allocation with fewer beams than banks: the bank of hypotheses that have met nothing is served
    first in each round, so a term need not start at once; then the most advanced bank."""
    banks = torch.tensor([[3, 3, 2, 2, 1, 0, 0, 3]])
    chosen = allocate_beam(banks, torch.ones_like(banks, dtype=torch.bool), beams=2, most=3)
    assert chosen.tolist() == [[5, 0]]
    chosen = allocate_beam(banks, torch.ones_like(banks, dtype=torch.bool), beams=5, most=3)
    assert chosen.tolist() == [[5, 0, 2, 4, 6]]


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 3),
    sentence=st.lists(st.sampled_from(["A", "dog", "runs", "in", "the", "snow", "."]), min_size=1, max_size=6),
    terms=st.lists(st.sampled_from(["Hund", "Schnee", "im Park", "Ein", "Fußball", "Hunde"]), min_size=1, max_size=2),
    match=st.sampled_from(["word", "subword"]),
    returned=st.integers(1, 2),
)
def test_every_hypothesis_holds_each_term_as_whole_words_and_starts_with_no_space(
    german, seed, sentence, terms, match, returned
):
    tokenizer, words = german
    model = tiny_model(seed, vocab_size=len(tokenizer))
    model.generation_config = paper_generation_config(model.config)
    model.generation_config.max_new_tokens_over_source = 12
    batch = tokenizer([" ".join(sentence)], return_tensors="pt")
    constraints = [encode_phrases(tokenizer, list(dict.fromkeys(terms)), match, words)]
    output = constrained_beam_search(
        model, **batch, constraints=constraints, words=words, num_return_sequences=returned
    )
    plain = tokenizer.batch_decode(model.generate(**batch, num_return_sequences=returned), skip_special_tokens=True)
    assert output.found[0]
    rows = tokenizer.batch_decode(output.sequences, skip_special_tokens=True)
    for row, found in zip(rows, output.found.tolist(), strict=True):
        if found:
            assert all(holds(row, term, match) for term in terms), row
            # what the model's own search wrote stays as it was; the constrained search starts with no space
            assert row in plain or not row[:1].isspace(), row


def test_with_one_beam_the_search_without_constraints_is_greedy_search():
    model, tokenizer, text, _ = beam_search_example()
    batch = tokenizer([text, "j", "d e f", "a a a"], return_tensors="pt", padding=True)
    expected = model.generate(**batch, num_beams=1, max_new_tokens=8)
    output = constrained_beam_search(model, **batch, constraints=[[], [], [], []], num_beams=1, max_new_tokens=8)
    decode = functools.partial(tokenizer.batch_decode, skip_special_tokens=True)
    assert decode(output.sequences) == decode(expected)


@pytest.fixture(scope="module")
def trained_translator(trained_run):
    """The trained run's model as vanilla-translate loads it, in float32, and 40 test2016 pairs."""
    from hf_vanilla_transformer.engines.registry import load_translator
    from hf_vanilla_transformer.training.data import read_translation_file
    from support.paths import TEST

    pairs = list(read_translation_file(TEST, "en", "de"))[:40]
    return load_translator(str(trained_run.output), "cpu", "float32"), pairs


def translations(translator, sources: list[str], terms: list[list[str]] | None = None, **decoding) -> list[str]:
    from hf_vanilla_transformer.decoding.request import Steering
    from hf_vanilla_transformer.translation.lines import translate_lines_in_full

    steering = Steering(constraints=terms)
    return [found[0].text for found in translate_lines_in_full(translator, sources, 8, decoding, False, steering)]


def test_the_trained_model_places_reference_words_inside_its_sentences(trained_translator):
    """Terms from the reference that the translation lacks (as bench constraints picks them): each translation holds
    them as whole words, starts with no space and says nothing after its sentence's end that the translation without
    them did not; a line without terms keeps its translation."""
    translator, pairs = trained_translator
    sources = [source for source, _ in pairs]
    plain = translations(translator, sources)
    terms = [
        [word for word in reference.rstrip(".").split() if len(word) >= 4 and not holds(text, word)][-2:][: 1 + i % 2]
        for i, ((_, reference), text) in enumerate(zip(pairs, plain, strict=True))
    ]
    steered = translations(translator, sources, terms)
    ends_then_goes_on = re.compile(r"[.!?]\s+\S")
    for text, before, line_terms in zip(steered, plain, terms, strict=True):
        assert all(holds(text, term) for term in line_terms), (line_terms, text)
        assert not text[:1].isspace(), text
        assert not ends_then_goes_on.search(text) or ends_then_goes_on.search(before), (line_terms, text)
        if not line_terms:
            assert text == before


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_term_placed_first_starts_the_sentence_with_no_space(trained_translator, num_beams):
    """The issue's `["Ein"]` for "A dog runs in the snow.", and each reference's first word as a term: the bare
    spelling at the sentence's start, no stray space, with greedy decoding and beam search."""
    translator, pairs = trained_translator
    sources = [source for source, _ in pairs]
    terms = [[reference.split()[0]] for _, reference in pairs]
    for text, (term,) in zip(translations(translator, sources, terms, num_beams=num_beams), terms, strict=True):
        assert holds(text, term) and not text[:1].isspace(), (term, text)
    (text,) = translations(translator, ["A dog runs in the snow."], [["Ein"]], num_beams=num_beams)
    assert text.startswith("Ein ") and not any(word.startswith("Ein") and word != "Ein" for word in text.split()[1:])


def test_terms_the_trained_models_translation_already_holds_leave_it_as_it_was(trained_translator):
    translator, pairs = trained_translator
    sources = [source for source, _ in pairs]
    plain = translations(translator, sources)
    terms = [[max(text.rstrip(".").split(), key=len)] for text in plain]  # each translation's longest word
    assert translations(translator, sources, terms) == plain
