"""sacreBLEU and chrF as one local `evaluate` metric module.

Loading the Hub's own sacrebleu module with `evaluate.load` downloads its script, so it fails offline. This file is an
evaluate metric module of its own (the class below), which `load_translation_metric()` loads from disk:

    metric = load_translation_metric()
    metric.compute(predictions=["Ein Mann schläft."], references=[["Ein Mann schläft."]])
    # {"bleu": 100.0, "chrf": 100.0, "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...", ...}

Scores are sacreBLEU's corpus BLEU and chrF on detokenized, cased text against the raw references, with the
signatures that say exactly how they were computed (Post, 2018). BLEU's tokenization follows the target language as
sacreBLEU's own `BLEU(trg_lang=...)` does: `zh` for Chinese (which has no spaces between words, so `13a` would see
each sentence as a handful of "words"), `ja-mecab` for Japanese, `ko-mecab` for Korean, `13a` otherwise:

    metric.compute(predictions=["我喜欢吃苹果。"], references=[["我喜欢吃苹果。"]], target_language="zh")
    # {"bleu": 100.0, "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:zh|smooth:exp|version:...", ...}

`bleu_tokenize` names a sacreBLEU tokenization instead. chrF works on characters and needs no tokenization.
"""

import re

import datasets
import evaluate
import numpy as np
import sacrebleu

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}
"""

_INPUTS = """
Args:
    predictions (list of str): detokenized system outputs, one per segment.
    references (list of list of str): for each segment, one or more raw references.
    target_language (str, optional): the predictions' language code ("de", "zh", "zh-Hans", "ja", ...); chooses
        BLEU's tokenization as sacreBLEU does.
    bleu_tokenize (str, optional): a sacreBLEU tokenization ("13a", "zh", "intl", "char", ...) instead.
Returns:
    bleu, chrf (float): corpus scores, 0 to 100.
    bleu_signature, chrf_signature (str): sacreBLEU signatures (`tok:` names BLEU's tokenization).
    counts, totals, precisions, bp, sys_len, ref_len: BLEU's details.
"""


# The languages whose BLEU sacreBLEU tokenizes in its own way (`sacrebleu.metrics.BLEU._TOKENIZER_MAP`), and the
# extra each tokenization needs.
LANGUAGE_TOKENIZATIONS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}
ISO_639_3 = {"zho": "zh", "chi": "zh", "cmn": "zh", "yue": "zh", "jpn": "ja", "kor": "ko"}
TOKENIZATION_EXTRAS = {"ja-mecab": "sacrebleu[ja]", "ko-mecab": "sacrebleu[ko]"}


def bleu_tokenization(target_language: str | None = None, bleu_tokenize: str | None = None) -> str:
    """sacreBLEU's tokenization for BLEU on text in `target_language`, or `bleu_tokenize` when given."""
    if bleu_tokenize is not None:
        if bleu_tokenize not in sacrebleu.metrics.BLEU.TOKENIZERS:
            raise ValueError(
                f"bleu_tokenize {bleu_tokenize!r} is not a sacreBLEU tokenization; "
                f"choose one of {', '.join(sorted(sacrebleu.metrics.BLEU.TOKENIZERS))}"
            )
        return bleu_tokenize
    language = re.split(r"[-_]", target_language or "")[0].lower()
    return LANGUAGE_TOKENIZATIONS.get(ISO_639_3.get(language, language), sacrebleu.metrics.BLEU.TOKENIZER_DEFAULT)


def sacrebleu_bleu(tokenization: str) -> sacrebleu.metrics.BLEU:
    """sacreBLEU's BLEU with `tokenization`; a missing optional package is named with the extra that installs it."""
    try:
        return sacrebleu.metrics.BLEU(tokenize=tokenization)
    except (ImportError, RuntimeError) as error:
        extra = TOKENIZATION_EXTRAS.get(tokenization)
        if extra is None:
            raise
        raise ImportError(
            f"BLEU with sacreBLEU's {tokenization} tokenization needs packages that are not installed: "
            f"pip install '{extra}'"
        ) from error


class TranslationMetrics(evaluate.Metric):
    """Corpus sacreBLEU (cased, tokenized for the target language) and chrF, computed with the sacrebleu package."""

    def _info(self):
        return evaluate.MetricInfo(
            description="sacreBLEU and chrF, computed locally with the sacrebleu package.",
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Sequence(datasets.Value("string")),
                }
            ),
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(self, predictions, references, target_language=None, bleu_tokenize=None):
        bleu = sacrebleu_bleu(bleu_tokenization(target_language, bleu_tokenize))
        reference_counts = {len(refs) for refs in references}
        if len(reference_counts) > 1:
            raise ValueError("every prediction needs the same number of references")
        reference_streams = [list(stream) for stream in zip(*references, strict=False)]
        chrf = sacrebleu.metrics.CHRF()
        bleu_score = bleu.corpus_score(predictions, reference_streams)
        chrf_score = chrf.corpus_score(predictions, reference_streams)
        return {
            "bleu": bleu_score.score,
            "chrf": chrf_score.score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
            "counts": bleu_score.counts,
            "totals": bleu_score.totals,
            "precisions": bleu_score.precisions,
            "bp": bleu_score.bp,
            "sys_len": bleu_score.sys_len,
            "ref_len": bleu_score.ref_len,
        }


def load_translation_metric() -> evaluate.EvaluationModule:
    """This module, loaded through `evaluate.load` from its file (no network)."""
    return evaluate.load(__file__)


def decode_generated(generated: np.ndarray, tokenizer) -> list[str]:
    """Detokenized text of `generate()` output as the Trainer returns it (padded with -100 between batches): the text
    `pipeline("translation")` and vanilla-translate give for the same tokens, a leading space included where the first
    token begins a word (sacreBLEU and chrF score it as without)."""
    generated = np.where(generated == -100, tokenizer.pad_token_id, generated)
    return tokenizer.batch_decode(generated, skip_special_tokens=True)


def score_generated(
    generated: np.ndarray, tokenizer, references: list[str], metric, **metric_options
) -> tuple[list[str], dict]:
    """The translations in `generated` and their scores (`metric.compute`) against one raw reference each.

    `metric_options` are `target_language` and `bleu_tokenize`, passed on to the metric.
    """
    predictions = decode_generated(generated, tokenizer)
    return predictions, metric.compute(predictions=predictions, references=[[r] for r in references], **metric_options)


def bleu_and_chrf_against(references: list[str], tokenizer, metric, **metric_options):
    """A Trainer's `compute_metrics`: BLEU and chrF of the generated translations against `references`."""

    def compute_metrics(prediction) -> dict:
        _, scores = score_generated(prediction.predictions, tokenizer, references, metric, **metric_options)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute_metrics
