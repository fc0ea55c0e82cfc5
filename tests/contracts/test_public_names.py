"""The package builds on transformers', accelerate's, datasets' and evaluate's public contracts: an AST scan of
`hf_vanilla_transformer/`, `run_translation.py` and `train_bpe.py` for every private name of theirs it reads,
writes, imports or overrides. A private name is theirs when it is imported from them, when a class of ours redefines
it in one of their base classes, or when their installed source reaches it on an object (`x._name`, a method);
the package's own private helpers are not. The extension points they document for authors (`ALLOWED`) are the only
ones the package may use."""

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.paths import REPO_ROOT

THEIRS = ("transformers", "accelerate", "datasets", "evaluate")
SCANNED = [
    *sorted((REPO_ROOT / "hf_vanilla_transformer").rglob("*.py")),
    REPO_ROOT / "run_translation.py",
    REPO_ROOT / "train_bpe.py",
]

# The extension points transformers and evaluate document for authors: the names a model, a custom pipeline or a
# metric declares or overrides, and nothing else.
ALLOWED = {
    # a PreTrainedModel subclass (https://huggingface.co/docs/transformers/custom_models, .../add_new_model)
    "_init_weights": "PreTrainedModel.post_init initialises each module with it (custom_models)",
    "_no_split_modules": "the layers device_map='auto' and FSDP keep whole (big_models, accelerate's FSDP)",
    "_tied_weights_keys": "the weights tied to the input embeddings (custom_models: weight tying)",
    "_supports_sdpa": "the attention backends a model declares (attention_interface)",
    "_supports_flash_attn": "the attention backends a model declares (attention_interface)",
    "_supports_flex_attn": "the attention backends a model declares (attention_interface)",
    "_can_record_outputs": "the outputs `output_attentions`/`output_hidden_states` collect (modular_transformers)",
    "_can_compile_fullgraph": "whether generate() may compile the forward whole (llm_optims: static cache)",
    "_attn_implementation": "the attention backend a model dispatches on, `ALL_ATTENTION_FUNCTIONS.get_interface("
    "config._attn_implementation, ...)` (attention_interface); there is no public getter",
    # a Pipeline subclass (https://huggingface.co/docs/transformers/add_new_pipeline)
    "_sanitize_parameters": "splits a call's arguments between preprocess, _forward and postprocess",
    "_forward": "the pipeline's model call",
    "_load_tokenizer": "pipeline() reads it from the Pipeline class to choose what to load",
    "_load_processor": "pipeline() reads it from the Pipeline class to choose what to load",
    "_load_image_processor": "pipeline() reads it from the Pipeline class to choose what to load",
    "_load_feature_extractor": "pipeline() reads it from the Pipeline class to choose what to load",
    "_load_video_processor": "pipeline() reads it from the Pipeline class to choose what to load",
    # an evaluate.Metric subclass (https://huggingface.co/docs/evaluate/creating_and_sharing)
    "_info": "the metric's description and input features",
    "_compute": "the metric itself",
}


@dataclass(frozen=True)
class Use:
    file: str
    line: int
    name: str
    kind: str  # "import" or "redefinition": theirs by what it is; "attribute": theirs if their source has the name
    how: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.name} ({self.how})"


# How their source reaches a private name on an object: `x._name`, `getattr(x, "_name")` and its kin, and the
# methods it defines
THEIR_ATTRIBUTE = re.compile(
    r"""\.(_[A-Za-z]\w*)|(?:get|has|set|del)attr\([^,()]+,\s*["'](_[A-Za-z]\w*)["']|"""
    r"def (_[A-Za-z]\w*)\(\s*(?:self|cls)\b"
)


@functools.cache
def their_private_names() -> frozenset[str]:
    """The private names that the installed source of THEIRS uses on objects (an attribute, a method): those a
    subclass or a caller could touch. A module-level `_helper` of theirs is none, so ours may share its name."""
    import importlib

    names = set()
    for package in THEIRS:
        root = Path(importlib.import_module(package).__file__).parent
        for path in root.rglob("*.py"):
            for groups in THEIR_ATTRIBUTE.findall(path.read_text(encoding="utf-8", errors="replace")):
                names.update(filter(None, groups))
    return frozenset(name for name in names if not name.endswith("__"))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name != "_"


def is_theirs(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in THEIRS


def base_name(node) -> str:
    """`Trainer` for `Trainer`; `evaluate.Metric` for `evaluate.Metric`."""
    if isinstance(node, ast.Attribute):
        return f"{base_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def imported_from_theirs(tree) -> set[str]:
    """The names a file imports from THEIRS: `Trainer` (from transformers import Trainer), `evaluate`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and is_theirs(node.module):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names if is_theirs(alias.name))
    return names


def derived_classes(trees: dict[str, ast.Module]) -> set[str]:
    """The package's classes that derive from one of THEIRS, directly or through another of the package's."""
    derived: set[str] = set()
    while True:
        found = {
            node.name
            for tree in trees.values()
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and derives(node, derived, imported_from_theirs(tree))
        }
        if found == derived:
            return derived
        derived = found


def derives(node: ast.ClassDef, derived: set[str], imported: set[str]) -> bool:
    return any(base in derived or base.split(".")[0] in imported for base in map(base_name, node.bases))


def overrides(module, class_name: str, name: str, their_names: set[str]) -> bool:
    """Whether the package's class `class_name` (in `module`, imported) redefines `name` of theirs: a name their code
    reaches on objects, or one a base class of THEIRS defines."""
    cls = getattr(module, class_name, None) if module is not None else None
    if name in their_names or not isinstance(cls, type):  # a hook they call by name (`hasattr(self, "_x")`), or unknown
        return name in their_names
    return any(name in vars(base) for base in cls.__mro__[1:] if is_theirs(base.__module__))


class Scan(ast.NodeVisitor):
    """The private names one file uses: attributes (`x._name`, read, written or deleted; `self._name` only in
    classes that derive from theirs), `getattr(x, "_name")` and its kin, imports of `_name` from THEIRS, and the
    methods and class attributes of classes that derive from theirs that redefine a name of their bases."""

    def __init__(self, file: str, module, derived: set[str], their_names: set[str], imported: set[str]):
        self.file, self.module, self.derived, self.their_names, self.imported = (
            file,
            module,
            derived,
            their_names,
            imported,
        )
        self.classes: list[ast.ClassDef | None] = []  # the enclosing classes that derive from theirs (else None)
        self.uses: list[Use] = []

    def use(self, node, name: str, kind: str, how: str) -> None:
        self.uses.append(Use(self.file, node.lineno, name, kind, how))

    def visit_ImportFrom(self, node):
        if is_theirs(node.module):
            if any(is_private(part) for part in node.module.split(".")):
                self.use(node, node.module, "import", "import from a private module")
            for alias in node.names:
                if is_private(alias.name):
                    self.use(node, alias.name, "import", f"import from {node.module}")

    def visit_Import(self, node):
        for alias in node.names:
            if is_theirs(alias.name) and any(is_private(part) for part in alias.name.split(".")):
                self.use(node, alias.name, "import", "import of a private module")

    def visit_ClassDef(self, node):
        self.classes.append(node if derives(node, self.derived, self.imported) else None)
        for statement in node.body if self.classes[-1] else []:
            targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and self.redefines(target.id):
                    self.use(target, target.id, "redefinition", f"class attribute of {node.name}")
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node):
        if self.classes and self.redefines(node.name):
            self.use(node, node.name, "redefinition", f"method of {self.classes[-1].name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def redefines(self, name: str) -> bool:
        enclosing = self.classes[-1] if self.classes else None
        return (
            enclosing is not None
            and is_private(name)
            and overrides(self.module, enclosing.name, name, self.their_names)
        )

    def visit_Attribute(self, node):
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if is_private(node.attr) and not (on_self and not any(self.classes[-1:])):
            self.use(node, node.attr, "attribute", "written" if isinstance(node.ctx, ast.Store) else "read")
        self.generic_visit(node)

    def visit_Call(self, node):
        function = node.func.id if isinstance(node.func, ast.Name) else None
        if function in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value):
                self.use(node, name.value, "attribute", f"{function}()")
        self.generic_visit(node)


def ours(trees: dict[str, ast.Module], modules: dict, derived: set[str], their_names: set[str]) -> set[str]:
    """The private names the package defines itself: module-level functions, classes and variables, the methods and
    class attributes of its classes that redefine nothing of theirs, and what classes that derive from none of theirs
    assign on `self`."""
    names = set()
    for file, tree in trees.items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            for target in node.targets if isinstance(node, ast.Assign) else []:
                names.update(name.id for name in ast.walk(target) if isinstance(name, ast.Name))
        for node in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            for statement in node.body:
                targets = getattr(statement, "targets", [getattr(statement, "target", None)])
                defined = (
                    [statement.name]
                    if isinstance(statement, ast.FunctionDef)
                    else [target.id for target in targets if isinstance(target, ast.Name)]
                )
                names.update(name for name in defined if not overrides(modules[file], node.name, name, their_names))
            if node.name not in derived:
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
                        names.update([inner.attr] if base_name(inner.value) == "self" else [])
    return {name for name in names if is_private(name)}


def label(path: Path) -> str:
    """A scanned file's name in messages: its path in the repository."""
    return str(path.relative_to(REPO_ROOT)) if REPO_ROOT in path.parents else path.name


def importable(path: Path):
    """The module a scanned file is, imported (None for a file that is not the package's or a top-level script)."""
    import importlib

    package = REPO_ROOT / "hf_vanilla_transformer"
    if package in path.parents:
        return importlib.import_module(".".join(path.relative_to(REPO_ROOT).with_suffix("").parts))
    return importlib.import_module(path.stem) if path.parent == REPO_ROOT else None


def private_uses(paths: list[Path]) -> list[Use]:
    """Every use of a private name of theirs in `paths`, allowed or not."""
    trees = {label(path): ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for path in paths}
    modules = {label(path): importable(path) for path in paths}
    their_names = their_private_names()
    derived = derived_classes(trees)
    own = ours(trees, modules, derived, their_names)
    uses = []
    for name, tree in trees.items():
        scan = Scan(name, modules[name], derived, their_names, imported_from_theirs(tree))
        scan.visit(tree)
        uses += [use for use in scan.uses if use.kind != "attribute" or use.name in their_names - own]
    return uses


@pytest.fixture(scope="module")
def uses() -> list[Use]:
    return private_uses(SCANNED)


def test_the_package_touches_no_private_name_of_theirs_but_the_documented_extension_points(uses):
    found = [use for use in uses if use.name not in ALLOWED]
    assert not found, "private names of transformers/accelerate/datasets/evaluate used:\n" + "\n".join(map(str, found))


def test_the_list_names_only_what_the_package_uses(uses):
    """An extension point no longer used leaves the list."""
    used = {use.name for use in uses}
    assert not set(ALLOWED) - used, f"allowed but unused: {sorted(set(ALLOWED) - used)}"


def test_the_package_touches_no_private_name_of_torch():
    """torch's private modules and attributes (`torch._dynamo`, `tensor._version`): a dotted name through torch
    with a private part, or an import of one."""
    found = []
    for path in SCANNED:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            dotted = base_name(node) if isinstance(node, ast.Attribute) else ""
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            for name in [dotted, *modules]:
                parts = name.split(".")
                if parts[0] == "torch" and any(is_private(part) for part in parts):
                    found.append(f"{label(path)}:{node.lineno}: {name}")
    assert not found, "private names of torch used:\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_use(tmp_path):
    """The scan itself, on a file that uses a private name of transformers in every way it looks for."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from transformers import Trainer\n"
        "from transformers.trainer import _is_peft_model\n"
        "import transformers.utils._hub\n"
        "class Mine(Trainer):\n"
        "    _tied_weights_keys = None\n"
        "    def _save_checkpoint(self, model, trial):\n"
        "        self._signature_columns = []\n"
        "        return super()._save_checkpoint(model, trial)\n"
        "class Plain:\n"
        "    def _own_helper(self):\n"
        "        return self._length\n"
        "def use(trainer, plain):\n"
        "    plain._own_helper()\n"
        "    return getattr(trainer.accelerator, '_models'), trainer.args._n_gpu\n"
    )
    found = sorted((use.line, use.name) for use in private_uses([sample]))
    assert found == [
        (2, "_is_peft_model"),
        (3, "transformers.utils._hub"),
        (5, "_tied_weights_keys"),
        (6, "_save_checkpoint"),
        (7, "_signature_columns"),
        (8, "_save_checkpoint"),
        (14, "_models"),
        (14, "_n_gpu"),
    ]
