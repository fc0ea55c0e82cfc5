"""Shared fixtures and the two tiers. Everything runs offline: the Hub is never contacted. What the fixtures and
tests share is in support/, by concern.

`python -m pytest` runs the quick tier: tiny models and tokenizers made in the test, no `../shared` data, no
browser, no training subprocess, no torch.compile. `python -m pytest --slow` adds the slow tier: tests marked
`slow`, and every test that uses one of SLOW_FIXTURES (trained runs on `../shared` data and what is built on them).
"""

import atexit
import os
import pickle
import shutil
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
# `datasets` caches what runs read (training/data.py): in a folder of this session's own, so that no test reads a
# cache an earlier session left, and nothing is written to the user's ~/.cache
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="hf-datasets-")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from filelock import FileLock
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from support.hub import intercepted_hub
from support.models import BOS, EOS, PAD
from support.runs import CHINESE_RUN, TINY_RUN, TrainedRun

atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)

# The tests' models are tiny: one thread runs them as fast as two, and beside another busy process (the other test
# worker: two on two cores) torch's two threads wait on each other, several times slower. So one thread, here and,
# through OMP_NUM_THREADS, in every subprocess.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

# trained runs and what is built on them, the kill tests' and launches' runs, the demo server, a BPE on Multi30k,
# and an ONNX export (torch.export traces the model: half a minute even for a tiny one)
SLOW_FIXTURES = {
    "trained_run",
    "chinese_run",
    "model_and_tokenizer",
    "exported",
    "uninterrupted_run",
    "launched_runs",
    "demo_url",
    "onnx_export",
}


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the slow tier (needs ../shared/data, Chromium)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    if config.getoption("--slow"):
        return
    quick = [item for item in items if item.get_closest_marker("slow") is None]
    config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("slow") is not None])
    items[:] = quick


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """For the command line's, the engines' and translation's tests: two tiny model folders of different seeds, the
    first's CTranslate2 export, a folder taken for an ONNX export, and an input file (support/steering.py). A test
    file with a `folders` of its own uses its own."""
    from support.steering import steering_folders  # imported with the tests that use it

    return steering_folders(tmp_path_factory.mktemp("steering"))


@pytest.fixture
def work(tmp_path, monkeypatch) -> dict:
    """A working folder (the current one) with an input file, a model folder and a CTranslate2 folder, both broken,
    and each command's flags for them (support/commands.py)."""
    from support.commands import broken_work

    monkeypatch.chdir(tmp_path)
    return broken_work(tmp_path)


@pytest.fixture
def padded_batch():
    """Two sources of different lengths, right-padded, and teacher-forced targets."""
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, EOS], [11, 12, 13, EOS, PAD, PAD, PAD]])
    decoder_input_ids = torch.tensor([[BOS, 20, 21, 22, 23], [BOS, 24, 25, PAD, PAD]])
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD).long(),
        "decoder_input_ids": decoder_input_ids,
    }


def built_once(tmp_path_factory, worker_id: str, name: str, build) -> TrainedRun:
    """`build(folder)` once a session for all of pytest-xdist's workers: the first to ask builds while the others
    wait on the lock, then they all read what it left (the pattern pytest-xdist documents for session fixtures). A
    trained run takes a minute or two here; built in each worker, it took that again, on the same two cores."""
    if worker_id == "master":  # no workers (`-n 0`)
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # the session's, above each worker's own
    built = shared / f"{name}.pickle"
    with FileLock(shared / f"{name}.lock"):
        if not built.exists():
            built.write_bytes(pickle.dumps(build(shared / name)))
    return pickle.loads(built.read_bytes())


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, worker_id) -> TrainedRun:
    """run_translation.py on a Multi30k slice, with --push_to_hub intercepted at the Hub boundary."""

    def train(folder):
        import run_translation

        output, commits = folder / "model", []
        with intercepted_hub(commits):
            results = run_translation.main(
                [
                    *TINY_RUN,
                    "--output_dir",
                    str(output),
                    "--push_to_hub",
                    "true",
                    "--hub_model_id",
                    "someone/tiny-en-de",
                ]
            )
        return TrainedRun(output, results, commits)

    return built_once(tmp_path_factory, worker_id, "en-de", train)


@pytest.fixture(scope="session")
def chinese_run(tmp_path_factory, worker_id) -> TrainedRun:
    """run_translation.py English→Chinese on a Tatoeba slice."""

    def train(folder):
        import run_translation

        output = folder / "en-zh"
        return TrainedRun(output, run_translation.main([*CHINESE_RUN, "--output_dir", str(output)]))

    return built_once(tmp_path_factory, worker_id, "en-zh", train)


@pytest.fixture(scope="module")
def model_and_tokenizer(trained_run):
    """The trained run's model and tokenizer, loaded with the auto classes."""
    tokenizer = AutoTokenizer.from_pretrained(trained_run.output)
    return AutoModelForSeq2SeqLM.from_pretrained(trained_run.output), tokenizer


@pytest.fixture(scope="session")
def exported(trained_run, tmp_path_factory) -> dict[str, str]:
    """The trained run exported to CTranslate2 folders, float32 and int8 (export/ctranslate2.py)."""
    from hf_vanilla_transformer.export.ctranslate2 import export

    folder = tmp_path_factory.mktemp("ctranslate2")
    return {kind: export(str(trained_run.output), str(folder / kind), kind) for kind in ("float32", "int8")}
