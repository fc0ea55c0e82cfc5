"""engines/base.py and engines/registry.py: every engine implements the base class's methods with its signature and
says what it cannot do by its declarations; the registry alone tells engines apart, and what an engine declares it
cannot do is refused before anything is loaded."""

import ast
import inspect

import pytest

from hf_vanilla_transformer.cli.score import main as score_main
from hf_vanilla_transformer.engines.base import Translator
from hf_vanilla_transformer.engines.registry import ENGINES, check_scoring, translator_kind
from support.paths import REPO_ROOT
from support.steering import onnx_folder_in_name_only

METHODS = ("hypotheses", "score", "align", "reads", "loader")
DECLARED = ("engine", "folder", "folders")


@pytest.mark.parametrize("engine", ENGINES, ids=lambda engine: engine.__name__)
def test_each_engine_implements_the_base_methods_with_their_signatures_and_declares_itself(engine):
    for name in METHODS:
        theirs, ours = inspect.signature(getattr(engine, name)), inspect.signature(getattr(Translator, name))
        named = [p.name for p in ours.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        assert [p.name for p in theirs.parameters.values()][: len(named)] == named, (engine.__name__, name)
    assert engine.hypotheses is not Translator.hypotheses and engine.reads is not Translator.reads
    assert all(isinstance(getattr(engine, name), str) and getattr(engine, name) for name in DECLARED)
    assert engine.scoring <= {"scores", "alignments"} and engine.features <= {
        "n_best",
        "scores",
        "alignments",
        "prefixes",
        "constraints",
        "avoid",
    }
    # what it declares it can give of given translations, it implements; what it does not, the base refuses
    assert ("scores" in engine.scoring) == (engine.score is not Translator.score)
    assert ("alignments" in engine.scoring) == (engine.align is not Translator.align)


def test_the_base_refuses_what_an_engine_declares_it_cannot_give():
    class Greedy(Translator):
        engine, folder, folders = "a test engine", "a test folder", "test folders"

    with pytest.raises(ValueError, match="a test engine cannot give scores of given translations"):
        Greedy().score(["a"], ["b"], 1)
    with pytest.raises(ValueError, match="a test engine cannot align given translations"):
        Greedy().align(["a"], ["b"], 1)


def test_no_module_tells_engines_apart_by_type_but_the_registry():
    """No `isinstance` against an engine class, and no `hasattr` or `getattr` on a translator or an engine class,
    outside engines/registry.py: callers use the base class's methods and declarations."""
    engine_names = {engine.__name__ for engine in ENGINES} | {"Translator"}
    found = []
    for path in sorted((REPO_ROOT / "hf_vanilla_transformer").rglob("*.py")):
        if path.name == "registry.py" and path.parent.name == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
                continue
            first = ast.unparse(node.args[0])
            if (
                node.func.id == "isinstance"
                and len(node.args) > 1
                and engine_names
                & set(ast.unparse(node.args[1]).replace("(", " ").replace(")", " ").replace(",", " ").split())
            ):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            if node.func.id in ("hasattr", "getattr") and first in {"translator", "kind", "engine", "self.translator"}:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_scoring_with_an_engine_that_cannot_is_refused_before_anything_is_read(tmp_path, capsys):
    """An ONNX folder gives no scores of given translations: vanilla-score refuses it in one line, exit status 2,
    before it loads the folder (its graph is empty)."""
    folder = onnx_folder_in_name_only(tmp_path / "onnx")
    (tmp_path / "given.en").write_text("a b\n")
    (tmp_path / "given.de").write_text("b a\n")
    assert translator_kind([folder]).scoring == frozenset()
    with pytest.raises(ValueError, match=r"for CTranslate2 folders or model folders; .* is an ONNX folder"):
        check_scoring([folder], ["scores"])
    with pytest.raises(SystemExit) as stop:
        score_main(["--model", folder, "--source", str(tmp_path / "given.en"), "--target", str(tmp_path / "given.de")])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "argument --model: scoring given translations is for CTranslate2 folders" in error
    assert "or model folders;" in error and "is an ONNX folder" in error and len(error.strip().splitlines()[-1]) < 300
    # an ensemble with an export: refused as vanilla-translate refuses it
    with pytest.raises(SystemExit) as stop:
        score_main(
            ["--model", folder, folder, "--source", str(tmp_path / "given.en"), "--target", str(tmp_path / "given.de")]
        )
    assert (
        stop.value.code == 2
        and "is an export; only model folders decode together as an ensemble" in capsys.readouterr().err
    )
