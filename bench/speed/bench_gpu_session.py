"""The GPU points in one prepared run: the compiled step against MarianMTModel, the loss, 1,000 WMT-shaped steps.

    python -m bench gpu_session             # on a CUDA machine, ../shared/data beside the repository
    python -m bench gpu_session --device cpu --preset small --steps 20 --pairs 2000 --max_tokens 1024 \\
        --vocab_size 2000 --results cpu_check  # the script itself, where no GPU is lent

In turn, each in a process of its own, stopping at the first that fails:
1. `bench gpu_check --presets base big --max_tokens 25000 --batches 4 --sentences 256 --compile`: training steps of
   ours (eager and compiled) against MarianMTModel as the stock Seq2SeqTrainer computes its loss, interleaved, with
   model FLOPs utilisation against the bf16 matrix rate measured in the same run; and decoding;
2. `bench loss`: the label-smoothed loss alone, ours against transformers' LabelSmoother, on the device;
3. the WMT recipe's settings (recipes/wmt14_en_de_base.yaml: `base`, a 37,000-token BPE, bf16, warmup 4,000, label
   smoothing 0.1) for --steps steps on a synthetic corpus shaped like WMT (--pairs pairs of one to three Multi30k
   sentences, bench/helpers/make_big_corpus.py), the paper's 25,000-token batches in one step on one device, with the
   GPU options of docs/training.md ("On a GPU"): the loss and the steps a second in each window of --window steps.

Writes bench/results/gpu_session/DATE[_LABEL].json with the run's windows and the paths of the other two results.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench.helpers.common import REPO_ROOT, add_results_label, latest_results, machine, write_results

GPU_OPTIONS = ["--torch_compile", "true", "--pad_to_multiple_of", "8", "--logging_nan_inf_filter", "false"]


def run(*command: str) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run([sys.executable, *command], cwd=REPO_ROOT, check=True)


def windows(log_history: list[dict], window: int) -> list[dict]:
    """The loss logged at the end of each window and the window's steps a second (training time only)."""
    logged = [entry for entry in log_history if "loss" in entry and "training_seconds" in entry]
    rows, previous = [], {"step": 0, "training_seconds": 0.0}
    for entry in logged:
        if entry["step"] % window == 0:
            seconds = entry["training_seconds"] - previous["training_seconds"]
            rows.append(
                {
                    "step": entry["step"],
                    "loss": entry["loss"],
                    "steps_per_second": round((entry["step"] - previous["step"]) / seconds, 2),
                }
            )
            previous = entry
    return rows


def wmt_shaped_run(args, folder: str) -> dict:
    corpus = os.path.join(folder, "wmt_like.jsonl")
    run("-m", "bench.helpers.make_big_corpus", "--pairs", str(args.pairs), "--output", corpus)
    output = os.path.join(folder, "run")
    recipe = os.path.join(REPO_ROOT, "recipes", "wmt14_en_de_base.yaml")
    flags = [
        *("--train_file", corpus, "--do_eval", "false", "--do_predict", "false", "--output_dir", output),
        *("--preset", args.preset, "--vocab_size", str(args.vocab_size), "--max_steps", str(args.steps)),
        *("--max_tokens_per_batch", str(args.max_tokens), "--logging_steps", str(args.window)),
        *("--save_strategy", "no", "--average_last_checkpoints", "1"),
        *("--preprocessing_num_workers", str(os.cpu_count()), "--dataloader_num_workers", "4"),
        *(GPU_OPTIONS if args.device == "cuda" else ["--use_cpu", "true", "--bf16", "false"]),
    ]
    run("run_translation.py", recipe, *flags)
    with open(os.path.join(output, "trainer_state.json")) as file:
        rows = windows(json.load(file)["log_history"], args.window)
    rates = [row["steps_per_second"] for row in rows[1:]]  # the first window holds the compilation
    return {
        "command": ["python", "run_translation.py", "recipes/wmt14_en_de_base.yaml", *flags],
        "windows": rows,
        "loss_fell": rows[-1]["loss"] < rows[0]["loss"],
        "steps_per_second_after_the_first_window": {
            "median": statistics.median(rates) if rates else None,
            "lowest": min(rates, default=None),
            "highest": max(rates, default=None),
        },
        "target_tokens_per_step_budget": args.max_tokens,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--parts", nargs="+", default=["check", "loss", "run"], choices=["check", "loss", "run"])
    parser.add_argument("--preset", default="base", help="The WMT-shaped run's model.")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--window", type=int, default=100, help="Steps a window of the run's figures.")
    parser.add_argument("--pairs", type=int, default=500_000, help="Pairs of the synthetic corpus.")
    parser.add_argument("--max_tokens", type=int, default=25000, help="Token budget of a step (the paper's: 25,000).")
    parser.add_argument("--vocab_size", type=int, default=37000)
    add_results_label(parser)
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("python -m bench gpu_session: no CUDA device here; --device cpu checks the script itself")
    results = {"machine": machine(), "parts": {}}
    if "check" in args.parts:
        check = ["--presets", "base", "big", "--max_tokens", "25000", "--batches", "4", "--sentences", "256"]
        run("-m", "bench", "gpu_check", "--device", args.device, *check, "--compile")
        results["parts"]["check"] = latest_results("gpu_check", f"{args.device}_25000_tokens")
    if "loss" in args.parts:
        run("-m", "bench", "loss", "--device", args.device, "--results", args.device)
        results["parts"]["loss"] = latest_results("loss", args.device)
    if "run" in args.parts:
        with tempfile.TemporaryDirectory(prefix="wmt-shaped-") as folder:
            results["parts"]["run"] = wmt_shaped_run(args, folder)
        for row in results["parts"]["run"]["windows"]:
            print(f"step {row['step']:>6}  loss {row['loss']:.3f}  {row['steps_per_second']} steps/s")
    print("wrote", write_results("gpu_session", results, args.results))


if __name__ == "__main__":
    main()
