"""The benchmarks are one command, `python -m bench NAME`, listed under their groups; no benchmark imports another,
and every results file is bench/results/NAME/DATE[_LABEL].json."""

import ast
import re
import subprocess
import sys

import pytest

from support.paths import REPO_ROOT

BENCH = REPO_ROOT / "bench"
BENCHMARKS = sorted(BENCH.glob("*/bench_*.py"))


def bench(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *arguments], capture_output=True, text=True, cwd=REPO_ROOT)


def test_the_command_lists_every_benchmark_under_its_group_and_no_helper():
    listed = bench().stdout
    groups = re.split(r"\n\n(?=\w+: )", listed)[1:]
    under = {group.split(":", 1)[0]: group for group in groups}
    for path in BENCHMARKS:
        assert f"\n  {path.stem.removeprefix('bench_')} " in under[path.parent.name], path
    assert sorted(under) == ["baselines", "quality", "recipe", "scale", "speed"]
    assert "  recipe  " in listed and "Levers of a recipe" in listed
    for helper in (BENCH / "helpers").glob("*.py"):
        assert f"  {helper.stem} " not in listed, helper.stem


def test_benchmark_names_are_unique_and_each_group_lists_its_modules():
    names = [path.stem for path in BENCHMARKS]
    assert len(names) == len(set(names))
    assert sorted(path.name for path in BENCH.glob("*.py")) == ["__init__.py", "__main__.py"]
    for group in {path.parent for path in BENCHMARKS} | {BENCH / "helpers"}:
        docstring = ast.get_docstring(ast.parse((group / "__init__.py").read_text(encoding="utf-8")))
        for module in group.glob("*.py"):
            if module.stem != "__init__":
                assert f"- {module.stem}:" in docstring, f"{group.name}/__init__.py lacks {module.stem}"


@pytest.mark.slow  # processes that import torch and transformers
def test_a_name_runs_that_benchmark_a_helper_runs_as_a_module_and_an_unknown_name_is_refused():
    shown = bench("recipe", "--help")
    assert shown.returncode == 0 and "--match_steps" in shown.stdout
    helper = [sys.executable, "-m", "bench.helpers.make_big_corpus", "--help"]
    assert "--pairs" in subprocess.run(helper, capture_output=True, text=True, cwd=REPO_ROOT).stdout
    unknown = bench("no_such_benchmark")
    assert unknown.returncode != 0
    assert "no benchmark 'no_such_benchmark'" in unknown.stderr
    assert bench("make_big_corpus").returncode != 0  # helpers are not benchmarks


def test_benchmarks_share_pieces_through_common_only():
    for path in BENCH.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
                assert node.module == "bench.helpers.common", f"{path.name} imports {node.module}"


def test_results_are_filed_by_benchmark_and_date():
    names = {path.stem.removeprefix("bench_") for path in BENCHMARKS}
    for path in (BENCH / "results").rglob("*"):
        if path.is_file():
            relative = path.relative_to(BENCH / "results")
            assert len(relative.parts) == 2 and relative.parts[0] in names, relative
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}(_[A-Za-z0-9_]+)?\.json", relative.name), relative


def test_results_path_builds_that_name(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench.helpers.common import results_path

    results = BENCH / "results"
    assert results_path("decoding", "small", "2000-01-31") == str(results / "decoding" / "2000-01-31_small.json")
    assert results_path("onnx", date="2000-01-31") == str(results / "onnx" / "2000-01-31.json")
