"""Words to avoid (decoding/avoid.py): no translation holds them as whole words, however the search spells them, with
greedy decoding, beam search, sampling and constrained beam search; words that merely start with them stay free;
CTranslate2's `suppress_sequences` bars the same forms."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation import LogitsProcessorList

from hf_vanilla_transformer.decoding.avoid import AvoidLogitsProcessor, ctranslate2_suppress_sequences
from hf_vanilla_transformer.decoding.constraints import constrained_beam_search
from hf_vanilla_transformer.decoding.words import encode_phrases, holds
from hf_vanilla_transformer.model.modeling_vanilla_transformer import paper_generation_config
from support.models import german_tokenizer, tiny_model


@pytest.fixture(scope="module")
def german():
    return german_tokenizer()


def ids(tokenizer, *pieces: str) -> list[int]:
    return [t for piece in pieces for t in tokenizer(text_target=piece, add_special_tokens=False)["input_ids"]]


def barred_after(processor, tokenizer, *pieces: str) -> set[str]:
    """The texts of the tokens `processor` bars after the decoder's start and `pieces`."""
    row = torch.tensor([[0, *ids(tokenizer, *pieces)]])
    scores = processor(row, torch.zeros(1, len(processor.words.joins)))
    return {tokenizer.decode([index]) for index in scores[0].isinf().nonzero()[:, 0].tolist()}


def test_a_word_is_barred_wherever_it_would_stand_whole_and_only_there(german):
    tokenizer, words = german
    processor = AvoidLogitsProcessor(tokenizer, ["Hund"], "word", words)
    # written whole, however it is split, it must go on: whatever ends the word is barred, `</s>` too, and what goes
    # on with it ("Hunde") is not
    for pieces in ([" Hund"], [" Hun", "d"], [" H", "u", "n", "d"]):
        after = barred_after(processor, tokenizer, "Der", *pieces)
        assert {".", " im", "</s>"} <= after and "e" not in after, pieces
    assert "d" not in barred_after(processor, tokenizer, "Der", " Hun")
    assert "</s>" not in barred_after(processor, tokenizer, "Der", "Hund")  # "DerHund" is another word
    # at the sentence's start and after an opening quote too
    assert "</s>" in barred_after(processor, tokenizer, "Hund")
    assert "</s>" in barred_after(processor, tokenizer, "Der", " „", "Hund")
    assert "</s>" not in barred_after(processor, tokenizer, "Der", " Hunde")
    # a phrase that ends with no word character is barred at its last piece; a subword anywhere
    quoted = AvoidLogitsProcessor(tokenizer, ["„Hund“"], "word", words)
    assert "“" in barred_after(quoted, tokenizer, "Der", " „", "Hund")
    subword = AvoidLogitsProcessor(tokenizer, ["und"], "subword", words)
    assert "d" in barred_after(subword, tokenizer, "Der", " Hun") and "d" in barred_after(subword, tokenizer, "Hun")


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 3),
    avoid=st.lists(st.sampled_from(["Hund", "im", "Schnee", "Ein", "und", "ä"]), min_size=1, max_size=3),
    decoding=st.sampled_from(
        [{"num_beams": 1}, {"num_beams": 4}, {"num_beams": 1, "do_sample": True}, {"constrained": ["Frau"]}]
    ),
)
def test_no_translation_holds_an_avoided_word(german, seed, avoid, decoding):
    """A random model whose every sentence is steered, by greedy decoding, beam search, sampling or constrained
    beam search: no output holds an avoided word as a whole word."""
    tokenizer, words = german
    model = tiny_model(seed, vocab_size=len(tokenizer))
    model.generation_config = paper_generation_config(model.config)
    model.generation_config.max_new_tokens_over_source = 10
    batch = tokenizer(["Ein Hund im Schnee.", "Hund Hund"], return_tensors="pt", padding=True)
    processors = LogitsProcessorList([AvoidLogitsProcessor(tokenizer, avoid, "word", words)])
    torch.manual_seed(seed)
    if "constrained" in decoding:
        terms = [encode_phrases(tokenizer, decoding["constrained"], "word", words)] * 2
        output = constrained_beam_search(model, **batch, constraints=terms, words=words, logits_processor=processors)
        sequences = output.sequences
    else:
        sequences = model.generate(**batch, logits_processor=processors, **decoding)
    for text in tokenizer.batch_decode(sequences, skip_special_tokens=True):
        assert not any(holds(text, word) for word in avoid), (avoid, text)


def test_ctranslate2_bars_each_form_followed_by_what_ends_the_word(german):
    tokenizer, words = german
    sequences = ctranslate2_suppress_sequences(tokenizer, ["Hund", "„Fußball“"], "word", words)
    endings = {tuple(sequence[:-1]) for sequence in sequences if sequence[0] in ("ĠHund", "H")}
    assert {tuple(tokenizer.convert_ids_to_tokens(form)) for form in (ids(tokenizer, " Hund"),)} <= endings
    hund = [
        sequence for sequence in sequences if sequence[:-1] == tokenizer.convert_ids_to_tokens(ids(tokenizer, " Hund"))
    ]
    assert {"</s>", "."} <= {sequence[-1] for sequence in hund} and "e" not in {sequence[-1] for sequence in hund}
    # a phrase that ends with no word character is barred as its tokens alone
    quoted = tokenizer.convert_ids_to_tokens(ids(tokenizer, "„Fußball“"))
    assert quoted in sequences
