"""The benchmarks are one command, `python -m bench NAME`, and no benchmark imports another."""

import ast
import subprocess
import sys

import pytest

from support.paths import REPO_ROOT

BENCH = REPO_ROOT / "bench"


def bench(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *arguments], capture_output=True, text=True, cwd=REPO_ROOT)


def test_the_command_lists_every_benchmark_with_its_first_line():
    listed = bench().stdout
    names = sorted(path.stem.removeprefix("bench_") for path in BENCH.glob("*.py") if not path.stem.startswith("_"))
    names.remove("common")
    for name in names:
        assert f"\n  {name} " in listed, name
    assert "  recipe  " in listed and "Levers of a recipe" in listed


@pytest.mark.slow  # two processes that import torch and transformers
def test_a_name_runs_that_benchmark_and_an_unknown_one_is_refused():
    shown = bench("recipe", "--help")
    assert shown.returncode == 0 and "--match_steps" in shown.stdout
    unknown = bench("no_such_benchmark")
    assert unknown.returncode != 0
    assert "no benchmark 'no_such_benchmark'" in unknown.stderr


def test_benchmarks_share_pieces_through_common_only():
    for path in BENCH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
                assert node.module == "bench.common", f"{path.name} imports {node.module}"
