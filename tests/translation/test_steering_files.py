"""The input and steering files (translation/steering_files.py) against hostile input: any file gives its lines, or
lists of usable phrases, or one line of error naming the file and line, never a traceback; what it gives is text a
translation could hold. Through vanilla-translate: a bad prefix, constraints or avoid file is refused before any
model loads, and terms for a blank line are a warning."""

import os
import tempfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hf_vanilla_transformer.cli.translate import main as translate_main
from hf_vanilla_transformer.decoding.request import SteeringError
from hf_vanilla_transformer.translation.steering_files import (
    MARKUP,
    read_avoid,
    read_constraints,
    read_lines,
    read_prefixes,
)
from support.files import write_bytes_lines
from support.hostile import (
    FUZZ_SETTINGS,
    HOSTILE_LINES,
    JSON_VALUES,
    RAW_LINES,
    assert_one_line_error,
    read_fuzzed_file,
)
from support.steering import translate_input

STEERING_LINES = st.one_of(
    RAW_LINES,
    st.sampled_from([*HOSTILE_LINES, b'["</s>"]', b'["\\u200b"]', b'["a\\nb"]', b'"<b>"', b'["\\ud800"]']),
    st.lists(st.text(max_size=12), max_size=3).map(lambda terms: repr(terms).replace("'", '"').encode()),
    JSON_VALUES.map(lambda value: repr([value]).encode()),
)


def usable(phrase: str) -> bool:
    """A phrase a translation could hold: Unicode text, something visible, no control character, no markup."""
    phrase.encode("utf-8")
    categories = {unicodedata.category(character) for character in phrase}
    return "Cc" not in categories and bool(categories - {"Cf", "Zs", "Zl", "Zp"}) and not MARKUP.search(phrase)


@FUZZ_SETTINGS
@given(lines=st.lists(STEERING_LINES, max_size=5), bom=st.booleans())
def test_any_constraints_avoid_or_prefix_file_is_read_or_refused_in_one_line(lines, bom):
    for reader in (read_constraints, read_avoid, read_prefixes):
        with tempfile.TemporaryDirectory() as folder:
            path = write_bytes_lines(Path(folder), "steer.txt", lines, bom)
            count = Path(path).read_bytes().count(b"\n")  # lines end at b"\n" only, and a line may hold one
            try:
                result = reader(path)
            except SteeringError as error:
                assert_one_line_error(error, f"{path}:")
                continue
        if reader is read_constraints:
            assert len(result) == count and all(usable(p) for phrases in result for p in phrases)
        elif reader is read_avoid:
            assert all(usable(phrase) for phrase in result)
        else:
            assert len(result) == count and not any(MARKUP.search(prefix) for prefix in result)


@FUZZ_SETTINGS
@given(lines=st.lists(RAW_LINES, max_size=5), bom=st.booleans())
def test_any_input_file_is_its_lines_or_one_line_naming_file_and_line(lines, bom):
    read = read_fuzzed_file(read_lines, lines, bom, "input.txt")
    if read is None:
        return
    got, text = read
    assert got == [line.rstrip("\r") for line in text.split("\n")[:-1]]


@pytest.mark.parametrize(
    "flag, content, message",
    [
        ("--prefix", "a\nb\n", "{path}: 2 line(s) for the 5 of {input}"),
        ("--constraints", '["a"]\n', "{path}: 1 line(s) for the 5 of {input}"),
        ("--constraints", '[]\n["a"\n[]\n[]\n[]\n', "{path}:2: not valid JSON"),
        ("--constraints", '[]\n{"a": 1}\n[]\n[]\n[]\n', "{path}:2: {{'a': 1}} is not a JSON list of strings"),
        ("--constraints", '[]\n[" "]\n[]\n[]\n[]\n', "{path}:2: "),
        ("--constraints", '[]\n[]\n[]\n["' + "a " * 60 + '"]\n[]\n', "{path}:4: the constraints' 60 tokens"),
        ("--prefix", "\n\n\n" + "a " * 60 + "\n\n", "{path}:4: the prefix's 60 tokens"),
    ],
)
def test_a_bad_prefix_or_constraints_file_is_one_line_naming_file_and_line(
    folders, tmp_path, capsys, flag, content, message
):
    path, output = tmp_path / "steer.txt", tmp_path / "out.txt"
    path.write_text(content)
    status, _, err = translate_input(capsys, folders, "--output", str(output), flag, str(path))
    assert status == 2, err
    assert message.format(path=path, input=folders["input"]) in err and len(err.strip().splitlines()) == 1, err
    assert not output.exists()


BAD_TERMS = [
    ('["</s>"]', "holds '</s>', which is markup, not text"),
    ('["<unk>"]', "holds '<unk>', which is markup, not text"),
    ('["a <s>"]', "holds '<s>', which is markup, not text"),
    ('["a", 3]', "int 3 is not a string"),
    ('"a"', "'a' is not a JSON list of strings"),
    ("[" * 100_000 + "]" * 100_000, "not a JSON list of strings (JSON nested too deeply to read)"),
    ('["\\ud800"]', "is not Unicode text (a lone surrogate '\\ud800' at character 1)"),
    ('["\\u200b\\u200b"]', "has no visible characters"),
    ('["a\\u0000b"]', "holds the control character '\\x00'"),
]


@pytest.mark.parametrize(
    "flag, line, message",
    [
        (flag, line, message)
        for flag in ("--constraints", "--avoid")
        for line, message in BAD_TERMS
        if not (flag == "--avoid" and line == '"a"')  # one string a line is an avoid file's own form
    ],
)
def test_a_bad_term_is_one_line_naming_file_and_line_before_any_model_loads(
    folders, tmp_path, capsys, flag, line, message
):
    """Refused before the weights are read: the folder's weights here are broken, and the error is the file's."""
    broken = tmp_path / "model"
    broken.mkdir()
    for file in os.listdir(folders["first"]):
        (broken / file).write_bytes((Path(folders["first"]) / file).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not weights")
    path, output = tmp_path / "terms.jsonl", tmp_path / "out.txt"
    path.write_text("[]\n" + line + "\n[]\n[]\n[]\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        translate_main(["--model", str(broken), "--input", folders["input"], "--output", str(output), flag, str(path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"{path}:2: " in err and message in err and len(err.strip().splitlines()) == 1, err
    assert not output.exists()


def test_special_tokens_or_markup_in_a_prefix_are_refused(folders, tmp_path, capsys):
    path = tmp_path / "prefix.txt"
    path.write_text("a\n\n\nj </s>\n\n")
    status, _, err = translate_input(capsys, folders, "--prefix", str(path))
    assert status == 2 and f"{path}:4: 'j </s>' holds '</s>', which is markup, not text" in err, err


def test_terms_for_a_blank_line_are_a_warning_and_a_healthy_run_has_none(folders, tmp_path, capsys, caplog):
    path = tmp_path / "terms.jsonl"
    path.write_text('["j"]\n[]\n[]\n[]\n[]\n')
    status, _, _ = translate_input(capsys, folders, "--constraints", str(path))
    assert status == 0 and not [record for record in caplog.records if record.levelname == "WARNING"]
    path.write_text('["j"]\n[]\n["a"]\n[]\n[]\n')
    status, _, _ = translate_input(capsys, folders, "--constraints", str(path))
    assert status == 0 and f"{path}:3: given for a blank line of input, which is not translated" in caplog.text
