"""Score translation files against a test set, as written and with the punctuation question taken out.

    python -m bench.helpers.compare_translations --data tatoeba-en-zh --target_lang zh \\
        runs/tatoeba-en-zh-small/generated_predictions.txt runs/stock-marian-tatoeba-en-zh/generated_predictions.txt

For each file, one line a test sentence: sacreBLEU (tokenized for the target language) and chrF as written; with
the translations NFKC-normalised (what a model trained on NFKC text writes: "？" becomes "?"); and with
translations and references both NFKC-normalised (a score blind to full-width against ASCII punctuation). Also
counts empty translations, U+FFFD replacement characters (a byte-level model's invalid byte sequences) and the
length ratio, and prints BLEU's brevity penalty and n-gram precisions.
"""

import argparse
import os
import unicodedata

from bench.helpers.common import SHARED_DATA
from hf_vanilla_transformer.training.data import read_translation_file
from hf_vanilla_transformer.training.metrics import bleu_tokenization, load_translation_metric, sacrebleu_bleu


def nfkc(texts: list[str]) -> list[str]:
    return [unicodedata.normalize("NFKC", text) for text in texts]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--data", default="tatoeba-en-zh", help="a folder of ../shared/data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="zh")
    args = parser.parse_args()

    pairs = read_translation_file(
        os.path.join(SHARED_DATA, args.data, f"{args.split}.jsonl"), args.source_lang, args.target_lang
    )
    references = [target for _, target in pairs]
    metric = load_translation_metric()

    def score(predictions, refs) -> str:
        scores = metric.compute(
            predictions=predictions, references=[[r] for r in refs], target_language=args.target_lang
        )
        signature.add(scores["bleu_signature"])
        return f"{scores['bleu']:6.2f} {scores['chrf']:6.2f}"

    def profile(predictions, refs) -> str:
        """Where BLEU goes: the brevity penalty and the 1- to 4-gram precisions."""
        bleu = sacrebleu_bleu(bleu_tokenization(args.target_lang)).corpus_score(predictions, [refs])
        return f"{bleu.bp:5.3f} " + "/".join(f"{p:.1f}" for p in bleu.precisions)

    signature = set()
    print(
        f"{'file':<60} {'BLEU   chrF':>13} {'output NFKC':>13} {'both NFKC':>13} empty  U+FFFD  length"
        "    BP  n-gram precisions"
    )
    for path in args.files:
        with open(path, encoding="utf-8") as file:
            predictions = file.read().split("\n")[: len(references)]
        if len(predictions) != len(references):
            raise SystemExit(f"{path}: {len(predictions)} lines for {len(references)} references")
        length = sum(map(len, predictions)) / sum(map(len, references))
        print(
            f"{path[-60:]:<60} {score(predictions, references):>13} {score(nfkc(predictions), references):>13} "
            f"{score(nfkc(predictions), nfkc(references)):>13} {sum(not p for p in predictions):5d} "
            f"{sum(p.count(chr(0xFFFD)) for p in predictions):7d} {length:7.3f} {profile(predictions, references)}"
        )
    print("BLEU signature:", *signature)


if __name__ == "__main__":
    main()
