"""Peak memory of `vanilla-translate --n_best N`: one sentence and a default batch, N from 1 to 1,000.

    python -m bench nbest_memory --model runs/multi30k-small

Each run is a fresh process (so peaks do not mix) that translates the first --sentences lines of Multi30k's test
set with `--n_best N --format jsonl` (scores and tokens of every hypothesis, what costs most to keep) and reports its
peak resident memory (`resource.getrusage`) and the seconds it took; the model loaded and nothing translated is the
baseline.
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time

from bench.helpers.common import MULTI30K, in_own_process, machine, write_results


def worker(model: str, sentences: int, n_best: int) -> dict:
    """One `vanilla-translate` run in this process: its peak RSS and seconds."""
    from hf_vanilla_transformer.cli.translate import main
    from hf_vanilla_transformer.training.data import read_translation_file

    sources = [source for source, _ in read_translation_file(os.path.join(MULTI30K, "test.jsonl"), "en", "de")]
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "in.txt")
        with open(source, "w") as file:
            file.write("".join(line + "\n" for line in sources[:sentences]))
        flags = ["--model", model, "--input", source, "--output", os.path.join(folder, "out.jsonl")]
        start = time.perf_counter()
        if n_best:
            main([*flags, "--n_best", str(n_best), "--format", "jsonl"])
        else:  # the baseline: load the model, translate nothing
            from hf_vanilla_transformer.engines.registry import load_translator

            load_translator(model, "cpu")
        seconds = time.perf_counter() - start
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "seconds": round(seconds, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a trained model folder")
    parser.add_argument("--n_best", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--sentences", type=int, nargs="+", default=[1, 32], help="one sentence; a default batch")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))))
        return
    if args.model is None:
        parser.error("the following arguments are required: --model")
    runs = [{"sentences": 0, "n_best": 0, **in_own_process("bench.scale.bench_nbest_memory", args.model, 0, 0)}]
    for sentences in args.sentences:
        for n_best in args.n_best:
            runs.append(
                {
                    "sentences": sentences,
                    "n_best": n_best,
                    **in_own_process("bench.scale.bench_nbest_memory", args.model, sentences, n_best),
                }
            )
            print(runs[-1], file=sys.stderr)
    print("wrote", write_results("nbest_memory", {"machine": machine(), "model": args.model, "runs": runs}))


if __name__ == "__main__":
    main()
