"""Word alignments from the encoder-decoder attention (decoding/alignment.py) against eflomal's, on Multi30k en-de.

    OMP_NUM_THREADS=1 python -m bench alignments [--model runs/multi30k-small-seed1]

eflomal (Östling and Tiedemann, 2017; `pip install eflomal`) aligns Multi30k train, validation and test (English
to German, words = whitespace tokens, as `align` counts them) in both directions, and the two are symmetrized with
grow-diag-final-and (Koehn et al., 2003), as eflomal's README does with fast_align's `atools`: that is the
reference. The model reads each reference translation with teacher forcing; every decoder layer, with the mean of
its heads or one head alone, at the positions that predict or that read each target word, by each method (every
target word to its most attended source word, or that and the reverse direction intersected or grown), is scored
against the reference on validation, and the best setting (highest F1) on test2016. With the reference's links
all taken as sure, AER (Och and Ney, 2003) is 1 - F1.
"""

import argparse
import os
import shlex
import sys
import tempfile
import time
from importlib.metadata import version

import torch

from bench.helpers.common import MULTI30K, machine, write_results
from hf_vanilla_transformer.decoding.alignment import (
    METHODS,
    TARGET_POSITIONS,
    grow_diag_final_and,
    most_attended,
    parse_alignment,
    word_attentions,
)
from hf_vanilla_transformer.loading import load_model_and_tokenizer
from hf_vanilla_transformer.training.data import read_translation_file

SPLITS = ("train", "validation", "test")


def eflomal_reference(pairs: dict[str, list[tuple[str, str]]]) -> dict[str, list[set]]:
    """eflomal's symmetrized alignments of validation and test, trained on all three splits together."""
    import eflomal

    everything = [pair for split in SPLITS for pair in pairs[split]]
    with tempfile.TemporaryDirectory() as folder:
        forward_file, reverse_file = os.path.join(folder, "forward"), os.path.join(folder, "reverse")
        eflomal.Aligner().align(
            [source + "\n" for source, _ in everything],
            [target + "\n" for _, target in everything],
            links_filename_fwd=forward_file,
            links_filename_rev=reverse_file,
        )
        with open(forward_file) as forward, open(reverse_file) as reverse:
            links = [
                grow_diag_final_and(set(parse_alignment(f)), set(parse_alignment(r)))
                for f, r in zip(forward, reverse, strict=True)
            ]
    first = len(pairs["train"])
    return {
        "validation": links[first : first + len(pairs["validation"])],
        "test": links[first + len(pairs["validation"]) :],
    }


def agreement(predicted: list[set], reference: list[set]) -> dict[str, float]:
    """Precision, recall, F1 and AER of `predicted` links against `reference` (all sure), over the whole set."""
    both = sum(len(p & r) for p, r in zip(predicted, reference, strict=True))
    predicted_count, reference_count = sum(map(len, predicted)), sum(map(len, reference))
    f1 = 2 * both / (predicted_count + reference_count)
    return {
        "precision": round(both / predicted_count, 4),
        "recall": round(both / reference_count, 4),
        "f1": round(f1, 4),
        "aer": round(1 - f1, 4),
    }


def settings(model) -> list[dict]:
    """Every decoder layer, with its heads' mean (heads None) or one head, at either target position, by each
    method."""
    return [
        {"layer": layer, "heads": heads, "position": position, "method": method}
        for layer in range(model.config.decoder_layers)
        for heads in [None, *range(model.config.decoder_attention_heads)]
        for position in TARGET_POSITIONS
        for method in METHODS
    ]


def alignments(attentions, layer: int, heads: int | None, position: str, method: str) -> list[set]:
    return [set(most_attended(attention.of(layer, heads, position), method)) for attention in attentions]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/multi30k-small-seed1")
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()

    pairs = {
        split: list(read_translation_file(os.path.join(MULTI30K, f"{split}.jsonl"), "en", "de")) for split in SPLITS
    }
    start = time.perf_counter()
    reference = eflomal_reference(pairs)
    eflomal_seconds = time.perf_counter() - start
    print(f"eflomal: {eflomal_seconds:.0f} s")

    model, tokenizer = load_model_and_tokenizer(args.model, device="cpu", attn_implementation="eager")
    attentions = {}
    for split in ("validation", "test"):
        sources, targets = zip(*pairs[split], strict=True)
        attentions[split] = list(word_attentions(model, tokenizer, list(sources), list(targets), args.batch_size))

    validation = [
        {**setting, **agreement(alignments(attentions["validation"], **setting), reference["validation"])}
        for setting in settings(model)
    ]
    best = max(validation, key=lambda row: row["f1"])
    chosen = {name: best[name] for name in ("layer", "heads", "position", "method")}
    test = agreement(alignments(attentions["test"], **chosen), reference["test"])
    for row in validation:
        print(row)
    print("chosen on validation:", chosen, "test2016:", test)

    results = {
        "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} "
        + shlex.join(["python", "-m", "bench", "alignments", *sys.argv[1:]]),
        "machine": machine(),
        "eflomal": version("eflomal"),
        "eflomal_seconds": round(eflomal_seconds),
        "reference": "eflomal (default settings, model 3) en->de and de->en, grow-diag-final-and, trained on "
        "Multi30k train + validation + test",
        "model": args.model,
        "sentences": {split: len(pairs[split]) for split in ("validation", "test")},
        "validation": validation,
        "chosen": chosen,
        "test2016": test,
    }
    print("wrote", write_results("alignments", results))


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    main()
