"""The benchmarks as one command: `python -m bench NAME [flags]` runs bench/bench_NAME.py (or bench/NAME.py) as a
script, `python -m bench NAME --help` shows its flags, and `python -m bench` lists them. Each writes its raw results
to bench/results/; BENCHMARKS.md holds the commands and the figures."""

import ast
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NOT_BENCHMARKS = {"__init__", "__main__", "common"}


def benchmarks() -> dict[str, str]:
    """Each benchmark's name on the command line, and its module."""
    stems = sorted(name[:-3] for name in os.listdir(HERE) if name.endswith(".py"))
    return {stem.removeprefix("bench_"): f"bench.{stem}" for stem in stems if stem not in NOT_BENCHMARKS}


def summary(module: str) -> str:
    """The first line of a benchmark's docstring."""
    with open(os.path.join(HERE, module.removeprefix("bench.") + ".py"), encoding="utf-8") as file:
        docstring = ast.get_docstring(ast.parse(file.read())) or ""
    return docstring.splitlines()[0] if docstring else ""


def main() -> None:
    available = benchmarks()
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        width = max(map(len, available))
        print("usage: python -m bench NAME [flags]     (python -m bench NAME --help: its flags)\n")
        for name, module in available.items():
            print(f"  {name:<{width}}  {summary(module)}")
        sys.exit(0 if len(sys.argv) > 1 else 2)
    name = sys.argv[1]
    if name not in available:
        sys.exit(f"python -m bench: no benchmark {name!r}; run `python -m bench` for the list")
    sys.argv = [f"python -m bench {name}", *sys.argv[2:]]
    runpy.run_module(available[name], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
