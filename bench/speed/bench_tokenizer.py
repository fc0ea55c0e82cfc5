"""Shared BPE vocabulary: training time on Multi30k train and batch-encoding speed.

    python -m bench tokenizer [--repetitions 7]

Trains the 8,000-token vocabulary on the 58,000 sentences of Multi30k train (both sides), then encodes all of
them in one batch, interleaving two ways of calling the same tokenizer: the `tokenizers` library's own
`Tokenizer.encode_batch` (Rust, all cores) and the transformers call `tokenizer(batch)`, which adds the
conversion of every encoding to Python lists.
"""

import argparse
import os
import time

from bench.helpers.common import MULTI30K, add_repetitions, interleaved_medians, machine, write_results
from hf_vanilla_transformer.training.data import file_sentences
from hf_vanilla_transformer.training.tokenizer import train_shared_bpe


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_repetitions(parser, 7)
    args = parser.parse_args()

    train_file = os.path.join(MULTI30K, "train.jsonl")
    sentences = list(file_sentences([train_file], "en", "de"))
    start = time.perf_counter()
    tokenizer = train_shared_bpe(iter(sentences), vocab_size=8000)
    training_seconds = time.perf_counter() - start

    rust = tokenizer.backend_tokenizer
    medians = interleaved_medians(
        {
            "tokenizers encode_batch": lambda: rust.encode_batch(sentences),
            "transformers tokenizer()": lambda: tokenizer(sentences),
        },
        args.repetitions,
    )
    rates = {name: len(sentences) / seconds for name, seconds in medians.items()}
    results = {
        "machine": machine(),
        "sentences": len(sentences),
        "vocab_size": len(tokenizer),
        "training_seconds": round(training_seconds, 2),
        "encode_sentences_per_second": {name: round(rate) for name, rate in rates.items()},
        "repetitions": args.repetitions,
    }
    print(f"Trained {len(tokenizer)} tokens on {len(sentences)} sentences in {training_seconds:.2f} s")
    print(f"{'batch encoding of ' + str(len(sentences)) + ' sentences':<45} {'sentences/s':>12}")
    for name, rate in rates.items():
        print(f"{name:<45} {rate:>12,.0f}")
    ratio = rates["tokenizers encode_batch"] / rates["transformers tokenizer()"]
    print(f"tokenizers / transformers: {ratio:.2f}x")
    print("wrote", write_results("tokenizer", results))


if __name__ == "__main__":
    main()
