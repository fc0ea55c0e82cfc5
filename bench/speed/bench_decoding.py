"""Decoding speed: ours against MarianMTModel of the same size, greedy and beam 4, batch 1 and batch 64.

    python -m bench decoding --repetitions 3

Sources are real Multi30k test sentences: all 1,000 (batch 1 can take fewer, --batch1_sentences, for a quicker run).
Both models are untrained and of the same shape, so each is made to produce exactly --new_tokens tokens per
sentence (`min_new_tokens = max_new_tokens`): the work per sentence is equal and the comparison is of speed
alone. Repetitions are interleaved (ours, Marian, ours, ...); medians are reported as sentences per second.
"""

import argparse

import torch

from bench.helpers.common import (
    add_repetitions,
    decode_all,
    interleaved_medians,
    machine,
    marian_like,
    multi30k_sources,
    multi30k_tokenizer,
    source_batches,
    write_results,
)
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--new_tokens", type=int, default=20)
    parser.add_argument("--batch1_sentences", type=int, default=1000)
    add_repetitions(parser, 3)
    args = parser.parse_args()

    tokenizer = multi30k_tokenizer()
    sources = multi30k_sources()
    config = VanillaTransformerConfig.from_preset(args.preset, vocab_size=len(tokenizer))
    torch.manual_seed(0)
    models = {
        "ours": VanillaTransformerForConditionalGeneration(config).eval(),
        "MarianMTModel": marian_like(config).eval(),
    }
    for model in models.values():
        model.set_attn_implementation("sdpa")

    results = {"machine": machine(), "preset": args.preset, "new_tokens": args.new_tokens, "settings": {}}
    print(
        f"{'setting':<22} {'sentences':>9} " + " ".join(f"{name + ' sent/s':>20}" for name in models) + f" {'ratio':>7}"
    )
    for batch_size, sentences in ((1, sources[: args.batch1_sentences]), (64, sources)):
        batches = source_batches(tokenizer, sentences, batch_size)
        for beams in (1, 4):
            generate_kwargs = dict(
                num_beams=beams,
                do_sample=False,
                min_new_tokens=args.new_tokens,
                max_new_tokens=args.new_tokens,
            )
            candidates = {name: decode_all(model, batches[:2], **generate_kwargs) for name, model in models.items()}
            for warm_up in candidates.values():
                warm_up()
            candidates = {name: decode_all(model, batches, **generate_kwargs) for name, model in models.items()}
            medians = interleaved_medians(candidates, args.repetitions)
            rates = {name: len(sentences) / seconds for name, seconds in medians.items()}
            setting = f"{'greedy' if beams == 1 else 'beam 4'}, batch {batch_size}"
            ratio = rates["ours"] / rates["MarianMTModel"]
            results["settings"][setting] = {
                "sentences": len(sentences),
                "sentences_per_second": {name: round(rate, 1) for name, rate in rates.items()},
                "ratio_ours_to_marian": round(ratio, 3),
            }
            print(
                f"{setting:<22} {len(sentences):>9} "
                + " ".join(f"{rate:>20.1f}" for rate in rates.values())
                + f" {ratio:>7.2f}"
            )
    print("wrote", write_results("decoding", results, args.preset))


if __name__ == "__main__":
    main()
