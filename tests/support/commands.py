"""The console scripts run in this process on broken model folders, for the tests of what they refuse before any
work (their fixture, `work`, is in tests/conftest.py)."""

import pytest

from hf_vanilla_transformer.cli.attention import main as attention_main
from hf_vanilla_transformer.cli.export_ctranslate2 import main as export_ctranslate2_main
from hf_vanilla_transformer.cli.export_marian import main as export_marian_main
from hf_vanilla_transformer.cli.export_onnx import main as export_onnx_main
from hf_vanilla_transformer.cli.push_to_hub import main as push_to_hub_main
from hf_vanilla_transformer.cli.translate import main as translate_main

COMMANDS = {
    "vanilla-translate": translate_main,
    "vanilla-attention": attention_main,
    "vanilla-export-ctranslate2": export_ctranslate2_main,
    "vanilla-export-marian": export_marian_main,
    "vanilla-export-onnx": export_onnx_main,
    "vanilla-push-to-hub": push_to_hub_main,
}


def broken_work(tmp_path) -> dict:
    """`tmp_path` as a working folder with an input file, a model folder and a CTranslate2 folder, both broken, and
    each command's flags for them."""
    (tmp_path / "in.txt").write_text("a b\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{")
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "model.bin").write_bytes(b"not a model")
    return {
        "vanilla-translate": ["--model", "model", "--input", "in.txt", "--output", "out.txt"],
        "vanilla-attention": ["--model", "model", "--source", "a b", "--output_dir", "out"],
        "vanilla-export-ctranslate2": ["--model", "model", "--output_dir", "out"],
        "vanilla-export-marian": ["--model", "model", "--output_dir", "out"],
        "vanilla-export-onnx": ["--model", "model", "--output_dir", "out"],
        "vanilla-push-to-hub": ["--model", "model", "--repo_id", "someone/tiny"],
    }


def with_flags(argv: list[str], flags: list[str]) -> list[str]:
    """`argv` with `flags` added, a `--model` among them replacing argv's (a repeated --model is an ensemble)."""
    if "--model" in flags:
        model = argv.index("--model")
        argv = argv[:model] + argv[model + 2 :]
    return [*argv, *flags]


def files_under(folder) -> dict[str, bytes]:
    """Every file under `folder` (a link as the file it leads to) and what it holds."""
    return {str(path): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def run(command: str, argv: list[str], capsys) -> tuple[int, list[str]]:
    """The exit status and the lines of standard error of `command` run on `argv`, as its console script gives them:
    a `sys.exit(message)` prints the message and exits with status 1."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        COMMANDS[command](argv)
    code, stderr = exit_info.value.code, capsys.readouterr().err
    return (1, [*stderr.splitlines(), code]) if isinstance(code, str) else (code, stderr.splitlines())
