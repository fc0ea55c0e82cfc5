"""hf_vanilla_transformer.engines.ctranslate2 against our model's engine: n-best lists, prefixes, samples and their
scores, with one convention for the score of a prefix on every route."""

import math

import pytest

from hf_vanilla_transformer.decoding.forced_decoding import score_translations
from hf_vanilla_transformer.decoding.request import Steering
from hf_vanilla_transformer.engines.registry import load_translator, translator_kind
from hf_vanilla_transformer.translation.lines import translate_lines_in_full
from support.steering import SOURCES


def test_ctranslate2_scores_n_best_lists_prefixes_and_samples_as_our_model_does(folders):
    """The same requests on the CTranslate2 export: each hypothesis' tokens and log-probabilities are what our
    model gives the same pair, the prefixes start them, and a seed gives the same samples again."""
    ours, theirs = load_translator(folders["first"], "cpu", "float32"), load_translator(folders["ctranslate2"], "cpu")
    prefixes = ["a", "", "", "j", ""]
    found = translate_lines_in_full(theirs, SOURCES, 8, {}, False, Steering(n_best=2, scores=True, prefixes=prefixes))
    pairs = [(source, h) for source, hs in zip(SOURCES, found, strict=True) if source for h in hs]
    scored = score_translations(ours.model, ours.tokenizer, [s for s, _ in pairs], [h.text for _, h in pairs])
    assert [h.tokens for _, h in pairs] == [ours.tokenizer.convert_ids_to_tokens(s.token_ids) for s in scored]
    assert [h.log_probability for _, h in pairs] == pytest.approx([s.log_probability for s in scored], abs=1e-4)
    for source, prefix, hypotheses in zip(SOURCES, prefixes, found, strict=True):
        assert len(hypotheses) == (2 if source else 1) and all(h.text.startswith(prefix) for h in hypotheses)
    for name in ("first", "ctranslate2"):
        samples = []
        for _ in range(2):  # seeded before the translator starts, as vanilla-translate seeds
            translator_kind([folders[name]]).set_seed(7)
            translator = load_translator(folders[name], "cpu")
            sample = translate_lines_in_full(translator, SOURCES, 8, {"do_sample": True, "num_beams": 1}, False)
            samples.append([[h.text for h in hs] for hs in sample])
        assert samples[0] == samples[1]


def test_every_route_scores_a_prefix_as_part_of_the_translation(folders):
    """One convention for n-best scores: the whole output's log-probability, a prefix's tokens and `</s>` included,
    over its length to the power of the length penalty; CTranslate2's agree with ours on the same hypotheses."""
    prefixes = ["a", "", "", "j", ""]
    steering = Steering(n_best=2, scores=True, prefixes=prefixes)
    for name in ("first", "ctranslate2"):
        translator = load_translator(folders[name], "cpu", "float32" if name == "first" else "auto")
        for hypotheses in translate_lines_in_full(translator, SOURCES, 8, {}, False, steering):
            for hypothesis in hypotheses:
                if hypothesis.tokens:
                    expected = math.fsum(hypothesis.token_log_probs) / len(hypothesis.tokens) ** 0.6
                    assert hypothesis.score == pytest.approx(expected, abs=1e-5)
            assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
