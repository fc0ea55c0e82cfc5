"""vanilla-translate's --threads on an idle CPU and on one where another job runs: which default is fastest.

    python -m bench threads --model runs/multi30k-small

Runs `vanilla-translate` (PyTorch path, float32, the model's beam search) on the first 500 Multi30k test sentences
with each candidate, interleaved, median of --repetitions (start-up included, about 8 s), with nothing else running
and beside a competing job taking 1 and 2 cores (a process a core, spinning in pure Python). Candidates:
--threads 1 and 2 (torch's intra-op threads), and --threads 2 with OMP_WAIT_POLICY=PASSIVE (OpenMP threads that
sleep at a barrier instead of spinning), which tells spin-waiting from oversubscription. Writes
bench/results/threads/DATE.json.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from bench.helpers.common import add_repetitions, interleaved_medians, machine, multi30k_sources, write_results

CANDIDATES = {
    "threads 1": (["--threads", "1"], {}),
    "threads 2": (["--threads", "2"], {}),
    "threads 2, OMP_WAIT_POLICY=PASSIVE": (["--threads", "2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
}
SPIN = "while True: pass"


def translate(model: str, source: str, flags: list[str], env: dict) -> None:
    command = [
        shutil.which("vanilla-translate"),
        "--model",
        model,
        "--input",
        source,
        "--output",
        os.devnull,
        "--dtype",
        "float32",
        *flags,
    ]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env})
    if result.returncode != 0:
        sys.exit(result.stderr[-2000:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/multi30k-small")
    parser.add_argument("--sentences", type=int, default=500)
    add_repetitions(parser, 2)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="Cores the competing job takes.")
    args = parser.parse_args()

    results = {"machine": machine(), "model": args.model, "sentences": args.sentences, "seconds": {}}
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "test.en")
        with open(source, "w", encoding="utf-8") as file:
            file.writelines(line + "\n" for line in multi30k_sources("test")[: args.sentences])
        runs = {
            name: (lambda f=flags, e=env: translate(args.model, source, f, e))
            for name, (flags, env) in CANDIDATES.items()
        }
        for busy in args.busy:
            competitors = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
            try:
                seconds = interleaved_medians(runs, args.repetitions)
            finally:
                for competitor in competitors:
                    competitor.kill()
            results["seconds"][f"{busy} cores busy"] = {name: round(value, 1) for name, value in seconds.items()}
            print(busy, "cores busy:", results["seconds"][f"{busy} cores busy"], flush=True)
    print("wrote", write_results("threads", results))


if __name__ == "__main__":
    main()
