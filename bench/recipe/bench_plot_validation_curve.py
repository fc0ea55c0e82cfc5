"""The main job's validation BLEU against training time, beside the stock Marian recipe or another recipe of ours.

    python run_translation.py recipes/multi30k_small.yaml --eval_strategy steps --eval_steps 400
    python -m bench stock_marian_translation --data multi30k --source_lang en --target_lang de --eval_steps 450
    python -m bench plot_validation_curve                             # docs/validation_curve.png

    python -m bench plot_validation_curve --stock "" --results recipe_curves --output docs/recipe_curves.png \
        --ours "the recipe before=runs/before" "the recipe=runs/multi30k-small"     # two recipes of ours

Reads the runs' logs, nothing else: each `trainer_state.json` holds a validation BLEU every `--eval_steps` steps
with the training time at that step (`training_seconds`; evaluation does not count towards the time budget, so
every run trains 24 minutes however often it is evaluated). The last point of each curve is the finished model:
ours averaged over its last checkpoints (`all_results.json`), the stock one as it ends (its results file).
Writes the picture and bench/results/plot_validation_curve/DATE[_LABEL].json (--results LABEL).
"""

import argparse
import json
import os

from bench.helpers.common import REPO_ROOT, add_results_label, latest_results, machine, write_results
from hf_vanilla_transformer.inspection.pictures import save_figure


def evaluations(run_folder: str) -> tuple[list[tuple[float, float]], float]:
    """(training minutes, validation BLEU) of every evaluation in the run's log, and the run's training minutes."""
    with open(os.path.join(run_folder, "trainer_state.json"), encoding="utf-8") as file:
        log = json.load(file)["log_history"]
    points = [(entry["training_seconds"] / 60, entry["eval_bleu"]) for entry in log if "eval_bleu" in entry]
    if not points:
        raise ValueError(f"{run_folder}/trainer_state.json: no eval_bleu entries (train with --eval_steps)")
    return points, log[-1]["training_seconds"] / 60


def labelled_folder(text: str) -> tuple[str, str]:
    """'LABEL=FOLDER' -> (LABEL, FOLDER)."""
    label, separator, folder = text.partition("=")
    if not separator or not label or not folder:
        raise argparse.ArgumentTypeError(f"{text!r}: give LABEL=FOLDER")
    return label, folder


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ours = f"ours (the paper's recipe)={os.path.join(REPO_ROOT, 'runs', 'multi30k-small')}"
    parser.add_argument("--ours", type=labelled_folder, nargs="+", default=[labelled_folder(ours)])
    stock_help = "The stock Marian run's folder; an empty string leaves it out."
    parser.add_argument("--stock", default=os.path.join(REPO_ROOT, "runs", "stock-marian-multi30k"), help=stock_help)
    parser.add_argument("--stock_results", default=latest_results("stock_marian_translation", "multi30k"))
    parser.add_argument("--output", default=os.path.join(REPO_ROOT, "docs", "validation_curve.png"))
    add_results_label(parser)
    args = parser.parse_args()

    curves = {}
    for label, folder in args.ours:
        with open(os.path.join(folder, "all_results.json"), encoding="utf-8") as file:
            final = json.load(file)["eval_bleu"]
        points, minutes = evaluations(folder)
        curves[label] = (points, (minutes, final), "averaged")
    machine_info = machine()
    if args.stock:
        with open(args.stock_results, encoding="utf-8") as file:
            stock_results = json.load(file)
        stock, stock_minutes = evaluations(args.stock)
        curves["stock Marian recipe"] = (stock, (stock_minutes, stock_results["validation"]["bleu"]), "final")
        machine_info = stock_results["machine"]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    best_final = max(final[1] for _, final, _ in curves.values())
    for (label, (points, final, final_label)), color in zip(curves.items(), colors, strict=False):
        minutes, bleu = zip(*points, strict=True)
        axes.plot(minutes, bleu, marker="o", color=color, label=label)
        axes.plot([minutes[-1], final[0]], [bleu[-1], final[1]], linestyle=":", color=color)
        axes.plot(*final, marker="*", markersize=14, color=color, linestyle="none")
        # the best final score's label above its star, the others' below, so that close finishes stay legible
        rise = 8 if final[1] == best_final else -8
        where = {"textcoords": "offset points", "xytext": (-12, rise), "ha": "right", "va": "center"}
        axes.annotate(f"{final[1]:.1f} ({final_label})", final, color=color, **where)
    axes.set_xlabel("training time, minutes (evaluation not counted)")
    axes.set_ylabel("validation BLEU (sacreBLEU, 13a)")
    title = f"Multi30k English→German, the same 24 minutes on 2 CPU cores ({machine_info['cpu']})"
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.set_xlim(left=0)
    highest = max(bleu for points, final, _ in curves.values() for _, bleu in [*points, final])
    axes.set_ylim(0, highest + 4)
    axes.legend(loc="lower right")
    figure.tight_layout()
    save_figure(figure, args.output)
    print("wrote", args.output)
    results = {
        name: {
            "evaluations": [{"minutes": round(m, 2), "bleu": round(b, 2)} for m, b in points],
            "final": {"minutes": round(final[0], 2), "bleu": round(final[1], 2), "model": final_label},
        }
        for name, (points, final, final_label) in curves.items()
    }
    print("wrote", write_results("plot_validation_curve", {"machine": machine_info, **results}, args.results))


if __name__ == "__main__":
    main()
