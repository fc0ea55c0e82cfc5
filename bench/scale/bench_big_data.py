"""A big corpus on one machine: run_translation.py's data path against transformers' stock example's
(bench/helpers/stock_data_path.py) on a synthetic corpus made from Multi30k (bench/helpers/make_big_corpus.py), each
run to its first training steps (--max_steps 2): wall time, peak memory, the time each phase began, and the disk the
caches take.

    python -m bench.helpers.make_big_corpus --pairs 2000000 --output big.jsonl
    python -m bench big_data --corpus big.jsonl --work /tmp/big    # ours cold, stock cold, ours warm, stock warm

Ours first trains the 8,000-token BPE on the corpus and caches it; the stock example cannot train one, so it is given
that BPE (its runs then skip the vocabulary step ours takes). "Cold": an empty cache; "warm": the same command
again, on the cache the cold run left. Peak memory is the largest sum of resident memory over the command's
process tree (sampled every 0.2 s; worker processes included; memory-mapped Arrow pages count while mapped), of
its anonymous part (what the processes hold themselves, file pages left out), and of that part shared out among the
processes that share it (pages a worker inherited from the run count once).
`--runs ours` measures ours alone. Writes bench/results/big_data/DATE_<pairs>pairs[_workers<N>].json after each start.
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import psutil

from bench.helpers.common import REPO_ROOT, latest_results, machine, write_results

# the first line of each phase in the command's output (datasets' and our progress bars, the Trainer's)
PHASES = {
    "reading": re.compile(r"Generating train split"),
    "vocabulary": re.compile(r"Learning the BPE from"),
    "tokenizing": re.compile(r"Tokenizing|Running tokenizer"),
    "first step done": re.compile(r"\b1/\d+ \["),
}


def tree_memory(process: psutil.Process) -> tuple[int, int, int]:
    """Resident memory summed over the process tree: (all of it, the anonymous part, the anonymous part shared out).
    The rest is file pages, the memory-mapped Arrow files among them, which the kernel can drop and read again. A
    worker process is a fork, whose anonymous pages are the parent's until either writes them: the plain sum counts
    those twice, the proportional one (the kernel's Pss_Anon) once."""
    total = anonymous = proportional = 0
    for member in [process, *process.children(recursive=True)]:
        with contextlib.suppress(OSError, psutil.NoSuchProcess):  # a worker that ended since it was listed
            with open(f"/proc/{member.pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status)
            with open(f"/proc/{member.pid}/smaps_rollup") as rollup:
                shared_out = dict(line.split(":", 1) for line in rollup if line.startswith("Pss_Anon:"))
            if "VmRSS" in fields:  # not for a process that has ended and not been waited for yet
                total += int(fields["VmRSS"].split()[0]) * 1024
                anonymous += int(fields["RssAnon"].split()[0]) * 1024
                proportional += int(shared_out.get("Pss_Anon", "0 kB").split()[0]) * 1024
    return total, anonymous, proportional


def measured(command: list[str], log: str) -> dict:
    """Run `command` to its end: seconds, peak tree RSS, and when each of PHASES first showed in its output."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    watched, peaks, phases = psutil.Process(process.pid), [0, 0, 0], {}

    def read_output():
        with open(log, "wb") as file:
            for chunk in iter(lambda: process.stdout.read1(65536), b""):
                file.write(chunk)
                text = chunk.decode("utf-8", "replace")
                for phase, pattern in PHASES.items():
                    if phase not in phases and pattern.search(text):
                        phases[phase] = round(time.perf_counter() - start, 1)

    reader = threading.Thread(target=read_output)
    reader.start()
    while process.poll() is None:
        peaks = [max(peak, now) for peak, now in zip(peaks, tree_memory(watched), strict=True)]
        time.sleep(0.2)
    reader.join()
    if process.returncode != 0:
        sys.exit(f"{' '.join(command)} failed; see {log}")
    rss, anonymous, proportional = (round(peak / 2**20) for peak in peaks)
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_mib": rss,
        "peak_anonymous_rss_mib": anonymous,
        "peak_anonymous_pss_mib": proportional,
        "phases": phases,
    }


def disk_mib(folder: str) -> int:
    return round(
        sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names) / 2**20
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="Translation JSON lines (bench/helpers/make_big_corpus.py).")
    parser.add_argument("--work", required=True, help="A folder for the caches and runs (emptied first).")
    parser.add_argument("--runs", choices=["both", "ours"], default="both")
    parser.add_argument(
        "--starts",
        nargs="+",
        choices=["cold", "warm"],
        default=["cold", "warm"],
        help="warm alone: again on the caches an earlier cold start left in --work",
    )
    parser.add_argument("--tokenizer_name", help="A BPE for every run (default: ours trains one, stock takes it).")
    parser.add_argument("--preprocessing_num_workers", type=int)
    parser.add_argument("--vocab_size", default="8000", help="The BPE ours learns (the WMT 2014 recipe's: 37000).")
    args = parser.parse_args()
    if "cold" in args.starts:
        shutil.rmtree(args.work, ignore_errors=True)
        os.makedirs(args.work)
    with open(args.corpus, "rb") as corpus:
        pairs = sum(1 for _ in corpus)
    workers = (
        []
        if args.preprocessing_num_workers is None
        else ["--preprocessing_num_workers", str(args.preprocessing_num_workers)]
    )
    common = ["--train_file", os.path.abspath(args.corpus), "--max_steps", "2", *workers]

    def ours(run: str) -> list[str]:
        given = args.tokenizer_name
        vocabulary = ["--tokenizer_name", given] if given else ["--vocab_size", args.vocab_size]
        return [
            sys.executable,
            "run_translation.py",
            *common,
            "--source_lang",
            "en",
            "--target_lang",
            "de",
            "--preset",
            "small",
            "--do_train",
            *vocabulary,
            "--cache_dir",
            os.path.join(args.work, "ours-cache"),
            "--output_dir",
            os.path.join(args.work, run),
            "--overwrite_output_dir",
            "true",
            "--use_cpu",
            "true",
            "--report_to",
            "none",
        ]

    def stock(run: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench.helpers.stock_data_path",
            *common,
            "--tokenizer_name",
            tokenizer,
            "--cache_dir",
            os.path.join(args.work, "stock-cache"),
            "--output_dir",
            os.path.join(args.work, run),
        ]

    label = f"{pairs}pairs" + (
        "" if args.preprocessing_num_workers is None else f"_workers{args.preprocessing_num_workers}"
    )
    results = {}
    earlier = latest_results("big_data", label)
    if "cold" not in args.starts and earlier is not None:  # warm starts add to the cold ones' file
        with open(earlier) as file:
            results = json.load(file)
    results.update(machine=machine(), pairs=pairs, corpus_mib=round(os.path.getsize(args.corpus) / 2**20))
    tokenizer = args.tokenizer_name or os.path.join(args.work, "ours-cold")  # the BPE ours trains, with its model
    for start in args.starts:
        results[f"ours_{start}"] = measured(ours(f"ours-{start}"), os.path.join(args.work, f"ours-{start}.log"))
        print("ours", start, results[f"ours_{start}"], flush=True)
        if start == "cold":
            results["ours_cache_mib"] = disk_mib(os.path.join(args.work, "ours-cache"))
        if args.runs == "both":
            results[f"stock_{start}"] = measured(stock(f"stock-{start}"), os.path.join(args.work, f"stock-{start}.log"))
            print("stock", start, results[f"stock_{start}"], flush=True)
            if start == "cold":
                results["stock_cache_mib"] = disk_mib(os.path.join(args.work, "stock-cache"))
        path = write_results("big_data", results, label)  # after each start: a long run keeps what it measured
    print(path)


if __name__ == "__main__":
    main()
