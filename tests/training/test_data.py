"""hf_vanilla_transformer.training.data: reading translation JSON lines, plain text and `datasets` folders, with
errors that name the file and line (or the dataset row) of the first bad input."""

import json
import re

import datasets
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from hf_vanilla_transformer.files import InputError
from hf_vanilla_transformer.training.data import (
    file_sentences,
    load_translation_split,
    read_dataset,
    read_text_file,
    read_translation_file,
)
from support.files import HUB_LAYOUTS, write_bytes_lines, write_dataset, write_lines
from support.hostile import FUZZ_SETTINGS, HOSTILE_LINES, RAW_LINES, read_fuzzed_file


def row(en, de) -> str:
    return json.dumps({"translation": {"en": en, "de": de}}, ensure_ascii=False)


PAIRS = [("A cat.", "Eine Katze."), ("Two dogs play.", "Zwei Hunde spielen."), ("A man.", "Ein Mann.")]


def test_read_translation_file_yields_the_pairs_and_skips_blank_lines(tmp_path):
    path = write_lines(tmp_path / "pairs.jsonl", [row(*PAIRS[0]), "", row(*PAIRS[1]), "   ", row(*PAIRS[2]), ""])
    assert list(read_translation_file(path, "en", "de")) == PAIRS
    assert list(read_translation_file(path, "de", "en")) == [(de, en) for en, de in PAIRS]


@pytest.mark.parametrize(
    "lines, message",
    [
        ([row(*PAIRS[0]), '{"translation": '], r":2: not valid JSON \(Expecting value at column 1\)"),
        (
            [row(*PAIRS[0]), "", '{"translation": {"en": "A dog."}}'],
            r":3: the translation has no 'de' sentence \(it has 'en'\)",
        ),
        (['{"translation": {}}'], r":1: the translation has no 'en' sentence \(it has none\)"),
        (['{"translation": {"en": " ", "de": "Hund."}}'], r":1: the 'en' sentence is empty"),
        (['{"translation": {"en": "A dog.", "de": ["Hund."]}}'], r":1: the 'de' sentence is not a string: \['Hund.'\]"),
        (['{"en": "A dog.", "de": "Hund."}'], r""":1: expected an object with a "translation" object, got \{'en': """),
        (['["A dog.", "Hund."]'], r""":1: expected an object with a "translation" object, got \['A dog.', 'Hund.'\]"""),
        (["", "  "], r": no sentence pairs \(the file is empty\)"),
    ],
)
def test_read_translation_file_names_the_file_and_line_of_a_bad_row(tmp_path, lines, message):
    path = write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(InputError, match=re.escape(path) + message):
        list(read_translation_file(path, "en", "de"))


def test_a_file_that_is_not_utf8_or_not_there(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(row("A little man.", "Ein Männchen.").encode("latin-1") + b"\n")
    with pytest.raises(InputError) as error:
        list(read_translation_file(str(path), "en", "de"))
    column = row("A little man.", "Ein M").encode().index(b"M") + 2  # the byte after "M", counted from 1
    assert str(error.value) == f"{path}:1: not UTF-8 text (invalid continuation byte at byte {column} of the line)"
    later = tmp_path / "later.jsonl"  # the line is counted exactly, also past the reader's first chunk
    good = row("A cat.", "Eine Katze.").encode() + b"\n"
    later.write_bytes(good * 3000 + row("A little man.", "Ein Männchen.").encode("latin-1") + b"\n")
    with pytest.raises(InputError) as error:
        list(read_translation_file(str(later), "en", "de"))
    assert str(error.value) == f"{later}:3001: not UTF-8 text (invalid continuation byte at byte {column} of the line)"
    with pytest.raises(InputError, match=r"missing.jsonl: no such file$"):
        list(read_translation_file(str(tmp_path / "missing.jsonl"), "en", "de"))


@pytest.mark.parametrize(
    "line, message",
    [
        (HOSTILE_LINES[1], r":1: not valid JSON \(Expecting value at column 1\)$"),
        (HOSTILE_LINES[2], r":1: not UTF-8 text \(invalid start byte at byte 1 of the line\)$"),
        (HOSTILE_LINES[3], r":1: not a translation row \(JSON nested too deeply to read\)$"),
        (HOSTILE_LINES[4], r":1: not a translation row \(Exceeds the limit \(4300 digits\)"),
        (HOSTILE_LINES[5], r":1: the key 'en' appears twice in one object$"),
        (HOSTILE_LINES[6], r":1: the 'en' sentence is not Unicode text \(a lone surrogate '\\ud800' at character 1\)$"),
        (b'{"translation": {"en": "a\x00"}}', r":1: not valid JSON \(Invalid control character at column 26\)"),
    ],
)
def test_hostile_rows_are_errors_naming_file_and_line(tmp_path, line, message):
    path = write_bytes_lines(tmp_path, "hostile.jsonl", [line])
    with pytest.raises(InputError, match=re.escape(path) + message):
        list(read_translation_file(path, "en", "de"))


def test_a_byte_order_mark_line_separators_and_a_10_mb_sentence_are_read_as_text(tmp_path):
    long_sentence = "x" * 10_000_000
    lines = [row("A cat.", "Eine Katze.").encode(), HOSTILE_LINES[7], row(long_sentence, "lang").encode()]
    path = write_bytes_lines(tmp_path, "pairs.jsonl", lines, bom=True)
    assert list(read_translation_file(path, "en", "de")) == [
        ("A cat.", "Eine Katze."),
        ("a\u2028b", "c\u0085d"),
        (long_sentence, "lang"),
    ]
    text = write_bytes_lines(tmp_path, "sentences.txt", [b"A cat.", "a\u2028b \u0085c".encode()], bom=True)
    assert list(read_text_file(text)) == ["A cat.", "a\u2028b \u0085c"]


@FUZZ_SETTINGS
@given(lines=st.lists(RAW_LINES, max_size=5), bom=st.booleans())
@example(lines=HOSTILE_LINES, bom=False)
def test_any_translation_file_gives_checked_pairs_or_one_line_naming_file_and_line(lines, bom):
    read = read_fuzzed_file(lambda path: list(read_translation_file(path, "en", "de")), lines, bom, "fuzz.jsonl")
    if read is None:
        return
    pairs, _ = read
    assert 0 < len(pairs) <= len(lines)
    for pair in pairs:
        for sentence in pair:
            assert isinstance(sentence, str) and sentence.strip() and sentence.encode("utf-8")


@FUZZ_SETTINGS
@given(lines=st.lists(RAW_LINES, max_size=5), bom=st.booleans())
def test_any_text_file_gives_its_non_blank_lines_or_one_line_naming_file_and_line(lines, bom):
    read = read_fuzzed_file(lambda path: list(read_text_file(path)), lines, bom, "fuzz.txt")
    if read is None:
        return
    sentences, text = read
    assert sentences == [line.rstrip("\r") for line in text.split("\n") if line.strip()]


def test_read_text_file_yields_the_non_blank_lines(tmp_path):
    path = tmp_path / "sentences.txt"
    path.write_text("A cat.\r\n\n  \nTwo dogs play.\n  spaces kept  \nno newline at the end", encoding="utf-8")
    assert list(read_text_file(str(path))) == ["A cat.", "Two dogs play.", "  spaces kept  ", "no newline at the end"]
    with pytest.raises(InputError, match=r"empty.txt: no sentences \(the file is empty\)"):
        list(read_text_file(write_lines(tmp_path / "empty.txt", ["", " "])))
    with pytest.raises(InputError, match=r"missing.txt: no such file"):
        list(read_text_file(str(tmp_path / "missing.txt")))


def test_file_sentences_reads_translation_files_as_source_target_and_text_files_as_lines(tmp_path):
    jsonl = write_lines(tmp_path / "pairs.jsonl", [row(*PAIRS[0]), row(*PAIRS[1])])
    json_file = write_lines(tmp_path / "pairs.json", [row(*PAIRS[2])])
    text = write_lines(tmp_path / "more.en", ["A bird.", "", "A horse."])
    assert list(file_sentences([jsonl, text, json_file], "en", "de")) == [
        "A cat.",
        "Eine Katze.",
        "Two dogs play.",
        "Zwei Hunde spielen.",
        "A bird.",
        "A horse.",
        "A man.",
        "Ein Mann.",
    ]
    assert list(file_sentences([json_file], "de", "en")) == ["Ein Mann.", "A man."]


def test_load_translation_split_from_a_file_with_max_samples(tmp_path):
    path = write_lines(tmp_path / "pairs.jsonl", [row(*pair) for pair in PAIRS])
    split = load_translation_split(path, None, None, "train", "en", "de", max_samples=2)
    assert isinstance(split, datasets.Dataset)
    assert split.column_names == ["source", "target"] and len(split) == 2
    assert split["source"] == ["A cat.", "Two dogs play."] and split["target"] == ["Eine Katze.", "Zwei Hunde spielen."]
    everything = load_translation_split(path, None, None, "train", "de", "en")
    assert list(zip(everything["target"], everything["source"], strict=True)) == PAIRS


@pytest.mark.parametrize("form", ["jsonl", "parquet", "saved"])
@pytest.mark.parametrize("layout", HUB_LAYOUTS)
def test_read_dataset_takes_either_hub_layout_in_any_local_form(tmp_path, layout, form):
    make = HUB_LAYOUTS[layout]
    splits = {
        "train": [make(*PAIRS[0]), make(*PAIRS[1])],
        "validation": [make(*PAIRS[2])],
        "test": [make("A horse.", "Ein Pferd.")],
    }
    folder = write_dataset(tmp_path / "dataset", splits, form)
    assert list(read_dataset(folder, None, "train", "en", "de")) == PAIRS[:2]
    assert list(read_dataset(folder, None, "validation", "de", "en")) == [("Ein Mann.", "A man.")]
    test = load_translation_split(None, folder, None, "test", "en", "de")
    assert test.to_dict() == {"source": ["A horse."], "target": ["Ein Pferd."]}
    first = load_translation_split(None, folder, None, "train", "en", "de", max_samples=1)
    assert first.to_dict() == {"source": ["A cat."], "target": ["Eine Katze."]}


@pytest.mark.parametrize("form", ["jsonl", "parquet"])  # a language a row lacks: a missing key, or an Arrow null
@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [{"en": "A cat.", "de": "Eine Katze."}, {"en": "A dog."}],
            "row 1: the row has no 'de' sentence (it has 'en')",
        ),
        (
            [{"translation": {"en": "A cat.", "de": "Eine Katze."}}, {"translation": {"en": "A dog."}}],
            "row 1: the translation has no 'de' sentence (it has 'en')",
        ),
        (
            [{"sourceString": "A cat.", "targetString": "Eine Katze."}],  # Helsinki-NLP/tatoeba_mt's columns
            "row 0: neither a 'translation' column nor a column named 'en' (the columns are 'sourceString', "
            "'targetString')",
        ),
        (
            [{"en": "A cat.", "fr": "Un chat."}],
            "row 0: neither a 'translation' column nor a column named 'de' (the columns are 'en', 'fr')",
        ),
        ([{"en": "A cat.", "de": " "}], "row 0: the 'de' sentence is empty"),
    ],
)
def test_a_dataset_row_of_neither_layout_names_dataset_split_row_and_language(tmp_path, form, rows, message):
    folder = write_dataset(tmp_path / "dataset", {"train": rows}, form)
    with pytest.raises(InputError) as error:
        list(read_dataset(folder, None, "train", "en", "de"))
    assert str(error.value) == f"{folder}[train] {message}"


def test_a_dataset_that_cannot_be_loaded_names_dataset_name(tmp_path):
    missing = str(tmp_path / "no_dataset")
    with pytest.raises(InputError) as error:
        list(read_dataset(missing, None, "train", "en", "de"))
    assert isinstance(error.value, ValueError)
    assert str(error.value).startswith(f"dataset_name {missing}[train]: cannot load it (")
    folder = write_dataset(tmp_path / "dataset", {"train": [HUB_LAYOUTS["translation column"](*PAIRS[0])]})
    with pytest.raises(InputError) as error:
        list(read_dataset(folder, None, "test", "en", "de"))
    assert str(error.value) == (
        f"dataset_name {folder}[test]: cannot load it (Unknown split \"test\". Should be one of ['train'].)"
    )
    with pytest.raises(InputError) as error:
        list(read_dataset(folder, "de-en", "train", "en", "de"))
    assert str(error.value).startswith(f"dataset_name {folder} (config de-en)[train]: cannot load it (")
    assert "'de-en' not found" in str(error.value)
    (tmp_path / "scripted").mkdir()  # as Helsinki-NLP/tatoeba_mt is: a loading script
    (tmp_path / "scripted" / "scripted.py").write_text("import datasets\n")
    with pytest.raises(InputError) as error:
        list(read_dataset(str(tmp_path / "scripted"), None, "test", "en", "de"))
    assert str(error.value) == (
        f"dataset_name {tmp_path / 'scripted'}[test]: cannot load it "
        "(Dataset scripts are no longer supported, but found scripted.py)"
    )
