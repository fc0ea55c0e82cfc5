"""Levers of a recipe: its variants trained for the same minutes, seed by seed, side by side, and their validation BLEU.

    python -m bench recipe --recipe recipes/multi30k_small.yaml --minutes 24 --seeds 1 2 \
        --variant "paper=" --variant "dropout 0.3=--config_overrides dropout=0.3"

Each (variant, seed) is `python run_translation.py RECIPE --max_train_minutes MINUTES --seed SEED --output_dir
runs/levers/NAME-seedSEED --do_predict false` followed by the variant's flags (after `=`, as on a command line):
trained, averaged and scored on the validation set as the recipe says, never on the test set, so that a lever is
chosen on validation alone. --parallel runs that many at once, sharing the CPU's cores as torch threads (1: one run
on all of them, as the recipe runs; 2 on 2 cores: one thread each, side by side, so that the load of the machine
hits both alike); the rest wait their turn. A run whose folder holds its scores is read, not rerun.
--match_steps VARIANT trains every other variant's run of a seed for as many steps as VARIANT's run of that seed
made (`--max_steps`; the minutes only cap it, at four times --minutes): for levers that leave a step's cost as it
is, so that the host's speed, which moves between sessions, stays out of the comparison. Equation 3's schedule does
not depend on the step count, and the last checkpoints fall on the same steps, so such a run is the recipe's run
had the host made that many steps in the minutes.
--finished FILE... takes the runs an earlier results file lists (same recipe, variant name, flags and seed) as
finished: a bench goes on from its committed results on a machine that no longer holds their folders.
Writes bench/results/recipe/DATE[_LABEL].json (--results LABEL): for each run its validation BLEU and chrF, its
steps and the minutes it trained; for each variant the mean over seeds and the spread; the CPU.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

from bench.helpers.common import REPO_ROOT, add_results_label, machine, write_results


def variant(text: str) -> tuple[str, list[str]]:
    """'NAME=FLAGS' -> (NAME, the flags split as a shell would)."""
    name, separator, flags = text.partition("=")
    if not separator or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: a variant is NAME=FLAGS (FLAGS may be empty)")
    return name.strip(), shlex.split(flags)


def folder_name(name: str, seed: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9.]+', '-', name).strip('-')}-seed{seed}"


def run_result(output_dir: str) -> dict:
    """What a finished run reports: validation BLEU and chrF (of the averaged model), steps, training minutes."""
    with open(os.path.join(output_dir, "eval_results.json"), encoding="utf-8") as file:
        scores = json.load(file)
    with open(os.path.join(output_dir, "trainer_state.json"), encoding="utf-8") as file:
        state = json.load(file)
    return {
        "validation_bleu": round(scores["eval_bleu"], 2),
        "validation_chrf": round(scores["eval_chrf"], 2),
        "bleu_signature": scores["eval_bleu_signature"],
        "steps": state["global_step"],
        "training_minutes": round(max(entry.get("training_seconds", 0) for entry in state["log_history"]) / 60, 1),
    }


def finished_runs(path: str, recipe: str, minutes: float) -> list[dict]:
    """The runs a results file of this bench lists, if it trained the same recipe for the same minutes."""
    with open(path, encoding="utf-8") as file:
        earlier = json.load(file)
    if (earlier.get("recipe"), earlier.get("minutes")) != (recipe, minutes):
        raise SystemExit(f"{path}: its runs trained {earlier.get('recipe')!r} for {earlier.get('minutes')} minutes")
    return earlier["runs"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=os.path.join(REPO_ROOT, "recipes", "multi30k_small.yaml"))
    parser.add_argument("--minutes", type=float, default=24)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--variant", type=variant, action="append", required=True, help="NAME=FLAGS; repeatable.")
    parser.add_argument("--parallel", type=int, default=2, help="Runs at once, sharing the cores.")
    parser.add_argument("--runs_dir", default=os.path.join(REPO_ROOT, "runs", "levers"))
    add_results_label(parser)
    parser.add_argument("--match_steps", metavar="VARIANT", help="Train the others for this variant's steps.")
    parser.add_argument("--finished", nargs="+", default=[], metavar="FILE", help="Results files whose runs count.")
    args = parser.parse_args(argv)
    if args.match_steps is not None and args.match_steps not in [name for name, _ in args.variant]:
        parser.error(f"--match_steps: {args.match_steps!r} is none of the variants' names")

    def steps_to_match(name: str, seed: int) -> int | None:
        """The steps the run must make (None: the minutes decide), or 0 while its reference has not finished."""
        if args.match_steps is None or name == args.match_steps:
            return None
        reference = [run for run in results if run["variant"] == args.match_steps and run["seed"] == seed]
        return reference[0]["steps"] if reference else 0

    # seed by seed, so that the runs side by side are the variants of one seed; a finished run (its folder holds its
    # validation scores) is read, not run again, so that a bench stopped part way, or given more variants, goes on
    queue, results = [], []
    recipe = os.path.relpath(args.recipe, REPO_ROOT)
    earlier = [run for path in args.finished for run in finished_runs(path, recipe, args.minutes)]
    for seed in args.seeds:
        for name, flags in args.variant:
            output_dir = os.path.join(args.runs_dir, folder_name(name, seed))
            listed = [
                run for run in earlier if (run["variant"], run["flags"], run["seed"]) == (name, shlex.join(flags), seed)
            ]
            if listed:
                results.append(listed[0])
            elif os.path.isfile(os.path.join(output_dir, "eval_results.json")):
                results.append({"variant": name, "flags": shlex.join(flags), "seed": seed, **run_result(output_dir)})
            else:
                queue.append((name, flags, seed))
    running = []
    threads = max(1, len(os.sched_getaffinity(0)) // args.parallel)
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    while queue or running:
        ready = [entry for entry in queue if steps_to_match(entry[0], entry[2]) != 0]
        while ready and len(running) < args.parallel:
            name, flags, seed = ready.pop(0)
            queue.remove((name, flags, seed))
            output_dir = os.path.join(args.runs_dir, folder_name(name, seed))
            steps = steps_to_match(name, seed)
            minutes = args.minutes if steps is None else 4 * args.minutes
            command = [sys.executable, os.path.join(REPO_ROOT, "run_translation.py"), args.recipe]
            command += ["--max_train_minutes", str(minutes), "--seed", str(seed), "--output_dir", output_dir]
            command += ["--do_predict", "false", "--overwrite_output_dir", "true", *flags]
            if steps is not None:
                command += ["--max_steps", str(steps)]
            os.makedirs(args.runs_dir, exist_ok=True)
            log = open(os.path.join(args.runs_dir, f"{folder_name(name, seed)}.log"), "w")  # noqa: SIM115 (closed below)
            print(f"start {name} seed {seed}: {shlex.join(command[1:])}", flush=True)
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=REPO_ROOT)
            running.append((process, log, name, flags, seed, output_dir))
        time.sleep(5)
        for entry in [entry for entry in running if entry[0].poll() is not None]:
            process, log, name, flags, seed, output_dir = entry
            running.remove(entry)
            log.close()
            if process.returncode != 0:
                sys.exit(f"{name} seed {seed} failed (exit status {process.returncode}): see {log.name}")
            results.append({"variant": name, "flags": shlex.join(flags), "seed": seed, **run_result(output_dir)})
            print(json.dumps(results[-1]), flush=True)

    variants = {}
    for name, flags in args.variant:
        bleus = [run["validation_bleu"] for run in results if run["variant"] == name]
        variants[name] = {
            "flags": shlex.join(flags),
            "validation_bleu_mean": round(statistics.mean(bleus), 2),
            "validation_bleu_spread": round(max(bleus) - min(bleus), 2),
        }
    setup = {"recipe": recipe, "minutes": args.minutes, "parallel": args.parallel}
    setup["match_steps"] = args.match_steps
    setup["threads_per_run"] = threads
    path = write_results("recipe", {"machine": machine(), **setup, "variants": variants, "runs": results}, args.results)
    print(f"Wrote {path}")


if __name__ == "__main__":
    main()
