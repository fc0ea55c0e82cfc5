"""Where the time goes: torch.profiler over ours and MarianMTModel, training steps or beam-search decoding.

    python -m bench profile_models training --preset small --batches 4
    python -m bench profile_models decoding --preset small --batches 3

`training`: forward + backward + fused Adam on the same Multi30k token-budget batches as
bench_training_step.py. `decoding`: beam 4, batch 64, exactly 20 new tokens per sentence on Multi30k test
sources, as in bench_decoding.py. Prints, for each model, the share of CPU time per kind of operator, then
torch.profiler's table of the costliest operators; the shares go to bench/results/profile_models/DATE_MODE_PRESET.json.
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from bench.helpers.common import (
    PROFILE_CATEGORIES,
    decode_all,
    hf_loss,
    machine,
    marian_like,
    multi30k_batches,
    multi30k_sources,
    source_batches,
    step_function,
    write_results,
)
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def runs(mode: str, preset: str, batch_count: int) -> dict:
    """One callable per model doing the profiled work."""
    torch.manual_seed(0)
    batches, tokenizer = multi30k_batches(batch_count, 2048)
    config = VanillaTransformerConfig.from_preset(preset, vocab_size=len(tokenizer))
    models = {"ours": VanillaTransformerForConditionalGeneration(config), "MarianMTModel": marian_like(config)}
    for model in models.values():
        model.set_attn_implementation("sdpa")
    if mode == "training":
        return {name: step_function(model, batches, hf_loss) for name, model in models.items()}
    batches = source_batches(tokenizer, multi30k_sources()[: 64 * batch_count], 64)
    settings = dict(num_beams=4, do_sample=False, min_new_tokens=20, max_new_tokens=20)
    return {name: decode_all(model.eval(), batches, **settings) for name, model in models.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["training", "decoding"])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()

    results = {"machine": machine(), "mode": args.mode, "preset": args.preset, "batches": args.batches, "models": {}}
    for name, run in runs(args.mode, args.preset, args.batches).items():
        run()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            run()
        events = profiler.key_averages()
        total = sum(event.self_cpu_time_total for event in events)
        shares = {
            category: sum(event.self_cpu_time_total for event in events if matches(event.key)) / total
            for category, matches in PROFILE_CATEGORIES.items()
        }
        shares["everything else"] = 1 - sum(shares.values())
        print(f"\n{name}: {total / 1e3 / args.batches:.0f} ms of CPU time per batch under the profiler")
        for category, share in shares.items():
            print(f"  {category:<32} {share:6.1%}")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=50))
        results["models"][name] = {
            "cpu_ms_per_batch": round(total / 1e3 / args.batches),
            "shares": {category: round(share, 4) for category, share in shares.items()},
        }
    print("wrote", write_results("profile_models", results, f"{args.mode}_{args.preset}"))


if __name__ == "__main__":
    main()
