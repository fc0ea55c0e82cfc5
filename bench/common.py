"""Shared helpers for the benchmarks: machine description, interleaved timing, result files."""

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch

from hf_vanilla_transformer.hub import cpu_name

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI30K = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data", "multi30k")


def machine() -> dict:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }


def interleaved_medians(candidates: dict[str, Callable[[], object]], repetitions: int) -> dict[str, float]:
    """Median seconds of each candidate, run in turn (A, B, A, B, ...) so that machine noise hits all alike."""
    times = {name: [] for name in candidates}
    for _ in range(repetitions):
        for name, run in candidates.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def write_results(name: str, results: dict) -> str:
    path = os.path.join(REPO_ROOT, "bench", "results", f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        json.dump(results, file, indent=2)
    return path
