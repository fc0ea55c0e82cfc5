"""The console scripts' contract with a new user (cli/flags.py): a flag value that cannot work, a device this machine
lacks, a missing optional package, an output that would replace what the command reads: each is one line that
names the flag or value, and a non-zero exit before any work (exit status 2 for a value argparse checks and for an
output folder the command does not own, 1 for the rest), with nothing written and no model loaded.

The model folders here are broken (a config.json that is not JSON, a CTranslate2 model.bin of garbage): a command
that got as far as loading one would fail on it with another message."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from support.commands import files_under, run, with_flags
from support.processes import NotInstalled, not_installed_env


def absent_torch_device() -> str:
    """A device torch does not find here: cuda where there is no accelerator, else one past the last."""
    if not torch.accelerator.is_available():
        return "cuda"
    return f"{torch.accelerator.current_accelerator().type}:{torch.accelerator.device_count()}"


@pytest.mark.parametrize(
    "command, flags, message",
    [
        ("vanilla-translate", ["--batch_size", "-3"], "argument --batch_size: -3 must be at least 1"),
        ("vanilla-translate", ["--batch_size", "0"], "argument --batch_size: 0 must be at least 1"),
        ("vanilla-translate", ["--batch_size", "8.5"], "argument --batch_size: '8.5' is not a whole number"),
        ("vanilla-translate", ["--num_beams", "0"], "argument --num_beams: 0 must be at least 1"),
        ("vanilla-translate", ["--num_beams", "-1"], "argument --num_beams: -1 must be at least 1"),
        ("vanilla-translate", ["--length_penalty", "nan"], "argument --length_penalty: nan is not a finite number"),
        ("vanilla-translate", ["--length_penalty", "inf"], "argument --length_penalty: inf is not a finite number"),
        ("vanilla-translate", ["--max_new_tokens", "0"], "argument --max_new_tokens: 0 must be at least 1"),
        ("vanilla-translate", ["--max_new_tokens", "-1"], "argument --max_new_tokens: -1 must be at least 1"),
        ("vanilla-translate", ["--threads", "0"], "argument --threads: 0 must be at least 1"),
        ("vanilla-translate", ["--inter_threads", "0"], "argument --inter_threads: 0 must be at least 1"),
        ("vanilla-translate", ["--intra_threads", "-1"], "argument --intra_threads: -1 must be at least 1"),
        ("vanilla-translate", ["--compute_type", "nonsense"], "argument --compute_type: invalid choice: 'nonsense'"),
        ("vanilla-translate", ["--device", "nonsense"], "argument --device: device 'nonsense' is not a device name"),
        ("vanilla-translate", ["--input", "none.txt"], "argument --input: none.txt: no such file"),
        ("vanilla-translate", ["--input", "model"], "argument --input: model: a folder, not a file"),
        (
            "vanilla-translate",
            ["--output", "missing/out.txt"],
            "argument --output: missing/out.txt: there is no folder missing to write it in",
        ),
        ("vanilla-translate", ["--output", "model"], "argument --output: model is a folder"),
        ("vanilla-attention", ["--layer", "0"], "argument --layer: 0 must be at least 1"),
        ("vanilla-attention", ["--head", "-2"], "argument --head: -2 must be at least 1"),
        ("vanilla-attention", ["--top_k", "0"], "argument --top_k: 0 must be at least 1"),
        (
            "vanilla-attention",
            ["--num_beams", "2"],
            "argument --num_beams: only the beam-search table of --steps (without --target) has beams",
        ),
        ("vanilla-attention", ["--device", "gpu"], "argument --device: device 'gpu' is not a device name"),
        ("vanilla-export-ctranslate2", ["--quantization", "int4"], "argument --quantization: invalid choice: 'int4'"),
        ("vanilla-push-to-hub", ["--repo_id", "my model"], "argument --repo_id: Repo id must use alphanumeric chars"),
    ],
)
def test_a_flag_value_that_cannot_work_is_one_line_and_exit_status_2(work, tmp_path, capsys, command, flags, message):
    before = files_under(tmp_path)
    code, stderr = run(command, [*work[command], *flags], capsys)
    assert code == 2 and len(stderr) == 1, stderr
    assert stderr[0].startswith(f"{command}: error: {message}") and stderr[0].endswith(" (see --help)"), stderr
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("output", ["in.txt", "./in.txt", "{tmp}/in.txt", "link.txt", "hard-link.txt"])
def test_an_output_that_is_the_input_file_is_refused_and_the_input_kept(work, tmp_path, capsys, output):
    """The same file by another path, a symbolic or a hard link: the translations would replace the sentences."""
    os.symlink("in.txt", tmp_path / "link.txt")
    os.link(tmp_path / "in.txt", tmp_path / "hard-link.txt")
    before = files_under(tmp_path)
    output = output.format(tmp=tmp_path)
    code, stderr = run("vanilla-translate", ["--model", "model", "--input", "in.txt", "--output", output], capsys)
    assert code == 2
    assert stderr == [
        f"vanilla-translate: error: argument --output: {output} is the input file in.txt; it would be replaced "
        "(see --help)"
    ]
    assert files_under(tmp_path) == before


def test_a_device_this_machine_lacks_is_one_line_before_the_model_is_read(work, tmp_path, capsys):
    import ctranslate2

    absent = absent_torch_device()
    cuda_devices = ctranslate2.get_cuda_device_count()
    absent_for_ctranslate2 = f"cuda:{cuda_devices}" if cuda_devices else "cuda"
    before = files_under(tmp_path)
    for command, flags, message in [
        ("vanilla-translate", ["--device", absent], f"device {absent}: torch {torch.__version__} finds "),
        ("vanilla-attention", ["--device", absent], f"device {absent}: torch {torch.__version__} finds "),
        (
            "vanilla-translate",
            ["--model", "ct2", "--device", absent_for_ctranslate2],
            f"device {absent_for_ctranslate2}: CTranslate2 {ctranslate2.__version__} finds ",
        ),
    ]:
        code, stderr = run(command, with_flags(work[command], flags), capsys)
        assert code == 1 and len(stderr) == 1 and stderr[0].startswith(f"{command}: error: {message}"), stderr
    assert files_under(tmp_path) == before


@pytest.mark.parametrize(
    "command", ["vanilla-attention", "vanilla-export-ctranslate2", "vanilla-export-marian", "vanilla-export-onnx"]
)
@pytest.mark.parametrize("output_dir", ["model", ".", "{tmp}"])
def test_an_output_dir_that_is_or_holds_the_model_is_refused_even_with_overwrite(
    work, tmp_path, capsys, command, output_dir
):
    output_dir = output_dir.format(tmp=tmp_path)
    before = files_under(tmp_path)
    flags = [*work[command], "--output_dir", output_dir, "--overwrite_output_dir"]
    code, stderr = run(command, flags, capsys)
    kept = "model, which this command reads" if output_dir == "model" else f"the working folder {tmp_path}"
    message = f"output_dir {output_dir} is or holds {kept}; writing there would destroy it"
    assert (code, stderr) == (2, [f"{command}: error: {message}"])
    assert files_under(tmp_path) == before


EXTRAS_MISSING = [
    ("vanilla-translate", ["--model", "ct2"], "ctranslate2", "translating a CTranslate2 folder", "fast"),
    ("vanilla-attention", [], "matplotlib", "drawing attention pictures", "pictures"),
    ("vanilla-export-ctranslate2", [], "ctranslate2", "exporting to CTranslate2", "fast"),
    ("vanilla-export-onnx", [], "onnx", "exporting to ONNX", "onnx"),
]


def missing_extra_line(command: str, package: str, purpose: str, extra: str) -> str:
    return (
        f"{command}: error: {purpose} needs the {package} package, which the [{extra}] extra installs: "
        f'pip install -e ".[{extra}]" in this repository (or pip install {package})'
    )


@pytest.mark.parametrize("command, flags, package, purpose, extra", EXTRAS_MISSING)
def test_a_missing_extra_is_one_line_naming_it_before_the_model_is_read(
    work, tmp_path, capsys, monkeypatch, command, flags, package, purpose, extra
):
    """In this process, with the package made not importable (a meta-path finder ahead of the real ones, the
    package taken out of sys.modules for the test); test_without_the_extras_the_console_scripts_say_which below
    runs the console scripts in a Python where it was never importable."""
    monkeypatch.setattr(sys, "meta_path", [NotInstalled(package), *sys.meta_path])
    monkeypatch.delitem(sys.modules, package, raising=False)
    before = files_under(tmp_path)
    code, stderr = run(command, with_flags(work[command], flags), capsys)
    assert (code, stderr) == (1, [missing_extra_line(command, package, purpose, extra)])
    assert files_under(tmp_path) == before


@pytest.mark.slow  # two fresh Pythons: 5 s of imports each
def test_without_the_extras_the_console_scripts_say_which(work, tmp_path):
    environment = not_installed_env(tmp_path / "blocker", "ctranslate2", "matplotlib")
    before = files_under(tmp_path / "model") | files_under(tmp_path / "ct2")
    for command, flags, package, purpose, extra in EXTRAS_MISSING[:2]:
        result = subprocess.run(
            [shutil.which(command), *with_flags(work[command], flags)],
            env=environment,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 1
        assert result.stderr.splitlines() == [missing_extra_line(command, package, purpose, extra)]
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "out").exists()
    assert files_under(tmp_path / "model") | files_under(tmp_path / "ct2") == before
