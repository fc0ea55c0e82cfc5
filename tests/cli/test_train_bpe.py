"""train_bpe.py: the command line that trains the shared BPE vocabulary, its inputs, and its errors."""

import json
import re
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

import train_bpe
from support.files import HUB_LAYOUTS, write_bytes_lines, write_dataset, write_lines
from support.hostile import HOSTILE_LINES, assert_one_line_error
from support.models import round_trip
from support.paths import REPO_ROOT, TRAIN


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "train_bpe.py"), *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_cli_trains_the_multi30k_vocabulary(tmp_path):
    output = tmp_path / "bpe8k"
    result = run_cli(
        "--train_file",
        TRAIN,
        "--source_lang",
        "en",
        "--target_lang",
        "de",
        "--vocab_size",
        "8000",
        "--output_dir",
        str(output),
    )
    assert result.returncode == 0, result.stderr
    assert "Saved a 8000-token shared BPE vocabulary" in result.stdout
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert len(tokenizer) == 8000
    sentence = "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
    assert len(tokenizer(sentence)["input_ids"]) <= 16  # frequent German words are whole tokens
    assert round_trip(tokenizer, sentence) == sentence


def test_normalization_flag(tmp_path):
    (tmp_path / "zh.txt").write_text("你好吗？我很好，谢谢！\n请给我一杯水。\n" * 50, encoding="utf-8")
    train_bpe.main(
        [
            "--train_file",
            str(tmp_path / "zh.txt"),
            "--vocab_size",
            "300",
            "--normalization",
            "NFC",
            "--output_dir",
            str(tmp_path / "nfc"),
        ]
    )
    assert round_trip(AutoTokenizer.from_pretrained(tmp_path / "nfc"), "你好吗？") == "你好吗？"
    with pytest.raises(SystemExit) as exit_info:
        train_bpe.main(
            [
                "--train_file",
                str(tmp_path / "zh.txt"),
                "--normalization",
                "nfc",
                "--output_dir",
                str(tmp_path / "lower"),
            ]
        )
    assert exit_info.value.code == (
        "train_bpe.py: error: argument --normalization: invalid choice: 'nfc' (choose from 'NFKC', 'NFC') (see --help)"
    )  # argparse's message, in one line (exit status 1)
    assert not (tmp_path / "lower").exists()


def test_split_han_flag(tmp_path):
    (tmp_path / "zh.txt").write_text("你好吗？我很好，谢谢！\n请给我一杯水。\n" * 50, encoding="utf-8")
    for flag in ("false", "true"):
        train_bpe.main(
            [
                "--train_file",
                str(tmp_path / "zh.txt"),
                "--vocab_size",
                "300",
                "--normalization",
                "NFC",
                "--split_han",
                flag,
                "--output_dir",
                str(tmp_path / flag),
            ]
        )
    merged, split = (AutoTokenizer.from_pretrained(tmp_path / flag) for flag in ("false", "true"))
    assert len(split.tokenize("请给我一杯水")) == 6 > len(merged.tokenize("请给我一杯水"))


def test_plain_text_files_dataset_folders_and_max_sentences(tmp_path):
    (tmp_path / "en.txt").write_text("a small cat\n\nthe small dog\n" * 50)
    (tmp_path / "de.txt").write_text("eine kleine Katze\nder kleine Hund\n" * 50)
    train_bpe.main(
        [
            "--train_file",
            str(tmp_path / "en.txt"),
            str(tmp_path / "de.txt"),
            "--vocab_size",
            "300",
            "--output_dir",
            str(tmp_path / "text"),
        ]
    )
    vocabulary = AutoTokenizer.from_pretrained(tmp_path / "text").get_vocab()
    assert "Ġkleine" in vocabulary and "Ġsmall" in vocabulary

    for layout, make in HUB_LAYOUTS.items():  # a dataset by name, in either layout of the Hub's
        dataset = write_dataset(tmp_path / layout, {"train": [make("a small cat", "eine kleine Katze")] * 30})
        train_bpe.main(
            ["--dataset_name", dataset, "--vocab_size", "280", "--output_dir", str(tmp_path / f"from {layout}")]
        )
        assert "Ġkleine" in AutoTokenizer.from_pretrained(tmp_path / f"from {layout}").get_vocab()

    train_bpe.main(
        [
            "--train_file",
            str(tmp_path / "en.txt"),
            str(tmp_path / "de.txt"),
            "--max_sentences",
            "100",
            "--vocab_size",
            "300",
            "--output_dir",
            str(tmp_path / "english_only"),
        ]
    )
    vocabulary = AutoTokenizer.from_pretrained(tmp_path / "english_only").get_vocab()
    assert "Ġsmall" in vocabulary and "Ġkleine" not in vocabulary


GOOD_ROW = json.dumps({"translation": {"en": "A cat.", "de": "Eine Katze."}})


@pytest.mark.parametrize(
    "make_input, extra_args, message",
    [
        (lambda d: str(d / "missing.jsonl"), [], r"missing.jsonl: no such file"),
        (lambda d: write_lines(d / "empty.jsonl", []), [], r"empty.jsonl: no sentence pairs \(the file is empty\)"),
        (
            lambda d: write_lines(d / "nokey.jsonl", [GOOD_ROW, '{"translation": {"en": "A dog."}}']),
            [],
            r"nokey.jsonl:2: the translation has no 'de' sentence \(it has 'en'\)",
        ),
        (
            lambda d: write_lines(d / "broken.jsonl", [GOOD_ROW, GOOD_ROW, '{"translation": {"en": "A"']),
            [],
            r"broken.jsonl:3: not valid JSON",
        ),
        (
            lambda d: write_lines(d / "flat.jsonl", ['{"en": "A cat.", "de": "Eine Katze."}']),
            [],
            r'flat.jsonl:1: expected an object with a "translation" object',
        ),
        (
            lambda d: write_lines(d / "blank.jsonl", ['{"translation": {"en": "A cat.", "de": " "}}']),
            [],
            r"blank.jsonl:1: the 'de' sentence is empty",
        ),
        (lambda d: write_lines(d / "ok.jsonl", [GOOD_ROW]), ["--vocab_size", "100"], r"error: vocab_size 100 is below"),
    ],
)
def test_bad_input_is_one_clear_error_and_leaves_no_folder(tmp_path, make_input, extra_args, message):
    output = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        train_bpe.main(["--train_file", make_input(tmp_path), "--output_dir", str(output), *extra_args])
    assert exit_info.value.code != 0
    assert str(exit_info.value.code).startswith("train_bpe.py: error: ")
    assert re.search(message, str(exit_info.value.code)), exit_info.value.code
    assert not output.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.mark.parametrize("line", HOSTILE_LINES[1:7])
def test_a_hostile_line_stops_it_in_one_line_naming_file_and_line(tmp_path, line):
    good = json.dumps({"translation": {"en": "A cat.", "de": "Eine Katze."}}).encode()
    train_file = write_bytes_lines(tmp_path, "train.jsonl", [good, line])
    with pytest.raises(SystemExit) as exit_info:
        train_bpe.main(["--train_file", train_file, "--output_dir", str(tmp_path / "out")])
    assert_one_line_error(exit_info.value.code, f"train_bpe.py: error: {train_file}:2: ")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["train.jsonl"]


@pytest.mark.slow
def test_a_late_error_leaves_no_folder_and_an_existing_one_untouched(tmp_path):
    lines = [json.dumps({"translation": {"en": f"cat {i}", "de": f"Katze {i}"}}) for i in range(3000)]
    bad = write_lines(tmp_path / "late.jsonl", [*lines, "not json"])
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("earlier work")
    result = run_cli("--train_file", bad, "--output_dir", str(output), "--overwrite_output_dir")
    assert result.returncode == 1
    assert result.stderr.strip() == f"train_bpe.py: error: {bad}:3001: not valid JSON (Expecting value at column 1)"
    assert [p.name for p in tmp_path.iterdir() if p.name != "late.jsonl"] == ["out"]
    assert [p.name for p in output.iterdir()] == ["keep.txt"]

    result = run_cli("--train_file", TRAIN, "--output_dir", str(output))
    assert result.returncode == 1 and "exists and is not empty; add overwrite_output_dir to replace it" in result.stderr
