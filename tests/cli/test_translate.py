"""The vanilla-translate command (hf_vanilla_transformer/cli/translate.py) on the trained runs: files and standard
streams, errors, memory, interruptions and a full disk (translate_lines itself: translation/test_lines.py)."""

import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from hf_vanilla_transformer.cli.translate import main as translate_main
from hf_vanilla_transformer.training.data import read_translation_file
from support.files import write_lines
from support.models import SENTENCES, generate_text
from support.paths import TEST, TRAIN
from support.processes import run_with_peak_rss
from support.runs import CHINESE_CHARACTER


def vanilla_translate(*args: str, stdin: str | bytes | None = None, **options) -> subprocess.CompletedProcess:
    command = shutil.which("vanilla-translate")
    assert command, "the vanilla-translate console script is not installed"
    options = {"text": not isinstance(stdin, bytes), **options}
    return subprocess.run([command, *args], input=stdin, capture_output=True, timeout=300, **options)


@pytest.fixture
def translate_here(capsys, monkeypatch):
    """The command's `main` in this process, for what needs no process of its own (starting Python with torch and
    transformers takes 10 to 15 s on a 2-core machine): `run(*args, stdin="")` gives the exit status and standard
    error the console script would (Python prints a `sys.exit` message on standard error and exits with 1)."""

    def run(*args: str, stdin: str = "") -> tuple[int, str]:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8"))
        capsys.readouterr()
        try:
            translate_main(list(args))
            status = 0
        except SystemExit as stop:
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
            status = 1 if isinstance(stop.code, str) else stop.code or 0
        return status, capsys.readouterr().err

    return run


def test_translate_command_keeps_order_and_empty_lines(trained_run, model_and_tokenizer, tmp_path, translate_here):
    lines = [SENTENCES[2], "", SENTENCES[0], "   ", SENTENCES[1]]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    files = ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")]
    status, stderr = translate_here(
        "--model", str(trained_run.output), *files, "--num_beams", "1", "--batch_size", "2", "--dtype", "float32"
    )
    assert status == 0, stderr
    expected = generate_text(*model_and_tokenizer, [SENTENCES[2], SENTENCES[0], SENTENCES[1]], num_beams=1)
    assert (tmp_path / "out.txt").read_text().split("\n") == [expected[0], "", expected[1], "", expected[2], ""]
    assert "3/3" in stderr  # the progress bar, on stderr

    piped = vanilla_translate("--model", str(trained_run.output), "--max_new_tokens", "3", stdin=SENTENCES[0] + "\n")
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1 and piped.stdout.strip()
    assert "sentence/s" not in piped.stderr
    assert "seem to have been set" not in piped.stderr  # --max_new_tokens replaces the model's max_length


def test_translate_command_writes_chinese_as_utf8_whatever_the_locale(chinese_run, tmp_path, translate_here):
    english = ["I like to eat apples.", "", "Where is the station?"]
    piped = vanilla_translate(
        "--model",
        str(chinese_run.output),
        stdin="\n".join(english).encode("utf-8"),
        env={**os.environ, "PYTHONIOENCODING": "ascii", "LC_ALL": "C"},
    )
    assert piped.returncode == 0, piped.stderr.decode()
    lines = piped.stdout.decode("utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == lines[3] == ""
    assert CHINESE_CHARACTER.search(lines[0]) and CHINESE_CHARACTER.search(lines[2]), lines
    (tmp_path / "in.txt").write_text("\n".join(english) + "\n", encoding="utf-8")
    status, _ = translate_here(
        "--model", str(chinese_run.output), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")
    )
    assert status == 0 and (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:3] == lines[:3]


def test_translate_command_errors(trained_run, tmp_path, translate_here):
    status, stderr = translate_here("--model", str(tmp_path / "nothing"), stdin="A dog.\n")
    assert status == 1
    assert stderr.strip() == f"vanilla-translate: error: {tmp_path / 'nothing'}: not a model folder (no config.json)"
    status, stderr = translate_here("--model", str(trained_run.output), "--input", str(tmp_path / "none.txt"))
    assert status == 2 and f"argument --input: {tmp_path / 'none.txt'}: no such file" in stderr
    (tmp_path / "latin1.txt").write_bytes("Ein Männchen\n".encode("latin-1"))
    status, stderr = translate_here("--model", str(trained_run.output), "--input", str(tmp_path / "latin1.txt"))
    assert status == 1 and "latin1.txt:1: not UTF-8 text (invalid continuation byte" in stderr


def test_binary_input_a_broken_model_and_blank_lines_end_cleanly(trained_run, tmp_path, translate_here):
    output = tmp_path / "out.txt"
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 4)  # line 2 starts after the newline (byte 11); 0x80 is its byte 118
    status, stderr = translate_here("--model", str(trained_run.output), "--input", str(binary), "--output", str(output))
    assert status == 1 and not output.exists()
    assert stderr.strip().splitlines() == [
        f"vanilla-translate: error: {binary}:2: not UTF-8 text (invalid start byte at byte 118 of the line)"
    ]
    broken = tmp_path / "model"
    shutil.copytree(trained_run.output, broken)
    (broken / "model.safetensors").write_bytes((broken / "model.safetensors").read_bytes()[:1000])
    status, stderr = translate_here("--model", str(broken), "--output", str(output), stdin="A dog.\n")
    assert status == 1 and not output.exists()
    assert stderr.strip().splitlines() == [
        f"vanilla-translate: error: {broken}/model.safetensors: not a readable safetensors file "
        "(Error while deserializing header: invalid header length)"
    ]
    status, _ = translate_here("--model", str(trained_run.output), "--output", str(output), stdin="\n  \n\n")
    assert status == 0 and output.read_text() == "\n\n\n"


def test_a_line_longer_than_the_model_is_translated_from_its_start_with_a_warning(
    trained_run, tmp_path, translate_here, caplog
):
    """A 1 MB line: cut before it is tokenized, translated from its first max_position_embeddings tokens, on its
    own line."""
    long_line = " ".join(["A man is sleeping."] * 50_000)
    (tmp_path / "in.txt").write_text(f"{SENTENCES[0]}\n{long_line}\n{SENTENCES[1]}\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    status, stderr = translate_here(
        "--model",
        str(trained_run.output),
        "--input",
        str(tmp_path / "in.txt"),
        "--output",
        str(output),
        "--num_beams",
        "1",
        "--max_new_tokens",
        "8",
    )
    assert status == 0, stderr[-2000:]
    assert (
        "1 line(s) have more tokens than the model's 1024 positions; only their first 1024 are translated (line 2)"
        in caplog.text
    )
    lines = output.read_text().split("\n")
    assert len(lines) == 4 and lines[3] == "" and all(lines[:3])


def multi30k_lines(count: int) -> list[str]:
    """`count` English lines: Multi30k's training sources, repeated."""
    sources = [source for source, _ in read_translation_file(TRAIN, "en", "de")]
    return list(itertools.islice(itertools.cycle(sources), count))


# float32: its translations do not depend on which lines share a batch (bfloat16's rounding does), so runs compare
FAST = ["--num_beams", "1", "--max_new_tokens", "8", "--batch_size", "256", "--dtype", "float32"]


def test_twenty_thousand_lines_in_memory_that_grows_with_the_text_alone(trained_run, tmp_path):
    """Only strings are kept (never a batch's tensors): 18,000 more lines cost well under 1 KB each."""
    peaks = {}
    for count in (2_000, 20_000):
        source = write_lines(tmp_path / f"{count}.en", multi30k_lines(count))
        output = tmp_path / f"{count}.de"
        command = [
            shutil.which("vanilla-translate"),
            "--model",
            str(trained_run.output),
            "--input",
            source,
            "--output",
            str(output),
            *FAST,
        ]
        returncode, stderr, peaks[count] = run_with_peak_rss(command)
        assert returncode == 0, stderr[-2000:]
        translations = output.read_text(encoding="utf-8").split("\n")
        assert len(translations) == count + 1 and translations[-1] == "" and all(translations[:-1])
    assert translations[:2000] == (tmp_path / "2000.de").read_text(encoding="utf-8").split("\n")[:2000]
    assert (peaks[20_000] - peaks[2_000]) / 18_000 < 1024, peaks


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_translation_leaves_no_output(trained_run, tmp_path, stop):
    source = write_lines(tmp_path / "in.en", multi30k_lines(20_000))
    output = tmp_path / "out.de"
    translating = subprocess.Popen(
        [
            shutil.which("vanilla-translate"),
            "--model",
            str(trained_run.output),
            "--input",
            source,
            "--output",
            str(output),
            *FAST,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    progress = ""
    while "sentence/s" not in progress and time.monotonic() < deadline:  # stopped mid-translation, not at start-up
        progress += translating.stderr.read(64)
    translating.send_signal(stop)
    stderr = progress + translating.stderr.read()
    assert translating.wait(timeout=60) == 128 + stop
    assert stderr.rstrip().splitlines()[-1] == "vanilla-translate: interrupted; nothing was written"
    assert "Traceback" not in stderr
    assert os.listdir(tmp_path) == ["in.en"]


def test_a_ctranslate2_folder_translates_as_the_model_folder_does(trained_run, exported, tmp_path, translate_here):
    """The same command on the export: order and empty lines kept, the progress bar, the model's decoding."""
    lines = [SENTENCES[2], "", SENTENCES[0], "   ", SENTENCES[1]]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    outputs = {}
    for name, model, options in (
        ("pytorch", str(trained_run.output), ["--dtype", "float32"]),
        ("ctranslate2", exported["float32"], ["--intra_threads", "2"]),
    ):  # float32 both
        output = tmp_path / f"{name}.txt"
        status, stderr = translate_here(
            "--model",
            model,
            "--input",
            str(tmp_path / "in.txt"),
            "--output",
            str(output),
            "--batch_size",
            "2",
            *options,
        )
        assert status == 0, stderr[-2000:]
        assert "3/3" in stderr
        outputs[name] = output.read_text().split("\n")
    assert outputs["ctranslate2"] == outputs["pytorch"]
    assert [bool(line) for line in outputs["ctranslate2"]] == [True, False, True, False, True, False]


def test_steering_the_trained_models_through_the_command_line(trained_run, chinese_run, tmp_path, translate_here):
    """The trained runs through vanilla-translate's steering flags: an n-best list whose log-probabilities are
    vanilla-score's of the same pairs, constraints met (a reference word, and Chinese characters inside a word),
    alignments within the words, and a prefix continued."""
    from hf_vanilla_transformer.cli.score import main as score_main

    pairs = list(read_translation_file(TEST, "en", "de"))[:6]
    (tmp_path / "in.en").write_text("".join(source + "\n" for source, _ in pairs))
    words = [next(word for word in reference.split() if len(word) >= 4 and word.isalpha()) for _, reference in pairs]
    (tmp_path / "terms.jsonl").write_text("".join(json.dumps([word]) + "\n" for word in words))
    (tmp_path / "prefix.de").write_text("".join(" ".join(reference.split()[:2]) + "\n" for _, reference in pairs))
    run = ["--model", str(trained_run.output), "--input", str(tmp_path / "in.en"), "--dtype", "float32"]
    status, stderr = translate_here(*run, "--n_best", "2", "--format", "jsonl", "--output", str(tmp_path / "nbest"))
    assert status == 0, stderr
    found = [json.loads(line)["translations"] for line in (tmp_path / "nbest").read_text().splitlines()]
    assert [len(hypotheses) for hypotheses in found] == [2] * len(pairs)
    (tmp_path / "src").write_text(
        "".join(source + "\n" for (source, _), hs in zip(pairs, found, strict=True) for _ in hs)
    )
    (tmp_path / "tgt").write_text("".join(h["translation"] + "\n" for hs in found for h in hs))
    score_main(
        [
            "--model",
            str(trained_run.output),
            "--source",
            str(tmp_path / "src"),
            "--target",
            str(tmp_path / "tgt"),
            "--dtype",
            "float32",
            "--output",
            str(tmp_path / "scores"),
        ]
    )
    scores = [float(line) for line in (tmp_path / "scores").read_text().splitlines()]
    assert scores == pytest.approx([h["log_probability"] for hs in found for h in hs], abs=1e-3)

    status, stderr = translate_here(
        *run, "--constraints", str(tmp_path / "terms.jsonl"), "--alignments", "--output", str(tmp_path / "constrained")
    )
    assert status == 0, stderr
    for word, (source, _), line in zip(words, pairs, (tmp_path / "constrained").read_text().splitlines(), strict=True):
        translation, alignment = line.split(" ||| ")
        assert f" {word}" in f" {translation}", (word, line)  # as tokens after a space: a suffix may follow
        for pair in alignment.split():
            i, j = map(int, pair.split("-"))
            assert i < len(source.split()) and j < len(translation.split())
    status, stderr = translate_here(*run, "--prefix", str(tmp_path / "prefix.de"), "--output", str(tmp_path / "p"))
    assert status == 0, stderr
    for (_, reference), line in zip(pairs, (tmp_path / "p").read_text().splitlines(), strict=True):
        assert line.startswith(" ".join(reference.split()[:2])) and len(line) > len(" ".join(reference.split()[:2]))

    (tmp_path / "in.zh-src").write_text("I like to eat apples.\n")
    (tmp_path / "zh-terms").write_text('["苹果"]\n')
    status, stderr = translate_here(
        "--model",
        str(chinese_run.output),
        "--input",
        str(tmp_path / "in.zh-src"),
        "--constraints",
        str(tmp_path / "zh-terms"),
        "--output",
        str(tmp_path / "zh"),
    )
    assert status == 0, stderr
    assert "苹果" in (tmp_path / "zh").read_text(encoding="utf-8")


def test_a_full_disk_is_one_line_and_leaves_the_old_output_whole(trained_run, tmp_path):
    """A file size limit (RLIMIT_FSIZE, under which Python's writes fail with EFBIG) stands in for a full disk: the
    translations do not fit, and the output of an earlier run stays as it was."""
    import resource

    source = write_lines(tmp_path / "in.en", multi30k_lines(300))
    output = tmp_path / "out.de"
    output.write_text("earlier\n")
    limit = 4096  # far less than 300 translations, more than anything else the command writes

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    command = ["--model", str(trained_run.output), "--input", source, "--output", str(output), *FAST]
    result = vanilla_translate(*command, preexec_fn=limited)
    assert result.returncode == 1
    error = f"vanilla-translate: error: [Errno 27] cannot write {output} (File too large)"
    assert result.stderr.splitlines()[-1] == error
    assert output.read_text() == "earlier\n" and sorted(os.listdir(tmp_path)) == ["in.en", "out.de"]
