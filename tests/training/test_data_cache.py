"""The data path of a run on disk: pairs streamed into Arrow files (never into Python lists), the BPE and the tokens
cached, and a second run on the same files and vocabulary reading those caches instead of doing the work again."""

import json
import os
import random
import tracemalloc
from pathlib import Path

import pytest

from hf_vanilla_transformer.cli.run_translation import parse_arguments
from hf_vanilla_transformer.files import InputError
from hf_vanilla_transformer.training.data import load_translation_split
from hf_vanilla_transformer.training.run import prepare
from support.files import write_lines
from support.runs import QUIET_CPU

WORDS = ("cat", "dog", "man", "woman", "ball", "red", "blue", "runs", "sits", "plays", "in", "the", "park", "water")


def pairs_file(path: Path, count: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        words = rng.choices(WORDS, k=rng.randint(2, 9))
        row = {"en": " ".join(words) + ".", "de": " ".join(reversed(words)).capitalize() + "."}
        rows.append(json.dumps({"translation": row}))
    return write_lines(path, rows)


def cache_files(cache: Path) -> dict[str, int]:
    """Every file under the cache and when it was last written."""
    return {str(path.relative_to(cache)): path.stat().st_mtime_ns for path in cache.rglob("*") if path.is_file()}


def prepared(train: str, cache: Path, *flags: str):
    arguments = parse_arguments(
        [
            "--train_file",
            train,
            "--source_lang",
            "en",
            "--target_lang",
            "de",
            "--do_train",
            "--vocab_size",
            "300",
            "--preset",
            "small",
            "--output_dir",
            str(cache.parent / "run"),
            "--overwrite_output_dir",
            "true",
            "--cache_dir",
            str(cache),
            *QUIET_CPU,
            *flags,
        ]
    )
    return prepare(*arguments)


def test_a_second_run_on_the_same_file_reads_its_caches_and_writes_nothing(tmp_path):
    train = pairs_file(tmp_path / "train.jsonl", 500)
    cache = tmp_path / "cache"
    first = prepared(train, cache)
    written = cache_files(cache)
    assert any(name.startswith("hf_vanilla_transformer/bpe-") for name in written)  # the vocabulary, cached
    second = prepared(train, cache)
    assert cache_files(cache) == written  # pairs, vocabulary and tokens all read back: not one file written again
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    assert second.tokenized["train"].cache_files == first.tokenized["train"].cache_files
    assert second.tokenized["train"][:] == first.tokenized["train"][:]
    assert first.tokenized["train"].column_names == ["input_ids", "labels"]  # the collator makes the masks

    # another vocabulary: the pairs are read back, a new BPE and new tokens are made
    third = prepared(train, cache, "--vocab_size", "320")
    assert len(third.tokenizer) == 320 != len(first.tokenizer)
    assert third.tokenized["train"].cache_files != first.tokenized["train"].cache_files
    # --overwrite_cache: the vocabulary and tokens are made again (the same ones), over the cached files
    again = cache_files(cache)
    fourth = prepared(train, cache, "--overwrite_cache", "true")
    rewritten = cache_files(cache)
    assert fourth.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    assert [name for name in again if rewritten[name] != again[name]], "nothing was made again"


def test_a_file_changed_in_place_is_read_again(tmp_path):
    train = tmp_path / "train.jsonl"
    write_lines(train, [json.dumps({"translation": {"en": "A cat.", "de": "Eine Katze."}})])
    cache = tmp_path / "cache"
    assert load_translation_split(str(train), None, None, "train", "en", "de", cache_dir=str(cache))[:] == {
        "source": ["A cat."],
        "target": ["Eine Katze."],
    }
    write_lines(train, [json.dumps({"translation": {"en": "A dog.", "de": "Ein Hund."}})])
    os.utime(train, ns=(1, 1))  # even with an older modification time: the size differs too
    assert load_translation_split(str(train), None, None, "train", "en", "de", cache_dir=str(cache))[:] == {
        "source": ["A dog."],
        "target": ["Ein Hund."],
    }


def test_one_file_given_for_two_splits_is_read_as_each(tmp_path):
    data, cache = pairs_file(tmp_path / "pairs.jsonl", 5), str(tmp_path / "cache")
    train = load_translation_split(data, None, None, "train", "en", "de", cache_dir=cache)
    validation = load_translation_split(data, None, None, "validation", "en", "de", cache_dir=cache)
    assert (str(train.split), str(validation.split)) == ("train", "validation")
    assert train[:] == validation[:] and len(train) == 5


def test_a_bad_row_is_named_by_file_and_line_and_leaves_no_cache(tmp_path):
    train = pairs_file(tmp_path / "train.jsonl", 3000)
    lines = Path(train).read_text().splitlines()
    lines[2500] = '{"translation": {"en": "A cat."}}'
    write_lines(Path(train), lines)
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match=r"train.jsonl:2501: the translation has no 'de' sentence \(it has 'en'\)$"):
        load_translation_split(train, None, None, "train", "en", "de", cache_dir=str(cache))
    assert not list(cache.rglob("*.arrow"))  # nothing half-written for a later run to take
    lines[2500] = lines[0]
    write_lines(Path(train), lines)
    assert len(load_translation_split(train, None, None, "train", "en", "de", cache_dir=str(cache))) == 3000


def python_memory_peak_reading(train: str, cache: str) -> int:
    tracemalloc.start()
    try:
        split = load_translation_split(train, None, None, "train", "en", "de", cache_dir=cache)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert split.cache_files  # memory-mapped from its Arrow file
    return peak


def test_pairs_stream_into_arrow_without_being_held_in_python(tmp_path):
    """tracemalloc sees Python's objects (not Arrow's buffers): reading holds a few batches of pairs at a time, so
    four times the pairs take no more Python memory, where lists of every sentence grow with the file."""
    cache = str(tmp_path / "cache")
    python_memory_peak_reading(pairs_file(tmp_path / "warm-up.jsonl", 10), cache)  # imports, one-time set-up
    small, large = pairs_file(tmp_path / "small.jsonl", 3_000), pairs_file(tmp_path / "large.jsonl", 12_000, seed=1)
    growth = python_memory_peak_reading(large, cache) - python_memory_peak_reading(small, cache)
    assert growth < (os.path.getsize(large) - os.path.getsize(small)) / 10, f"{growth:,} bytes more"
