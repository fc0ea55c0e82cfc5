"""The demo under its longest request: demo/app.py's peak memory and seconds, the longest text once, then queued.

The server answers the longest text it takes once, then --requests of them sent at once through its queue.

    python -m bench demo --model runs/multi30k-small

The text is --word repeated as often as the model's positions and the demo's character limit allow (--words fewer):
the longest request a visitor may send. The server runs in a process of its own; its resident memory is read from
/proc/PID/status: VmRSS after a short warm-up request (the start), VmHWM (the peak, reset through
/proc/PID/clear_refs before each phase) while the long requests run, and VmRSS once they are answered. Writes
bench/results/demo/DATE.json (DATE_WORDSwords.json with --words).
"""

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from matplotlib.image import imread

from bench.helpers.common import REPO_ROOT, machine, write_results
from hf_vanilla_transformer.loading import load_tokenizer

DEMO_APP = os.path.join(REPO_ROOT, "demo", "app.py")


def load_app():
    """demo/app.py as a module (the folder is no package): its limits."""
    spec = importlib.util.spec_from_file_location("demo_app", DEMO_APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def longest_text(model: str, word: str, characters_per_position: int) -> tuple[str, int]:
    """`word` repeated as often as the demo takes: no more tokens than the model's positions, no more characters
    than its limit (both grow with the words: the most is found by halving). The text and its tokens."""
    from transformers import AutoConfig

    tokenizer = load_tokenizer(model)
    positions = AutoConfig.from_pretrained(model).max_position_embeddings

    def tokens(words: int) -> int | None:
        """The tokens of `words` words, None when the demo refuses them."""
        text = " ".join([word] * words)
        if len(text) > characters_per_position * positions:
            return None
        count = len(tokenizer(text, verbose=False)["input_ids"])
        return count if count <= positions else None

    taken, refused = 1, characters_per_position * positions + 1
    while refused - taken > 1:
        middle = (taken + refused) // 2
        taken, refused = (middle, refused) if tokens(middle) else (taken, middle)
    return " ".join([word] * taken), tokens(taken)


def memory(pid: int) -> dict[str, int]:
    """The process's VmRSS and VmHWM (its peak since the last reset), in bytes."""
    with open(f"/proc/{pid}/status") as file:
        fields = dict(line.split(":", 1) for line in file)
    return {name: int(fields[name].split()[0]) * 1024 for name in ("VmRSS", "VmHWM")}


def reset_peak(pid: int) -> None:
    """VmHWM back to the process's VmRSS now (Linux: "5" to clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w") as file:
        file.write("5")


def gib(size: int) -> float:
    return round(size / 2**30, 2)


def picture_size(result) -> list[int]:
    """The answer's picture, as its height and width in pixels (read at once: the server deletes it soon)."""
    return list(imread(result[1]["path"]).shape[:2])


def serve(model: str, requests: int, log) -> tuple[subprocess.Popen, str]:
    """demo/app.py on a free loopback port, queueing up to `requests`, its stderr to the file `log`; the process and
    its URL once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, DEMO_APP, "--model", model, "--port", str(port), "--queue_size", str(requests)]
    # this checkout's package, not one installed elsewhere
    python_path = os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": python_path}
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=env)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300
    while server.poll() is None and time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return server, url
        except OSError:
            time.sleep(0.5)
    server.terminate()
    sys.exit(f"the demo did not answer at {url} within 300 s; its log: {log.name}")


def figures(model: str, text: str, requests: int) -> dict:
    from gradio_client import Client

    log = tempfile.NamedTemporaryFile("w", prefix="demo-server-", suffix=".log", delete=False)  # noqa: SIM115
    server, url = serve(model, requests, log)
    try:
        client = Client(url, verbose=False, download_files=False)
        client.predict("A man is sleeping.", api_name="/translate")  # what any first request loads
        start = memory(server.pid)["VmRSS"]
        reset_peak(server.pid)
        began = time.perf_counter()
        one = client.predict(text, api_name="/translate")
        seconds_one = time.perf_counter() - began
        after_one = memory(server.pid)
        sizes = [picture_size(one)]
        print(f"one request: {seconds_one:.1f} s, {after_one}", flush=True)
        reset_peak(server.pid)
        began = time.perf_counter()
        jobs = [client.submit(text, api_name="/translate") for _ in range(requests)]
        answers = []
        for job in jobs:  # in the order the queue answers them: each picture read as soon as it is served
            answers.append(job.result(timeout=3600))
            sizes.append(picture_size(answers[-1]))
        seconds_all = time.perf_counter() - began
        after_all = memory(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    os.remove(log.name)  # kept, and named, only when the server failed
    return {
        "rss_start_gib": gib(start),
        "one_request": {
            "seconds": round(seconds_one, 1),
            "peak_growth_gib": gib(after_one["VmHWM"] - start),
            "rss_after_gib": gib(after_one["VmRSS"]),
        },
        "queued_requests": {
            "requests": requests,
            "answered": sum(bool(translation) for translation, _, _ in answers),
            "seconds_for_all": round(seconds_all, 1),
            "seconds_per_request": round(seconds_all / requests, 1),
            "peak_growth_gib": gib(after_all["VmHWM"] - start),
            "rss_after_gib": gib(after_all["VmRSS"]),
        },
        "picture_pixels": max(sizes),
        "translation_characters": len(one[0]),
        "step_rows": len(one[2]["data"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(REPO_ROOT, "runs", "multi30k-small"))
    parser.add_argument("--word", default="man", help="The word the text repeats (one token in our vocabularies).")
    parser.add_argument("--words", type=int, help="Send this many words, not the most the demo takes.")
    parser.add_argument("--requests", type=int, default=20, help="Requests queued at once after the first.")
    args = parser.parse_args()
    text, tokens = longest_text(args.model, args.word, load_app().CHARACTERS_PER_POSITION)
    if args.words is not None:
        text = " ".join(text.split()[: args.words])
        tokens = len(load_tokenizer(args.model)(text, verbose=False)["input_ids"])
    results = {
        "machine": machine(),
        "model": os.path.relpath(args.model, REPO_ROOT),
        "words": len(text.split()),
        "characters": len(text),
        "tokens": tokens,
        **figures(args.model, text, args.requests),
    }
    print(results)
    print("wrote", write_results("demo", results, "" if args.words is None else f"{args.words}words"))


if __name__ == "__main__":
    main()
