"""The benchmarks as one command: `python -m bench NAME [flags]` runs bench/GROUP/bench_NAME.py as a script,
`python -m bench NAME --help` shows its flags, and `python -m bench` lists them under their groups. Each writes its
raw results to bench/results/NAME/; BENCHMARKS.md holds the commands and the figures."""

import ast
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def first_line(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        docstring = ast.get_docstring(ast.parse(file.read())) or ""
    return docstring.splitlines()[0] if docstring else ""


def groups() -> dict[str, dict[str, str]]:
    """Each group (a sub-package holding bench_*.py modules), and in it each benchmark's name on the command line and
    its module."""
    found = {}
    for group in sorted(os.listdir(HERE)):
        folder = os.path.join(HERE, group)
        if not os.path.isfile(os.path.join(folder, "__init__.py")):
            continue
        stems = sorted(name[:-3] for name in os.listdir(folder) if name.startswith("bench_") and name.endswith(".py"))
        if stems:
            found[group] = {stem.removeprefix("bench_"): f"bench.{group}.{stem}" for stem in stems}
    return found


def module_path(module: str) -> str:
    return os.path.join(os.path.dirname(HERE), *module.split(".")) + ".py"


def main() -> None:
    grouped = groups()
    available = {name: module for benchmarks in grouped.values() for name, module in benchmarks.items()}
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        width = max(map(len, available))
        print("usage: python -m bench NAME [flags]     (python -m bench NAME --help: its flags)")
        for group, benchmarks in grouped.items():
            print(f"\n{group}: {first_line(os.path.join(HERE, group, '__init__.py'))}")
            for name, module in benchmarks.items():
                print(f"  {name:<{width}}  {first_line(module_path(module))}")
        sys.exit(0 if len(sys.argv) > 1 else 2)
    name = sys.argv[1]
    if name not in available:
        sys.exit(f"python -m bench: no benchmark {name!r}; run `python -m bench` for the list")
    sys.argv = [f"python -m bench {name}", *sys.argv[2:]]
    runpy.run_module(available[name], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
