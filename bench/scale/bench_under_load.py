"""Under load: vanilla-translate on many generated lines (lines/s, peak memory), and the demo answering 100
concurrent requests over loopback (all answered, each equal to its sequential answer, wall time).

    python -m bench under_load --model runs/multi30k-small

Lines are Multi30k's first 2,000 English training sources, repeated, so that every count holds the same sentences
(the same longest batch) and the growth of peak memory between counts is what the extra lines cost. Decoding is
greedy (--num_beams 1) so that the figure is the command's own throughput, not beam search's. Writes
bench/results/under_load/DATE.json.
"""

import argparse
import hashlib
import itertools
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench.helpers.common import REPO_ROOT, machine, multi30k_sources, run_with_peak_rss, write_results


def translate_lines_figures(model: str, counts: list[int], batch_size: int) -> list[dict]:
    sources = multi30k_sources("train")[:2000]
    figures = []
    with tempfile.TemporaryDirectory() as folder:
        for count in counts:
            source = os.path.join(folder, f"{count}.en")
            with open(source, "w", encoding="utf-8") as file:
                file.writelines(line + "\n" for line in itertools.islice(itertools.cycle(sources), count))
            output = os.path.join(folder, f"{count}.de")
            command = [
                shutil.which("vanilla-translate"),
                "--model",
                model,
                "--input",
                source,
                "--output",
                output,
                "--num_beams",
                "1",
                "--batch_size",
                str(batch_size),
            ]
            start = time.perf_counter()
            result, peak = run_with_peak_rss(command)
            seconds = time.perf_counter() - start
            if result.returncode != 0:
                sys.exit(result.stderr[-2000:])
            with open(output, encoding="utf-8") as file:
                written = sum(1 for _ in file)
            figures.append(
                {
                    "lines": count,
                    "lines_written": written,
                    "seconds_with_start_up": round(seconds, 1),
                    "lines_per_second": round(count / seconds, 1),
                    "peak_rss_mib": round(peak / 2**20, 1),
                }
            )
            print(figures[-1], flush=True)
    return figures


def demo_figures(model: str, requests: int) -> dict:
    from gradio_client import Client

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # every request queued at once, as --requests are sent: more than the demo's default queue takes
    command = [sys.executable, os.path.join(REPO_ROOT, "demo", "app.py"), "--model", model, "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--queue_size", str(requests)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"},
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(url, timeout=5).close()
                break
            except OSError:
                time.sleep(0.5)
        sentences = multi30k_sources("test")[:10]
        client = Client(url, verbose=False)
        start = time.perf_counter()
        alone = {sentence: answer(client.predict(sentence, api_name="/translate")) for sentence in sentences}
        sequential_seconds = (time.perf_counter() - start) / len(sentences)
        batch = (sentences * (requests // len(sentences) + 1))[:requests]
        random.Random(0).shuffle(batch)
        clients = [Client(url, verbose=False) for _ in range(4)]
        start = time.perf_counter()
        jobs = [clients[i % 4].submit(sentence, api_name="/translate") for i, sentence in enumerate(batch)]
        answers = [answer(job.result(timeout=1800)) for job in jobs]
        concurrent_seconds = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(timeout=60)
    return {
        "requests": requests,
        "answered": len(answers),
        "equal_to_sequential": sum(a == alone[s] for a, s in zip(answers, batch, strict=True)),
        "seconds_for_all": round(concurrent_seconds, 1),
        "seconds_per_request_alone": round(sequential_seconds, 3),
        "seconds_per_request_under_load": round(concurrent_seconds / requests, 3),
    }


def answer(result) -> tuple:
    translation, picture, steps = result
    with open(picture, "rb") as file:
        return translation, hashlib.sha256(file.read()).hexdigest(), steps["data"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(REPO_ROOT, "runs", "multi30k-small"))
    parser.add_argument("--lines", type=int, nargs="+", default=[2_000, 20_000, 200_000])
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    results = {
        "machine": machine(),
        "model": os.path.relpath(args.model, REPO_ROOT),
        "translate": translate_lines_figures(args.model, args.lines, args.batch_size),
        "demo": demo_figures(args.model, args.requests),
    }
    print(results["demo"])
    print("wrote", write_results("under_load", results))


if __name__ == "__main__":
    main()
