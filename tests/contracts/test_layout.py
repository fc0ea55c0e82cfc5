"""The package's layout shows its architecture: the model files a saved folder carries import nothing else of the
package, each folder imports only the folders below it, no module imports another back (no cycle), and translating a
line imports no export, inspection or sharing code.

    model                the files every saved folder carries (copied flat beside the weights)
    errors, files,       one concept each: one-line messages; reading and writing files; the files of each format;
    formats, hardware,   devices and CPU probing; optional packages; checked loading of a model folder
    extras, loading
    training  decoding   the paper's recipe on the Trainer; the decoding features (neither imports the other)
    engines              what translates a folder, behind one interface
    translation          files of lines translated and scored with any engine, and the one output module
    inspection           attention and decoding step by step (may import decoding)
    sharing              the card and the Hub (may import inspection, for the card's picture)
    export               a module a format (may import engines, for their format names, and sharing)
    cli                  the command lines
    tools                former import paths, kept for one release: nothing imports them
"""

import ast
import configparser
import graphlib
import importlib
import re
from pathlib import Path

from support.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "hf_vanilla_transformer"
BASE = {"errors", "files", "formats", "hardware", "extras", "loading"}
# what each layer may import from the package, besides itself
MAY_IMPORT = {
    "model": set(),
    "base": {"model"},
    "training": {"model", "base"},
    "decoding": {"model", "base"},
    "engines": {"model", "base", "decoding"},
    "translation": {"model", "base", "decoding", "engines"},
    "inspection": {"model", "base", "decoding"},
    "sharing": {"model", "base", "inspection"},
    "export": {"model", "base", "decoding", "engines", "sharing"},
    "cli": {"model", "base", "training", "decoding", "engines", "translation", "inspection", "sharing", "export"},
    "tools": {"model", "base", "decoding", "engines", "translation", "inspection", "sharing", "export"},
    "": {"model"},  # the package's __init__: it registers the model with transformers' auto classes
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


def layer(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return ""
    return "base" if parts[0] in BASE else parts[0]


def imports(path: Path) -> set[str]:
    """The package's modules that `path` imports, at its top or inside a function, absolute or relative."""
    found, own = set(), module_name(path).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [base])])
            names = [f"{base}.{alias.name}" for alias in node.names]
            found.update(name if name in MODULES else base for name in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "hf_vanilla_transformer"}


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
GRAPH = {module: imports(path) - {module} for module, path in MODULES.items()}


def test_the_files_a_saved_folder_carries_import_nothing_else_of_the_package():
    model = {module for module in MODULES if layer(module) == "model"}
    assert {"hf_vanilla_transformer.model.modeling_vanilla_transformer"} < model
    for module in model:
        assert GRAPH[module] <= model, f"{module} imports {sorted(GRAPH[module] - model)}"


def test_each_layer_imports_only_the_layers_below_it():
    wrong = [
        f"{module} ({layer(module) or 'the package'}) imports {imported}"
        for module, imported_modules in GRAPH.items()
        for imported in sorted(imported_modules)
        if layer(imported) != layer(module)
        and layer(imported) not in MAY_IMPORT[layer(module)]
        and imported != "hf_vanilla_transformer"  # importing the package registers the model: allowed everywhere
    ]
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_that_imports_it_back():
    graphlib.TopologicalSorter({module: imported & MODULES.keys() for module, imported in GRAPH.items()}).prepare()


def test_the_check_sees_relative_imports_and_imports_inside_functions():
    assert (
        "hf_vanilla_transformer.model.pipeline_translation"
        in GRAPH["hf_vanilla_transformer.model.configuration_vanilla_transformer"]
    )  # `from .pipeline_translation import ...`
    assert "hf_vanilla_transformer.translation.lines" in GRAPH["hf_vanilla_transformer.cli.translate"]


def test_every_folder_has_a_layer_and_nothing_imports_the_former_paths():
    assert {layer(module) for module in MODULES} == MAY_IMPORT.keys()
    importers = sorted(
        module
        for module, imported in GRAPH.items()
        if layer(module) != "tools" and any(layer(name) == "tools" for name in imported)
    )
    assert importers == []


def imported_by(modules: set[str]) -> set[str]:
    """The package's modules that importing `modules` loads, at their tops or inside their functions."""
    seen, todo = set(), list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [name for name in GRAPH.get(module, ()) if name in MODULES] + parents(module)
    return seen


def parents(module: str) -> list[str]:
    """The packages Python imports before `module`, their __init__ modules."""
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def test_translating_a_line_imports_no_export_inspection_or_sharing_code():
    """The command that translates, everything it may call, and every engine: none reaches an export, an inspection
    or a sharing module, even inside a function."""
    translating = {"hf_vanilla_transformer.cli.translate", "hf_vanilla_transformer.cli.score"}
    translating |= {module for module in MODULES if layer(module) in {"engines", "translation"}}
    reached = imported_by(translating)
    assert "hf_vanilla_transformer.decoding.constraints" in reached  # the check follows imports inside functions
    assert sorted(module for module in reached if layer(module) in {"export", "inspection", "sharing", "tools"}) == []


def test_each_package_docstring_names_what_it_holds():
    """Every folder's docstring names each of its modules; the package's, each folder and base module; the command
    lines', each console script with its module."""
    unnamed = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        docstring = importlib.import_module(module_name(init)).__doc__ or ""
        held = [path.name for path in init.parent.glob("*.py") if path.name != "__init__.py"]
        held += [f"{path.parent.name}/" for path in init.parent.glob("*/__init__.py")]
        unnamed += [f"{module_name(init)}: {name}" for name in held if name not in docstring]
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg")
    commands = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    cli = importlib.import_module("hf_vanilla_transformer.cli").__doc__
    for command in commands:
        name, target = (part.strip() for part in command.split("="))
        module = target.split(":")[0].rsplit(".", 1)[1]
        if f"{name}: {module}.py" not in " ".join(cli.split()):
            unnamed.append(f"hf_vanilla_transformer.cli: {name} ({module}.py)")
    assert unnamed == []


def test_every_dotted_name_of_the_package_that_the_code_and_docs_give_exists():
    """A module, or a name in one, written as `hf_vanilla_transformer.X.Y` in the code, tests, benchmarks, demo or
    docs (CHANGELOG.md, which keeps history, aside) is there to import."""
    places = [*PACKAGE.rglob("*.py"), *(REPO_ROOT / "tests").rglob("*.py"), *(REPO_ROOT / "bench").rglob("*.py")]
    places += [*(REPO_ROOT / "demo").glob("*.py"), *(REPO_ROOT / "docs").glob("*.md"), *REPO_ROOT.glob("*.md")]
    missing = set()
    for place in places:
        if place.name == "CHANGELOG.md":
            continue
        for name in re.findall(r"\bhf_vanilla_transformer(?:\.[a-z_0-9]+)+", place.read_text(encoding="utf-8")):
            try:
                importlib.import_module(name)
            except ImportError:
                module, attribute = name.rsplit(".", 1)
                try:
                    getattr(importlib.import_module(module), attribute)
                except (ImportError, AttributeError):
                    missing.add(f"{place.relative_to(REPO_ROOT)}: {name}")
    assert sorted(missing) == []
