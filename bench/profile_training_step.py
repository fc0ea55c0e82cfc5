"""Where a training step's time goes: torch.profiler over ours and MarianMTModel, on the same Multi30k batches.

    python bench/profile_training_step.py --preset small --batches 4

Prints, for each model, the share of the step's CPU time in matrix products, dropout masks, softmax and loss,
the attention kernel and everything else, then torch.profiler's table of the costliest operators; the shares go
to bench/results/profile_training_step_PRESET.json.
"""

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_training_step import hf_loss, marian_like, multi30k_batches, step_function  # noqa: E402
from bench.common import machine, write_results  # noqa: E402
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402

CATEGORIES = {
    "matrix products": lambda name: name in ("aten::mm", "aten::addmm", "aten::bmm"),
    "dropout masks": lambda name: name == "aten::bernoulli_",
    "softmax and loss": lambda name: "log_softmax" in name or "nll_loss" in name,
    "attention kernel": lambda name: "scaled_dot_product" in name,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--max_tokens", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()

    torch.manual_seed(0)
    batches, tokenizer = multi30k_batches(args.batches, args.max_tokens)
    config = VanillaTransformerConfig.from_preset(args.preset, vocab_size=len(tokenizer))
    ours = VanillaTransformerForConditionalGeneration(config)
    ours.set_attn_implementation("sdpa")
    results = {"machine": machine(), "preset": args.preset, "batches": args.batches, "models": {}}
    for name, model in {"ours": ours, "MarianMTModel": marian_like(config)}.items():
        run = step_function(model, batches, hf_loss)
        run()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            run()
        events = profiler.key_averages()
        total = sum(event.self_cpu_time_total for event in events)
        shares = {
            category: sum(event.self_cpu_time_total for event in events if matches(event.key)) / total
            for category, matches in CATEGORIES.items()
        }
        shares["everything else"] = 1 - sum(shares.values())
        print(f"\n{name}: {total / 1e3 / args.batches:.0f} ms of CPU time per batch under the profiler")
        for category, share in shares.items():
            print(f"  {category:<18} {share:6.1%}")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=50))
        results["models"][name] = {
            "cpu_ms_per_batch": round(total / 1e3 / args.batches),
            "shares": {category: round(share, 4) for category, share in shares.items()},
        }
    print("wrote", write_results(f"profile_training_step_{args.preset}", results))


if __name__ == "__main__":
    main()
