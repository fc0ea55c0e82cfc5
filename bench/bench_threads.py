"""vanilla-translate's --threads on an idle CPU and on one where another job runs: which default is fastest.

    python -m bench.bench_threads --model runs/multi30k-small

Runs `vanilla-translate` (PyTorch path, the model's beam search) on the first 200 Multi30k test sentences with
each candidate, interleaved, median of --repetitions, first with nothing else running, then beside a competing
job: one process per --busy core spinning in pure Python, the way another user's job takes a core. Candidates:
--threads 1 and 2 (torch's intra-op threads), and --threads 2 with OMP_WAIT_POLICY=PASSIVE (OpenMP threads that
sleep at a barrier instead of spinning), which tells spin-waiting from oversubscription. Writes
bench/results/threads.json.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from bench.common import interleaved_medians, machine, multi30k_sources, write_results

CANDIDATES = {
    "threads 1": (["--threads", "1"], {}),
    "threads 2": (["--threads", "2"], {}),
    "threads 2, OMP_WAIT_POLICY=PASSIVE": (["--threads", "2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
}
SPIN = "while True: pass"


def translate(model: str, source: str, flags: list[str], env: dict) -> None:
    command = [shutil.which("vanilla-translate"), "--model", model, "--input", source, "--output", os.devnull,
               "--dtype", "float32", *flags]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env})
    if result.returncode != 0:
        sys.exit(result.stderr[-2000:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/multi30k-small")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--busy", type=int, default=1, help="Cores the competing job takes.")
    args = parser.parse_args()

    results = {"machine": machine(), "model": args.model, "sentences": args.sentences}
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "test.en")
        with open(source, "w", encoding="utf-8") as file:
            file.writelines(line + "\n" for line in multi30k_sources("test")[: args.sentences])
        runs = {name: (lambda f=flags, e=env: translate(args.model, source, f, e))
                for name, (flags, env) in CANDIDATES.items()}  # fmt: skip
        results["idle_seconds"] = interleaved_medians(runs, args.repetitions)
        print("idle", results["idle_seconds"], flush=True)
        competitors = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
        try:
            results[f"busy_{args.busy}_core_seconds"] = interleaved_medians(runs, args.repetitions)
        finally:
            for competitor in competitors:
                competitor.kill()
        print("busy", results[f"busy_{args.busy}_core_seconds"], flush=True)
    print("wrote", write_results("threads", results))


if __name__ == "__main__":
    main()
