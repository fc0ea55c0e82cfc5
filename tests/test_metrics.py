"""hf_vanilla_transformer.metrics: sacreBLEU and chrF as a local `evaluate` module, and scoring generate() output."""

import numpy as np
import pytest
import sacrebleu
from transformers import EvalPrediction

from helpers import letter_tokenizer
from hf_vanilla_transformer.metrics import (
    bleu_and_chrf_against,
    decode_generated,
    load_translation_metric,
    score_generated,
)

REFERENCES = ["Ein Mann schläft auf der Bank.", "Zwei Hunde spielen im Schnee."]
HYPOTHESES = ["Ein Mann schläft auf einer Bank.", "Zwei Hunde spielen draußen im Schnee."]


@pytest.fixture(scope="module")
def metric():
    return load_translation_metric()


def test_identical_text_scores_100(metric):
    scores = metric.compute(predictions=REFERENCES, references=[[r] for r in REFERENCES])
    assert scores["bleu"] == pytest.approx(100) and scores["chrf"] == pytest.approx(100)
    assert scores["precisions"] == [100.0] * 4 and scores["bp"] == 1.0
    assert scores["sys_len"] == scores["ref_len"] == 13  # 13a tokenization splits off the final full stops


def test_scores_are_sacrebleus_corpus_bleu_and_chrf(metric):
    scores = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES])
    bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    assert scores["bleu"] == bleu.score and scores["chrf"] == sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score
    assert (scores["counts"], scores["totals"]) == ([12, 8, 4, 1], [14, 12, 10, 8])  # counted by hand
    assert (scores["counts"], scores["totals"], scores["precisions"]) == (bleu.counts, bleu.totals, bleu.precisions)
    assert (scores["bp"], scores["sys_len"], scores["ref_len"]) == (1.0, 14, 13)
    assert scores["bleu"] == pytest.approx(41.11, abs=0.01) and scores["chrf"] == pytest.approx(86.03, abs=0.01)


def test_signatures_say_how_the_scores_were_computed(metric):
    scores = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES])
    version = sacrebleu.__version__
    assert scores["bleu_signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{version}"
    assert scores["chrf_signature"] == f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{version}"


def test_several_references_per_prediction(metric):
    others = ["Ein Mann schläft auf einer Bank.", "Zwei Hunde spielen im Schnee draußen."]
    scores = metric.compute(
        predictions=HYPOTHESES, references=[list(pair) for pair in zip(REFERENCES, others, strict=True)]
    )
    assert scores["bleu"] == sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, others]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES, others]).score
    single = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES])
    assert scores["bleu"] > single["bleu"]  # the first hypothesis is one of the second references
    assert scores["bleu_signature"].startswith("nrefs:2|") and scores["chrf_signature"].startswith("nrefs:2|")


def test_unequal_reference_counts_are_an_error(metric):
    with pytest.raises(ValueError, match="every prediction needs the same number of references"):
        metric.compute(predictions=HYPOTHESES, references=[[REFERENCES[0]], [REFERENCES[1], HYPOTHESES[1]]])


# generate() output as the Trainer gathers it: the start token, letters, </s>, then <pad> or the Trainer's -100
GENERATED = np.array(
    [
        [0, 4, 5, 6, 7, 8, 2, -100, -100],
        [0, 9, 10, 11, 12, 13, 2, 1, 1],
        [0, 6, 2, -100, -100, -100, -100, -100, -100],
    ]
)
TEXTS = ["a b c d e", "f g h i j", "c"]
LETTER_REFERENCES = ["a b c d e", "f g h j i", "c d"]


def test_decode_generated_reads_minus_100_as_padding_and_drops_special_tokens():
    assert decode_generated(GENERATED, letter_tokenizer()) == TEXTS
    assert decode_generated(GENERATED[:, :1], letter_tokenizer()) == ["", "", ""]


def test_score_generated_and_compute_metrics_agree_with_compute(metric):
    expected = metric.compute(predictions=TEXTS, references=[[r] for r in LETTER_REFERENCES])
    assert 0 < expected["bleu"] < 100
    predictions, scores = score_generated(GENERATED, letter_tokenizer(), LETTER_REFERENCES, metric)
    assert predictions == TEXTS and scores == expected
    compute_metrics = bleu_and_chrf_against(LETTER_REFERENCES, letter_tokenizer(), metric)
    assert compute_metrics(EvalPrediction(predictions=GENERATED, label_ids=GENERATED)) == {
        "bleu": expected["bleu"],
        "chrf": expected["chrf"],
    }
