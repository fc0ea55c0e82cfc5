"""The main job's validation BLEU against training time, ours beside the stock Marian recipe: docs/validation_curve.png.

    python run_translation.py recipes/multi30k_small.yaml --eval_strategy steps --eval_steps 400
    python -m bench.stock_marian_translation --data multi30k --source_lang en --target_lang de --eval_steps 450
    python -m bench.plot_validation_curve

Reads the runs' logs, nothing else: each `trainer_state.json` holds a validation BLEU every `--eval_steps` steps
with the training time at that step (`training_seconds`; evaluation does not count towards the time budget, so
both runs train 24 minutes however often they are evaluated). The last point of each curve is the finished model:
ours averaged over its last 5 checkpoints (`all_results.json`), the stock one as it ends (its results file).
Writes the picture and bench/results/validation_curve.json.
"""

import argparse
import json
import os

from bench.common import REPO_ROOT, write_results
from hf_vanilla_transformer.tools.visualize import save_figure


def evaluations(run_folder: str) -> tuple[list[tuple[float, float]], float]:
    """(training minutes, validation BLEU) of every evaluation in the run's log, and the run's training minutes."""
    with open(os.path.join(run_folder, "trainer_state.json"), encoding="utf-8") as file:
        log = json.load(file)["log_history"]
    points = [(entry["training_seconds"] / 60, entry["eval_bleu"]) for entry in log if "eval_bleu" in entry]
    if not points:
        raise ValueError(f"{run_folder}/trainer_state.json: no eval_bleu entries (train with --eval_steps)")
    return points, log[-1]["training_seconds"] / 60


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", default=os.path.join(REPO_ROOT, "runs", "multi30k-small"))
    parser.add_argument("--stock", default=os.path.join(REPO_ROOT, "runs", "stock-marian-multi30k"))
    parser.add_argument(
        "--stock_results", default=os.path.join(REPO_ROOT, "bench", "results", "stock_marian_multi30k.json")
    )
    parser.add_argument("--output", default=os.path.join(REPO_ROOT, "docs", "validation_curve.png"))
    args = parser.parse_args()

    with open(os.path.join(args.ours, "all_results.json"), encoding="utf-8") as file:
        ours_final = json.load(file)["eval_bleu"]
    with open(args.stock_results, encoding="utf-8") as file:
        stock_results = json.load(file)
    (ours, ours_minutes), (stock, stock_minutes) = evaluations(args.ours), evaluations(args.stock)
    curves = {
        "ours (the paper's recipe)": (ours, (ours_minutes, ours_final), "averaged"),
        "stock Marian recipe": (stock, (stock_minutes, stock_results["validation"]["bleu"]), "final"),
    }

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    for (label, (points, final, final_label)), color in zip(curves.items(), ("tab:blue", "tab:orange"), strict=True):
        minutes, bleu = zip(*points, strict=True)
        axes.plot(minutes, bleu, marker="o", color=color, label=label)
        axes.plot([minutes[-1], final[0]], [bleu[-1], final[1]], linestyle=":", color=color)
        axes.plot(*final, marker="*", markersize=14, color=color, linestyle="none")
        axes.annotate(f"{final[1]:.1f} ({final_label})", final, textcoords="offset points", xytext=(-12, 0),
                      ha="right", va="center", color=color)  # fmt: skip
    cpu = stock_results["machine"]["cpu"]
    axes.set_xlabel("training time, minutes (evaluation not counted)")
    axes.set_ylabel("validation BLEU (sacreBLEU, 13a)")
    axes.set_title(f"Multi30k English→German, the same 24 minutes on 2 CPU cores ({cpu})", fontsize=10)
    axes.grid(alpha=0.3)
    axes.set_xlim(left=0)
    highest = max(bleu for points, final, _ in curves.values() for _, bleu in [*points, final])
    axes.set_ylim(0, highest + 4)
    axes.legend(loc="lower right")
    figure.tight_layout()
    save_figure(figure, args.output)
    print("wrote", args.output)
    results = {
        name: {"evaluations": [{"minutes": round(m, 2), "bleu": round(b, 2)} for m, b in points],
               "final": {"minutes": round(final[0], 2), "bleu": round(final[1], 2), "model": final_label}}
        for name, (points, final, final_label) in curves.items()
    }  # fmt: skip
    print("wrote", write_results("validation_curve", {"machine": stock_results["machine"], **results}))


if __name__ == "__main__":
    main()
