"""The Marian export translates the test set as our model does: the same BLEU, sentence for sentence.

    python -m bench marian_export --model runs/multi30k-small

Exports the folder with `vanilla-export-marian`, translates the Multi30k test set with each folder through
`vanilla-translate`'s code (float32, each model's own decoding from its generation config), and scores both with
sacreBLEU and chrF. Writes bench/results/marian_export/DATE.json.
"""

import argparse
import os
import tempfile

import torch

from bench.helpers.common import MULTI30K, machine, write_results
from hf_vanilla_transformer.engines.generate import ModelTranslator
from hf_vanilla_transformer.export.marian import export
from hf_vanilla_transformer.training.data import read_translation_file
from hf_vanilla_transformer.training.metrics import load_translation_metric
from hf_vanilla_transformer.translation.lines import translate_lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/multi30k-small")
    parser.add_argument("--limit", type=int, default=None, help="Only the first N test sentences.")
    args = parser.parse_args()

    pairs = list(read_translation_file(os.path.join(MULTI30K, "test.jsonl"), "en", "de"))[: args.limit]
    sources, references = [source for source, _ in pairs], [[target] for _, target in pairs]
    metric = load_translation_metric()
    with tempfile.TemporaryDirectory() as folder:
        marian = export(args.model, os.path.join(folder, "marian"))
        outputs = {
            name: translate_lines(ModelTranslator(path, "cpu", torch.float32), sources, 32, {}, show_progress=True)
            for name, path in (("ours", args.model), ("marian_export", marian))
        }
    scores = {}
    for name, output in outputs.items():
        score = metric.compute(predictions=output, references=references, target_language="de")
        scores[name] = {key: score[key] for key in ("bleu", "chrf", "bleu_signature", "chrf_signature")}
    identical = sum(a == b for a, b in zip(outputs["ours"], outputs["marian_export"], strict=True))
    results = {
        "machine": machine(),
        "model": args.model,
        "sentences": len(sources),
        "identical_translations": identical,
        **scores,
    }
    print(results)
    print("wrote", write_results("marian_export", results))


if __name__ == "__main__":
    main()
