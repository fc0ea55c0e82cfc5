"""The vanilla-translate command (hf_vanilla_transformer/translate.py)."""

import os
import shutil
import subprocess
import sys

from helpers import CHINESE_CHARACTER, SENTENCES, generate_text


def vanilla_translate(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    command = shutil.which("vanilla-translate")
    assert command, "the vanilla-translate console script is not installed"
    return subprocess.run([command, *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_translate_command_keeps_order_and_empty_lines(trained_run, model_and_tokenizer, tmp_path):
    lines = [SENTENCES[2], "", SENTENCES[0], "   ", SENTENCES[1]]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    files = ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")]
    result = vanilla_translate("--model", str(trained_run.output), *files, "--num_beams", "1", "--batch_size", "2")
    assert result.returncode == 0, result.stderr
    expected = generate_text(*model_and_tokenizer, [SENTENCES[2], SENTENCES[0], SENTENCES[1]], num_beams=1)
    assert (tmp_path / "out.txt").read_text().split("\n") == [expected[0], "", expected[1], "", expected[2], ""]
    assert "3/3" in result.stderr  # the progress bar, on stderr

    piped = subprocess.run(
        [sys.executable, "-m", "hf_vanilla_transformer.translate", "--model", str(trained_run.output),
         "--max_new_tokens", "3"],
        input=SENTENCES[0] + "\n", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1 and piped.stdout.strip()
    assert "sentence/s" not in piped.stderr


def test_translate_command_writes_chinese_as_utf8_whatever_the_locale(chinese_run, tmp_path):
    english = ["I like to eat apples.", "", "Where is the station?"]
    piped = subprocess.run(
        [sys.executable, "-m", "hf_vanilla_transformer.translate", "--model", str(chinese_run.output)],
        input="\n".join(english).encode("utf-8"), capture_output=True, timeout=300,
        env={**os.environ, "PYTHONIOENCODING": "ascii", "LC_ALL": "C"},
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr.decode()
    lines = piped.stdout.decode("utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == lines[3] == ""
    assert CHINESE_CHARACTER.search(lines[0]) and CHINESE_CHARACTER.search(lines[2]), lines
    (tmp_path / "in.txt").write_text("\n".join(english) + "\n", encoding="utf-8")
    to_file = vanilla_translate("--model", str(chinese_run.output), "--input", str(tmp_path / "in.txt"),
                                "--output", str(tmp_path / "out.txt"))  # fmt: skip
    assert to_file.returncode == 0 and (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:3] == lines[:3]


def test_translate_command_errors(trained_run, tmp_path):
    missing_model = vanilla_translate("--model", str(tmp_path / "nothing"), stdin="A dog.\n")
    assert missing_model.returncode == 1
    message = f"vanilla-translate: error: --model {tmp_path / 'nothing'}: not a model folder (no config.json)"
    assert missing_model.stderr.strip() == message
    missing_input = vanilla_translate("--model", str(trained_run.output), "--input", str(tmp_path / "none.txt"))
    assert missing_input.returncode == 1 and "none.txt: no such file" in missing_input.stderr
    (tmp_path / "latin1.txt").write_bytes("Ein Männchen\n".encode("latin-1"))
    not_utf8 = vanilla_translate("--model", str(trained_run.output), "--input", str(tmp_path / "latin1.txt"))
    assert not_utf8.returncode == 1 and "latin1.txt: not UTF-8 text" in not_utf8.stderr
