"""Shared helpers for the benchmarks: machine description, interleaved timing, result files."""

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch

from hf_vanilla_transformer.data import file_sentences, read_translation_file
from hf_vanilla_transformer.hub import cpu_name
from hf_vanilla_transformer.tokenizer_training import train_shared_bpe

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI30K = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data", "multi30k")


def multi30k_tokenizer():
    """The 8,000-token shared BPE that train_bpe.py builds on Multi30k train (en + de)."""
    return train_shared_bpe(file_sentences([os.path.join(MULTI30K, "train.jsonl")], "en", "de"), vocab_size=8000)


def multi30k_encoded(tokenizer, split: str = "train"):
    """The split's en-de pairs tokenized as the Trainer sees them: `input_ids` and `labels` lists."""
    pairs = list(read_translation_file(os.path.join(MULTI30K, f"{split}.jsonl"), "en", "de"))
    return tokenizer([source for source, _ in pairs], text_target=[target for _, target in pairs])


def multi30k_sources(split: str = "test") -> list[str]:
    return [source for source, _ in read_translation_file(os.path.join(MULTI30K, f"{split}.jsonl"), "en", "de")]


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
