"""Peak resident memory of one training step at the small and base presets.

    python -m bench.bench_memory --presets small base --max_tokens 2048

Each preset runs in a fresh process (so peaks do not mix): build the model with a 8,000-token vocabulary, take
three training steps (forward, backward, Adam) on Multi30k batches of about --max_tokens tokens, and report the
process's peak RSS (`resource.getrusage`), with the RSS after building the model for reference.
"""

import argparse
import json
import resource
import subprocess
import sys


def measure(preset: str, max_tokens: int) -> dict:
    import torch

    from bench.common import multi30k_batches
    from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    batches, tokenizer = multi30k_batches(3, max_tokens)
    model = VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig.from_preset(preset, vocab_size=len(tokenizer))
    ).train()
    after_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    for batch in batches:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "preset": preset,
        "parameters": model.num_parameters(),
        "max_tokens": max_tokens,
        "peak_rss_mib_after_build": round(after_build / 1024),
        "peak_rss_mib_training": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "base"])
    parser.add_argument("--max_tokens", type=int, default=2048)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.max_tokens)))
        return

    from bench.common import REPO_ROOT, machine, write_results

    rows = []
    for preset in args.presets:
        command = [sys.executable, "-m", "bench.bench_memory", "--child", preset, "--max_tokens", str(args.max_tokens)]
        output = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
        rows.append(json.loads(output.strip().splitlines()[-1]))
    print(f"{'preset':<8} {'parameters':>12} {'RSS after build (MiB)':>22} {'peak RSS training (MiB)':>24}")
    for row in rows:
        print(
            f"{row['preset']:<8} {row['parameters']:>12,} {row['peak_rss_mib_after_build']:>22} "
            f"{row['peak_rss_mib_training']:>24}"
        )
    print("wrote", write_results("memory", {"machine": machine(), "runs": rows}))


if __name__ == "__main__":
    main()
