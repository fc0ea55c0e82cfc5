"""Shared helpers for the benchmarks: machine description, interleaved timing, result files, and the data,
models and step functions that more than one benchmark uses."""

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch

from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.hardware import cpu_name
from hf_vanilla_transformer.model.modeling_vanilla_transformer import shift_tokens_right
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.batches import TokenBudgetBatchSampler
from hf_vanilla_transformer.training.data import file_sentences, read_translation_file
from hf_vanilla_transformer.training.tokenizer import train_shared_bpe

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO_ROOT, "bench", "results")
SHARED_DATA = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data")
MULTI30K = os.path.join(SHARED_DATA, "multi30k")


def multi30k_tokenizer():
    """The 8,000-token shared BPE that train_bpe.py builds on Multi30k train (en + de)."""
    return train_shared_bpe(file_sentences([os.path.join(MULTI30K, "train.jsonl")], "en", "de"), vocab_size=8000)


def multi30k_encoded(tokenizer, split: str = "train"):
    """The split's en-de pairs tokenized as the Trainer sees them: `input_ids` and `labels` lists."""
    pairs = list(read_translation_file(os.path.join(MULTI30K, f"{split}.jsonl"), "en", "de"))
    return tokenizer([source for source, _ in pairs], text_target=[target for _, target in pairs])


def multi30k_pairs(split: str = "test") -> list[tuple[str, str]]:
    return list(read_translation_file(os.path.join(MULTI30K, f"{split}.jsonl"), "en", "de"))


def multi30k_sources(split: str = "test") -> list[str]:
    return [source for source, _ in multi30k_pairs(split)]


def today() -> str:
    """The UTC date that results are filed under."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def machine() -> dict:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "date": today(),
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


def add_repetitions(parser, default: int) -> None:
    parser.add_argument(
        "--repetitions", type=int, default=default, help="Interleaved repetitions of each candidate; medians reported."
    )


def synchronized(run: Callable[[], object], device: torch.device | str = "cpu") -> Callable[[], None]:
    """`run`, then wait for the device, so wall-clock timing covers the queued kernels."""

    if torch.device(device).type != "cuda":
        return run

    def timed():
        run()
        torch.cuda.synchronize(device)

    return timed


def bytes_saved_for_backward(forward: Callable[[], object]) -> tuple[object, int]:
    """`forward()`'s result, and the bytes autograd keeps from it for the backward pass (its saved-tensor hooks)."""
    saved = []

    def count(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
        result = forward()
    return result, sum(saved)


def matmul_rate(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", size: int = 2048) -> float:
    """FLOP/s of a `size`-square matrix product in `dtype` on `device` (median of 10, after 3 warm-ups): the peer
    rate a model's FLOP/s is measured against."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    product = synchronized(lambda: a @ b, device)
    for _ in range(3):
        product()
    return 2 * size**3 / interleaved_medians({"matmul": product}, 10)["matmul"]


def in_own_process(module: str, *arguments) -> dict:
    """`python -m module --worker JSON(arguments)` in a fresh process (what it loads and allocates is its own), and
    the JSON object it prints last."""
    command = [sys.executable, "-m", module, "--worker", json.dumps(list(arguments))]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def results_path(benchmark: str, label: str = "", date: str | None = None) -> str:
    """bench/results/BENCHMARK/DATE[_LABEL].json: a benchmark's results by the day they were measured (today unless
    `date` is given), so that a rerun adds a file beside the ones the docs cite; LABEL tells apart the runs of one
    benchmark that differ in what they measure (a preset, a part, a data set)."""
    date = date or today()
    return os.path.join(RESULTS, benchmark, f"{date}_{label}.json" if label else f"{date}.json")


def latest_results(benchmark: str, label: str = "") -> str | None:
    """The newest of a benchmark's results files with that label, or None."""
    pattern = re.compile(r"\d{4}-\d{2}-\d{2}" + (f"_{re.escape(label)}" if label else "") + r"\.json")
    folder = os.path.join(RESULTS, benchmark)
    dated = sorted(name for name in os.listdir(folder) if pattern.fullmatch(name)) if os.path.isdir(folder) else []
    return os.path.join(folder, dated[-1]) if dated else None


def add_results_label(parser) -> None:
    parser.add_argument(
        "--results",
        default="",
        metavar="LABEL",
        help="The results file's label: bench/results/BENCHMARK/DATE_LABEL.json (none: DATE.json).",
    )


def write_results(benchmark: str, results: dict, label: str = "") -> str:
    path = results_path(benchmark, label)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        json.dump(results, file, indent=2)
    return path


def multi30k_batches(count: int, max_tokens: int, seed: int = 0):
    """`count` padded training batches of Multi30k en-de, as our Trainer would cut them, and the tokenizer."""
    from transformers import DataCollatorForSeq2Seq

    tokenizer = multi30k_tokenizer()
    encoded = multi30k_encoded(tokenizer)
    sampler = TokenBudgetBatchSampler(
        [len(ids) for ids in encoded["input_ids"]], [len(ids) for ids in encoded["labels"]], max_tokens, seed=seed
    )
    collate = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)
    batches = []
    for indices in list(sampler)[:count]:
        features = [{"input_ids": encoded["input_ids"][i], "labels": encoded["labels"][i]} for i in indices]
        batch = collate(features)
        batch["decoder_input_ids"] = shift_tokens_right(batch["labels"], tokenizer.pad_token_id, tokenizer.bos_token_id)
        batches.append(dict(batch))
    return batches, tokenizer


def marian_like(config: VanillaTransformerConfig, **overrides):
    """MarianMTModel of our shape: the Marian export's config (`marian_config`) with Marian's own initialisation,
    then `overrides` (MarianConfig arguments, e.g. `forced_eos_token_id`)."""
    from transformers import MarianConfig, MarianMTModel

    from hf_vanilla_transformer.export.marian import marian_config

    marian = marian_config(config)
    marian.update({"init_std": MarianConfig().init_std, **overrides})
    model = MarianMTModel(marian)
    model.set_attn_implementation("sdpa")
    return model


def paper_adam(parameters) -> torch.optim.Adam:
    """The paper's Adam (Section 5.3), fused, as the Trainer's default optimizer in transformers 5
    (adamw_torch_fused) is."""
    paper = TranslationTrainingArguments
    return torch.optim.Adam(
        parameters, lr=1e-4, betas=(paper.adam_beta1, paper.adam_beta2), eps=paper.adam_epsilon, fused=True
    )


def step_function(model, batches, loss_of):
    optimizer = paper_adam(model.parameters())
    model.train()

    def run():
        for batch in batches:
            loss = loss_of(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def hf_loss(model, batch):
    return model(**batch).loss


def source_batches(tokenizer, sentences: list[str], batch_size: int) -> list[dict]:
    return [
        dict(tokenizer(sentences[i : i + batch_size], return_tensors="pt", padding=True))
        for i in range(0, len(sentences), batch_size)
    ]


def decode_all(model, batches, **generate_kwargs):
    def run():
        with torch.no_grad():
            for batch in batches:
                model.generate(**batch, **generate_kwargs)

    return run


def run_with_peak_rss(command: list[str], **run_kwargs) -> tuple[subprocess.CompletedProcess, int]:
    """Run `command` and return its result and its peak resident memory in bytes (the kernel's own count, through a
    Python parent that runs nothing else: `ru_maxrss` of its children)."""
    parent = (
        "import resource, subprocess, sys\n"
        "code = subprocess.run(sys.argv[1:]).returncode\n"
        "sys.stderr.write(f'\\npeak_rss_kb={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", parent, *command], capture_output=True, text=True, **run_kwargs)
    stderr, _, peak = result.stderr.rstrip("\n").rpartition("\npeak_rss_kb=")
    result.stderr = stderr
    return result, int(peak) * 1024


def training_flops(config: VanillaTransformerConfig, batch) -> float:
    """Analytic FLOPs of one training step on `batch` (3x the forward's matmul FLOPs), over real tokens."""
    d, vocab = config.d_model, config.vocab_size
    source_tokens = int(batch["attention_mask"].sum())
    target_tokens = int((batch["labels"] != -100).sum())
    source_length, target_length = batch["input_ids"].shape[1], batch["labels"].shape[1]
    encoder = (
        config.encoder_layers * source_tokens * (4 * d * d + 2 * d * config.encoder_ffn_dim + 2 * source_length * d)
    )
    decoder = config.decoder_layers * (
        target_tokens * (6 * d * d + 2 * d * config.decoder_ffn_dim + 2 * target_length * d + 2 * source_length * d)
        + source_tokens * 2 * d * d  # cross-attention keys and values
    )
    output = target_tokens * d * vocab
    return 3 * 2 * (encoder + decoder + output)


# the operator families a profile of a step or a decoding is summed into
PROFILE_CATEGORIES = {
    "matrix products": lambda name: name in ("aten::mm", "aten::addmm", "aten::bmm"),
    "dropout masks": lambda name: name in ("aten::bernoulli_", "aten::random_"),  # nn.Dropout's draws, and ours
    "softmax and loss": lambda name: "log_softmax" in name or "nll_loss" in name,
    "attention kernel": lambda name: "scaled_dot_product" in name,
    "index_select (cache reordering)": lambda name: name == "aten::index_select",
}
