"""Each model card's claims, read back against its folder's files: the library, the decoding, and the code, which
runs as written (where the card says it needs no package of ours, in a Python where it cannot be imported)."""

import json
import re
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla_transformer.loading import RUN_RECORD
from hf_vanilla_transformer.tools.card import write_model_card
from support.files import write_dataset
from support.models import generate_text, letter_tokenizer, tiny_model
from support.runs import TINY_MODEL_RUN

EXAMPLE = "a b c"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """A tiny model folder of ours with its card (decoding beam 3, length penalty 1.0: not the paper's), named as a
    run names it (`runs/NAME`, from the folder it started in, `root`), and its CTranslate2 and Marian exports."""
    from hf_vanilla_transformer.tools.export_ctranslate2 import export as export_ctranslate2
    from hf_vanilla_transformer.tools.export_marian import export as export_marian

    root = tmp_path_factory.mktemp("cards")
    # one head count, as CTranslate2 needs; 24 positions, so that the untrained model's translations end soon
    model = tiny_model(vocab_size=14, decoder_attention_heads=4, max_position_embeddings=24)
    model.generation_config.update(num_beams=3, length_penalty=1.0)
    ours = root / "runs" / "tiny-en-de"
    model.save_pretrained(ours)
    letter_tokenizer().save_pretrained(ours)
    # what a run records (training/run.py), from which the card is written
    record = {"model_id": "runs/tiny-en-de", "source_lang": "en", "target_lang": "de", "dataset_id": None,
              "dataset_name": None, "training": {"steps": 1, "hardware": "a test"},
              "scores": {"test": {"bleu": 1.5, "chrf": 20.0, "samples": 3}},
              "example": {"source": EXAMPLE, "translation": "d e f"}}  # fmt: skip
    (ours / RUN_RECORD).write_text(json.dumps(record))
    write_model_card(str(ours))  # the model and tokenizer loaded from the folder
    return {
        "root": root,
        "ours": ours,
        "ctranslate2": Path(export_ctranslate2(str(ours), str(root / "ct2"))),
        "marian": Path(export_marian(str(ours), str(root / "marian"))),
    }


def test_the_card_is_written_from_the_runs_record_and_the_folder(folders):
    card = ModelCard.load(folders["ours"] / "README.md")
    assert card.data.model_name == "runs/tiny-en-de" and card.data.language == ["en", "de"]
    assert [(result.dataset_split, result.metric_type, result.metric_value) for result in card.data.eval_results] == [
        ("test", "bleu", 1.5), ("test", "chrf", 20.0),
    ]  # fmt: skip
    assert "- hardware: a test" in card.text and '# [{"translation_text": "d e f"}]' in card.text
    assert "![" in card.text and (folders["ours"] / "attention.png").is_file()  # the example's attention, drawn


def names_model(model_code: str, pipeline_code: str, model_id: str) -> bool:
    """Whether a card's model and pipeline snippets load `model_id` (a folder, or a repository once pushed)."""
    return f'.from_pretrained("{model_id}"' in model_code and f'model="{model_id}"' in pipeline_code


def how_to_use(card: ModelCard) -> str:
    return card.text.split("## How to use", 1)[1].split("\n## ", 1)[0]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def our_translation(folder, **decoding) -> str:
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    tokenizer = letter_tokenizer()
    with torch.no_grad():
        output = model.generate(**tokenizer([EXAMPLE], return_tensors="pt"), **decoding)
    return str(tokenizer.batch_decode(output, skip_special_tokens=True))


@pytest.mark.parametrize("kind, library", [("ours", "transformers"), ("ctranslate2", "ctranslate2"),
                                           ("marian", "transformers")])  # fmt: skip
def test_each_card_names_its_library_and_decodes_as_its_generation_config(folders, kind, library):
    folder = folders[kind]
    card = ModelCard.load(f"{folder}/README.md")
    generation = json.loads((folder / "generation_config.json").read_text())
    assert card.data.library_name == library
    assert card.data.to_dict()["widget"] == [{"text": EXAMPLE}]
    usage = " ".join(how_to_use(card).split())
    beams, penalty = re.search(r"beam size (\d+), length penalty ([\d.]+)", usage).groups()
    assert (int(beams), float(penalty)) == (generation["num_beams"], generation["length_penalty"]) == (3, 1.0)
    limit = re.search(r"at most (the source length \+ (\d+) tokens|`max_length` = (\d+) tokens)", usage)
    if "max_new_tokens_over_source" in generation:
        assert int(limit[2]) == generation["max_new_tokens_over_source"]
    else:
        assert int(limit[3]) == generation["max_length"]
    assert EXAMPLE in usage


def run_code(code: str, capsys) -> str:
    """What `code` prints last, run here. The Marian card's code also runs in a Python without our package
    (test_export_marian.py), as does our card's model code (test_hub.py, on a trained model)."""
    capsys.readouterr()
    exec(code, {})
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_the_ctranslate2_cards_code_translates_as_vanilla_translate(folders, capsys):
    from hf_vanilla_transformer.tools.ctranslate2_runtime import CTranslate2Translator

    (code,) = python_blocks(how_to_use(ModelCard.load(f"{folders['ctranslate2']}/README.md")))
    assert "hf_vanilla_transformer" not in code
    assert (
        run_code(code, capsys) == CTranslate2Translator(str(folders["ctranslate2"]), "cpu").translate([EXAMPLE], 1)[0]
    )


def test_our_cards_code_runs_and_the_pipeline_needs_what_the_card_says(folders, capsys, monkeypatch):
    """From the folder the run started in (the README's quick start: the repository root), with the Hub unreachable
    (conftest.py), so that a name taken for a Hub id fails at once."""
    from transformers import pipeline

    import hf_vanilla_transformer

    model_code, pipeline_code = python_blocks(how_to_use(ModelCard.load(f"{folders['ours']}/README.md")))
    assert names_model(model_code, pipeline_code, "runs/tiny-en-de")
    monkeypatch.chdir(folders["root"])
    expected = our_translation(folders["ours"])
    assert run_code(model_code, capsys) == expected
    printed = run_code(pipeline_code, capsys)
    assert printed == str([{"translation_text": eval(expected)[0]}])
    # "the pipeline still asks for trust_remote_code unless given as pipeline_class=...": both halves true
    with pytest.raises(ValueError, match="requires you to execute the code in the pipeline file"):
        pipeline("translation", model=str(folders["ours"]))
    translator = pipeline(
        "translation", model=str(folders["ours"]), pipeline_class=hf_vanilla_transformer.TranslationPipeline
    )
    assert str(translator(EXAMPLE)) == printed


@pytest.mark.slow  # a run of run_translation.py, if of two steps
def test_a_runs_card_loads_its_folder_from_where_the_run_started_and_a_push_names_the_repository(
    tmp_path, monkeypatch, capsys
):
    """run_translation.py as the README's quick start runs it: from the repository root (here `tmp_path`) into
    `runs/NAME`. The card's code, run from there with the Hub unreachable (conftest.py), loads that folder, where
    the folder's bare name would be taken for a Hub id; pushed, the card names the repository."""
    import run_translation
    from hf_vanilla_transformer.tools.hub import card_for

    monkeypatch.chdir(tmp_path)
    rows = [{"en": f"The {en} is {state}.", "de": f"Die {de} ist {zustand}."}
            for en, de in [("cat", "Katze"), ("dog", "Hund"), ("bird", "Vogel")]
            for state, zustand in [("small", "klein"), ("here", "hier"), ("old", "alt")]]  # fmt: skip
    write_dataset(tmp_path / "data", {"train": rows, "validation": rows[:3], "test": rows[3:6]})
    run_translation.main([*TINY_MODEL_RUN, "--dataset_name", "data", "--vocab_size", "300", "--max_steps", "2",
                          "--warmup_steps", "1", "--output_dir", "runs/tiny-en-de"])  # fmt: skip
    card = ModelCard.load("runs/tiny-en-de/README.md")
    model_code, pipeline_code = python_blocks(how_to_use(card))
    assert names_model(model_code, pipeline_code, "runs/tiny-en-de")
    printed = run_code(model_code, capsys)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "runs" / "tiny-en-de")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "runs" / "tiny-en-de")
    example = model_code.split('tokenizer(["', 1)[1].split('"]', 1)[0]
    assert printed == str(generate_text(model, tokenizer, [example]))
    assert run_code(pipeline_code, capsys) == str([{"translation_text": eval(printed)[0]}])
    pushed = ModelCard(card_for(Path("runs/tiny-en-de/README.md"), "someone/tiny-en-de").decode())
    model_code, pipeline_code = python_blocks(how_to_use(pushed))
    assert names_model(model_code, pipeline_code, "someone/tiny-en-de")  # the text only: the Hub is offline here
    assert "runs/tiny-en-de" not in how_to_use(pushed)
