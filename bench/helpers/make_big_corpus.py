"""A big synthetic translation corpus made from Multi30k, for the data-path benchmarks: each pair is one to three
Multi30k training pairs (chosen at random, with a seed) joined by spaces, English and German alike, written as
translation JSON lines. 2,000,000 pairs make about 544 MB.

    python -m bench.helpers.make_big_corpus --pairs 2000000 --output big.jsonl
"""

import argparse
import json
import os
import random

from tqdm.auto import tqdm

from bench.helpers.common import MULTI30K
from hf_vanilla_transformer.training.data import read_translation_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pairs = list(read_translation_file(os.path.join(MULTI30K, "train.jsonl"), "en", "de"))
    rng = random.Random(args.seed)
    partial = args.output + ".partial"
    with open(partial, "w", encoding="utf-8") as file:
        for _ in tqdm(range(args.pairs), desc="Writing pairs", unit=" pairs", unit_scale=True):
            joined = [pairs[rng.randrange(len(pairs))] for _ in range(rng.randint(1, 3))]
            row = {"en": " ".join(en for en, _ in joined), "de": " ".join(de for _, de in joined)}
            file.write(json.dumps({"translation": row}, ensure_ascii=False) + "\n")
    os.replace(partial, args.output)


if __name__ == "__main__":
    main()
