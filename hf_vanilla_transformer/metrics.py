"""sacreBLEU and chrF as one local `evaluate` metric module.

Loading the Hub's own sacrebleu module with `evaluate.load` downloads its script, so it fails offline. This file is an
evaluate metric module of its own (the class below), which `load_translation_metric()` loads from disk:

    metric = load_translation_metric()
    metric.compute(predictions=["Ein Mann schläft."], references=[["Ein Mann schläft."]])
    # {"bleu": 100.0, "chrf": 100.0, "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...", ...}

Scores are sacreBLEU's corpus BLEU and chrF on detokenized, cased text against the raw references, with the
signatures that say exactly how they were computed (Post, 2018).
"""

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
Returns:
    bleu, chrf (float): corpus scores, 0 to 100.
    bleu_signature, chrf_signature (str): sacreBLEU signatures.
    counts, totals, precisions, bp, sys_len, ref_len: BLEU's details.
"""


class TranslationMetrics(evaluate.Metric):
    """Corpus sacreBLEU (13a tokenization, cased) and chrF, computed with the sacrebleu package."""

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

    def _compute(self, predictions, references):
        reference_counts = {len(refs) for refs in references}
        if len(reference_counts) > 1:
            raise ValueError("every prediction needs the same number of references")
        reference_streams = [list(stream) for stream in zip(*references, strict=False)]
        bleu = sacrebleu.metrics.BLEU()
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
    """Detokenized text of `generate()` output as the Trainer returns it (padded with -100 between batches)."""
    generated = np.where(generated == -100, tokenizer.pad_token_id, generated)
    return [text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True)]


def score_generated(generated: np.ndarray, tokenizer, references: list[str], metric) -> tuple[list[str], dict]:
    """The translations in `generated` and their scores (`metric.compute`) against one raw reference each."""
    predictions = decode_generated(generated, tokenizer)
    return predictions, metric.compute(predictions=predictions, references=[[r] for r in references])


def bleu_and_chrf_against(references: list[str], tokenizer, metric):
    """A Trainer's `compute_metrics`: BLEU and chrF of the generated translations against `references`."""

    def compute_metrics(prediction) -> dict:
        _, scores = score_generated(prediction.predictions, tokenizer, references, metric)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute_metrics
