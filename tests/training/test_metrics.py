"""hf_vanilla_transformer.training.metrics: sacreBLEU and chrF as a local `evaluate` module, and scoring generate()
output."""

import importlib.util
import re

import numpy as np
import pytest
import sacrebleu
from transformers import EvalPrediction

from hf_vanilla_transformer.training.metrics import (
    bleu_and_chrf_against,
    bleu_tokenization,
    decode_generated,
    load_translation_metric,
    score_generated,
)
from hf_vanilla_transformer.training.tokenizer import train_shared_bpe
from support.models import letter_tokenizer

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


# Chinese has no spaces: 13a sees each sentence as one "word" (BLEU 0), sacreBLEU's zh tokenization splits characters
CHINESE_REFERENCES = ["我喜欢吃苹果。", "他今天没有去学校，因为他生病了。"]
CHINESE_HYPOTHESES = ["我爱吃苹果。", "他今天没去学校，因为他病了。"]


@pytest.mark.parametrize("target_language", ["zh", "zh-Hans", "zh_TW", "ZH", "cmn"])
def test_chinese_targets_are_scored_with_sacrebleus_zh_tokenization(metric, target_language):
    scores = metric.compute(
        predictions=CHINESE_HYPOTHESES,
        references=[[r] for r in CHINESE_REFERENCES],
        target_language=target_language,
    )
    direct = sacrebleu.metrics.BLEU(tokenize="zh").corpus_score(CHINESE_HYPOTHESES, [CHINESE_REFERENCES])
    assert scores["bleu"] == direct.score == pytest.approx(57.41, abs=0.01)
    # one token per character and per punctuation mark: 6 + 14 in the hypotheses, 7 + 16 in the references
    assert (scores["sys_len"], scores["ref_len"]) == (20, 23)
    assert scores["counts"] == [19, 14, 10, 6]  # only 爱 (for 喜欢) misses among the unigrams
    assert "|tok:zh|" in scores["bleu_signature"]
    assert scores["chrf"] == sacrebleu.corpus_chrf(CHINESE_HYPOTHESES, [CHINESE_REFERENCES]).score


def test_without_a_target_language_chinese_gets_13a_and_bleu_zero(metric):
    scores = metric.compute(predictions=CHINESE_HYPOTHESES, references=[[r] for r in CHINESE_REFERENCES])
    assert scores["bleu"] == 0.0 and (scores["sys_len"], scores["ref_len"]) == (2, 2)
    assert "|tok:13a|" in scores["bleu_signature"]


def test_bleu_tokenize_overrides_the_target_language(metric):
    scores = metric.compute(
        predictions=CHINESE_HYPOTHESES,
        references=[[r] for r in CHINESE_REFERENCES],
        target_language="zh",
        bleu_tokenize="char",
    )
    direct = sacrebleu.metrics.BLEU(tokenize="char").corpus_score(CHINESE_HYPOTHESES, [CHINESE_REFERENCES])
    assert scores["bleu"] == direct.score and "|tok:char|" in scores["bleu_signature"]
    with pytest.raises(ValueError, match=r"bleu_tokenize 'zh-cn' is not a sacreBLEU tokenization; choose one of .*13a"):
        metric.compute(predictions=["a"], references=[["a"]], bleu_tokenize="zh-cn")


@pytest.mark.parametrize(
    ("target_language", "sacrebleu_code", "tokenization"),
    [
        ("de", "de", "13a"),
        ("en", "en", "13a"),
        (None, "", "13a"),
        ("zh", "zh", "zh"),
        ("zh-Hant", "zh", "zh"),
        ("ja", "ja", "ja-mecab"),
        ("jpn", "ja", "ja-mecab"),
        ("ko-KR", "ko", "ko-mecab"),
        ("zu", "zu", "13a"),
    ],
)
def test_tokenization_follows_sacrebleus_choice_for_each_language(target_language, sacrebleu_code, tokenization):
    assert bleu_tokenization(target_language) == tokenization
    # sacreBLEU's own choice for the two-letter code (it knows neither regions, scripts nor three-letter codes)
    assert sacrebleu.metrics.BLEU._TOKENIZER_MAP.get(sacrebleu_code, "13a") == tokenization


@pytest.mark.parametrize(
    ("target_language", "module", "extra"), [("ja", "MeCab", "sacrebleu[ja]"), ("ko", "mecab_ko", "sacrebleu[ko]")]
)
def test_japanese_and_korean_need_mecab_or_say_which_extra_installs_it(metric, target_language, module, extra):
    compute = {"predictions": ["a b"], "references": [["a b"]], "target_language": target_language}
    if importlib.util.find_spec(module) is None:
        message = f"tokenization needs packages that are not installed: pip install '{extra}'"
        with pytest.raises(ImportError, match=re.escape(message)):
            metric.compute(**compute)
    else:
        assert f"|tok:{target_language}-mecab|" in metric.compute(**compute)["bleu_signature"]


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


def test_score_generated_and_compute_metrics_pass_the_target_language_on(metric):
    letters = letter_tokenizer()
    generated = np.array([[0, 4, 6, 2], [0, 9, 2, 1]])  # "a c", "f"
    references = ["a c", "f a"]
    expected = metric.compute(predictions=["a c", "f"], references=[[r] for r in references], bleu_tokenize="char")
    _, scores = score_generated(generated, letters, references, metric, bleu_tokenize="char")
    assert scores == expected and "|tok:char|" in scores["bleu_signature"]
    compute_metrics = bleu_and_chrf_against(references, letters, metric, bleu_tokenize="char")
    assert compute_metrics(EvalPrediction(predictions=generated, label_ids=generated))["bleu"] == expected["bleu"]


def test_decode_generated_gives_the_text_the_pipeline_gives_a_leading_space_and_all():
    """A barely trained model may begin with a token that begins a word: the run's predictions file holds the text
    `pipeline("translation")` and vanilla-translate decode (both `tokenizer.decode`), not a stripped copy of it."""
    tokenizer = train_shared_bpe(["A man sleeps.", "Ein Mann schläft."] * 20, vocab_size=300)
    word = tokenizer.convert_tokens_to_ids("ĠMann")
    generated = np.array([[tokenizer.bos_token_id, word, tokenizer.eos_token_id, -100]])
    assert decode_generated(generated, tokenizer) == [" Mann"]
    assert decode_generated(generated, tokenizer) == [tokenizer.decode([word], skip_special_tokens=True)]
