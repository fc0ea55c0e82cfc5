"""The README's "The model in Python" block runs as written (in a scratch folder: it saves `my-transformer`), the
Chinese page's commands do, and every name the docs' Python blocks import from the package is there."""

import ast
import importlib
import re
import shlex
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from support.browser import served_demo
from support.paths import REPO_ROOT
from support.processes import free_port


def python_block(heading: str) -> str:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split(f"## {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def documented_imports() -> list[tuple[str, str, str]]:
    """(Markdown file, module, name) for each name a Python block of the README or docs/ imports from the package."""
    found = []
    for page in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "hf_vanilla_transformer":
                    found += [(page.name, node.module, alias.name) for alias in node.names]
    return found


def test_every_name_the_docs_import_from_the_package_is_there():
    imports = documented_imports()
    assert {page for page, _, _ in imports} >= {"README.md", "looking-inside.md"}
    missing = []
    for page, module, name in imports:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as error:
            missing.append(f"{page}: from {module} import {name}: {error}")
    assert missing == []


def test_the_model_in_python_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = {}
    exec(python_block("The model in Python"), names)
    model, translation, loss = names["model"], names["translation"], names["loss"]
    assert round(model.num_parameters() / 1e6, 1) == 63.0  # Table 3's base model with 37,000 tokens
    assert loss.item() > 0 and translation[0, 0].item() == model.config.decoder_start_token_id
    assert translation.shape[1] <= 1 + 4 + 50  # <s>, then at most the source length + 50 tokens
    assert (tmp_path / "my-transformer" / "model.safetensors").is_file()
    assert type(model).__name__ == "VanillaTransformerForConditionalGeneration"


CHINESE_PAGE = REPO_ROOT / "README_zh-hans.md"
# what turns the page's two 24-minute trainings into a minute's check: fewer steps and sentences, nothing else
SHORT_RUN = ["--max_steps", "4", "--max_train_samples", "500", "--max_eval_samples", "4", "--max_predict_samples", "4"]


def bash_commands(page: Path) -> list[str]:
    """Every command line of the page's bash blocks, in order, without its comment."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    lines = (line.split(" #")[0].strip() for block in blocks for line in block.splitlines())
    return [line for line in lines if line]


@pytest.mark.slow
def test_the_chinese_pages_commands_run_as_written(tmp_path):
    """README_zh-hans.md from top to bottom: each command as written, but for its runs going to tmp_path, the two
    trainings shortened by SHORT_RUN, and the demo on a free port. The set-up and test commands are .ci/run's own."""
    commands = bash_commands(CHINESE_PAGE)
    assert commands[:2] == ["./setup.sh", "python -m pytest"]
    runs = tmp_path / "runs"
    printed = {}
    for command in commands[2:]:
        command = command.replace(" runs/", f" {runs}/")
        if command.startswith("python run_translation.py recipes/"):
            recipe = yaml.safe_load((REPO_ROOT / command.split()[2]).read_text(encoding="utf-8"))
            output_dir = runs / Path(recipe["output_dir"]).name
            flags = [*SHORT_RUN, "--output_dir", str(output_dir)]
            subprocess.run([*shlex.split(command), *flags], cwd=REPO_ROOT, check=True, capture_output=True)
            assert (output_dir / "model.safetensors").is_file() and (output_dir / "generated_predictions.txt").is_file()
        elif command.startswith("python demo/app.py"):
            demo = [*shlex.split(command), "--port", str(free_port())]
            with served_demo(demo, tmp_path / "demo.log") as url, urllib.request.urlopen(url, timeout=30) as page:
                assert "gradio" in page.read().decode("utf-8").lower()
        else:
            result = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, f"{command}\n{result.stderr}"
            printed[command] = result.stdout
    translations = [out for command, out in printed.items() if "vanilla-translate" in command]
    assert len(translations) == 2 and all(out.count("\n") == 1 for out in translations), printed
    assert (tmp_path / "attention-zh" / "attention.html").is_file()

    section = CHINESE_PAGE.read_text(encoding="utf-8").split("```python\n", 1)[1].split("```", 1)[0]
    names = {}
    exec(section.replace('"runs/', f'"{runs}/'), names)
    assert isinstance(names["translator"]("I like to eat apples.")[0]["translation_text"], str)
