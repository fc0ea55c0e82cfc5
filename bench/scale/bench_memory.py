"""Peak resident memory of a training step at the small and base presets, with and without gradient checkpointing.

    python -m bench memory --presets small base --max_tokens 2048

Each run is a fresh process (so peaks do not mix): build the model with an 8,000-token vocabulary, take three
training steps (forward, backward, Adam) on Multi30k batches of about --max_tokens tokens, and report the process's
peak RSS (`resource.getrusage`), the RSS after building the model for reference, and the bytes the step's forward
saves for its backward (counted by `torch.autograd.graph.saved_tensors_hooks`): what gradient checkpointing is for.
With it (transformers' `gradient_checkpointing_enable`), each layer keeps only its inputs and runs its forward again
in the backward pass.
"""

import argparse
import json
import resource
import subprocess
import sys


def measure(preset: str, max_tokens: int, checkpointing: bool) -> dict:
    import time

    import torch

    from bench.helpers.common import bytes_saved_for_backward, multi30k_batches
    from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    batches, tokenizer = multi30k_batches(3, max_tokens)
    model = VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig.from_preset(preset, vocab_size=len(tokenizer))
    ).train()
    if checkpointing:  # the release's public name (5.24 added activation_checkpointing_enable)
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    after_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    saved, seconds = [], []

    for batch in batches:
        start = time.perf_counter()
        loss, kept = bytes_saved_for_backward(lambda batch=batch: model(**batch).loss)
        saved.append(kept)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
    return {
        "preset": preset,
        "gradient_checkpointing": checkpointing,
        "parameters": model.num_parameters(),
        "max_tokens": max_tokens,
        "peak_rss_mib_after_build": round(after_build / 1024),
        "peak_rss_mib_training": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "saved_for_backward_mib": round(max(saved) / 2**20, 1),
        "step_seconds_median": round(sorted(seconds)[1], 2),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "base"])
    parser.add_argument("--max_tokens", type=int, default=2048)
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        preset, checkpointing = args.child
        print(json.dumps(measure(preset, args.max_tokens, checkpointing == "on")))
        return

    from bench.helpers.common import REPO_ROOT, machine, write_results

    rows = []
    for preset in args.presets:
        for checkpointing in ("off", "on"):
            command = [
                sys.executable,
                "-m",
                "bench.scale.bench_memory",
                "--child",
                preset,
                checkpointing,
                "--max_tokens",
                str(args.max_tokens),
            ]
            output = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
            rows.append(json.loads(output.strip().splitlines()[-1]))
    print(
        f"{'preset':<8} {'checkpointing':>13} {'parameters':>12} {'RSS built':>10} {'peak RSS':>9} "
        f"{'saved for backward':>19} {'step s':>7}"
    )
    for row in rows:
        print(
            f"{row['preset']:<8} {'on' if row['gradient_checkpointing'] else 'off':>13} {row['parameters']:>12,} "
            f"{row['peak_rss_mib_after_build']:>10} {row['peak_rss_mib_training']:>9} "
            f"{row['saved_for_backward_mib']:>15} MiB {row['step_seconds_median']:>7}"
        )
    print("wrote", write_results("memory", {"machine": machine(), "runs": rows}))


if __name__ == "__main__":
    main()
