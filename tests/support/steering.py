"""vanilla-translate's steering on tiny models: the model folders the steering tests share (their fixture,
`folders`, is in tests/conftest.py), and the command run in this process."""

import json
import sys

from hf_vanilla_transformer.cli.translate import main as translate_main
from hf_vanilla_transformer.engines.ctranslate2 import is_ctranslate2_folder
from hf_vanilla_transformer.engines.onnx import is_onnx_folder
from hf_vanilla_transformer.export.ctranslate2 import export as export_ctranslate2
from hf_vanilla_transformer.formats import DECODER_GRAPH, ONNX_FOLDER
from hf_vanilla_transformer.model.modeling_vanilla_transformer import paper_generation_config
from support.models import letter_tokenizer, tiny_model

SOURCES = ["a b c d e f", "j i h", "", "b", "c c c c c c c"]


def save_tiny(folder, seed: int = 0, **overrides) -> str:
    """A tiny random model with the letter tokenizer and the paper's decoding (beam 4), saved in `folder`. One head
    count (CTranslate2 needs it). `<s>`, `<pad>` and `<unk>` are never generated, so that every translation's text
    tokenizes back into its tokens (a random model would write them)."""
    model = tiny_model(seed, **{"vocab_size": 14, "decoder_attention_heads": 4, **overrides})
    model.generation_config = paper_generation_config(model.config)
    model.generation_config.suppress_tokens = [0, 1, 3]
    model.save_pretrained(folder)
    letter_tokenizer().save_pretrained(folder)
    return str(folder)


def onnx_folder_in_name_only(folder) -> str:
    """A folder vanilla-translate takes for an ONNX export (tests/export/test_export_onnx.py translates a real one):
    what the route cannot give is refused before anything in it is read."""
    (folder / ONNX_FOLDER).mkdir(parents=True)
    (folder / ONNX_FOLDER / f"{DECODER_GRAPH}.onnx").write_bytes(b"")
    return str(folder)


def steering_folders(root) -> dict[str, str]:
    """Two tiny model folders of different seeds, the first's CTranslate2 export, a folder taken for an ONNX export,
    and an input file, in `root`."""
    first = save_tiny(root / "first")
    (root / "in.txt").write_text("\n".join(SOURCES) + "\n")
    return {
        "first": first,
        "second": save_tiny(root / "second", seed=1),
        "ctranslate2": export_ctranslate2(first, str(root / "ct2"), "float32"),
        "onnx": onnx_folder_in_name_only(root / "onnx"),
        "input": str(root / "in.txt"),
    }


def translate(capsys, *args: str) -> tuple[int, list[str], str]:
    """vanilla-translate in this process: exit status, lines written to standard output, standard error. A model
    folder is translated in float32 (the default is bfloat16 on a CPU with bf16 units), as the tests compare."""
    model = args[args.index("--model") + 1]
    exported = is_ctranslate2_folder(model) or is_onnx_folder(model)
    capsys.readouterr()
    try:
        translate_main([*args, *([] if exported else ["--dtype", "float32"])])
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def translate_input(capsys, folders, *flags: str, models: tuple[str, ...] = ("first",)):
    """`translate` of the fixture's input file with the fixture's `models` (names in `folders`) and `flags`."""
    return translate(capsys, "--model", *(folders[name] for name in models), "--input", folders["input"], *flags)


def nbest_rows(lines: list[str]) -> list[tuple[int, str, float, float]]:
    rows = []
    for line in lines:
        number, text, score, log_probability = line.split(" ||| ")
        rows.append((int(number), text, float(score), float(log_probability)))
    return rows


def strict_json(line: str):
    """A JSON line as a strict parser reads it: `Infinity` and `NaN` are no JSON."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)
