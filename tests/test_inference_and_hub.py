"""pipeline("translation"), the vanilla-translate command, and sharing on the Hub (tested at its boundary)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import intercepted_hub
from huggingface_hub import ModelCard
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from hf_vanilla_transformer import TranslationPipeline

SENTENCES = ["A man is sleeping.", "Two dogs play in the snow.", "A little girl climbs into a wooden playhouse."]


@pytest.fixture(scope="module")
def model_and_tokenizer(trained_run):
    tokenizer = AutoTokenizer.from_pretrained(trained_run.output)
    return AutoModelForSeq2SeqLM.from_pretrained(trained_run.output), tokenizer


def generate_text(model, tokenizer, sentences, **kwargs) -> list[str]:
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        return tokenizer.batch_decode(model.generate(**batch, **kwargs), skip_special_tokens=True)


def test_pipeline_with_the_package_gives_the_old_output_format(trained_run, model_and_tokenizer):
    translator = pipeline("translation", model=str(trained_run.output), pipeline_class=TranslationPipeline)
    assert isinstance(translator, TranslationPipeline)
    single = translator(SENTENCES[0])
    assert single == [{"translation_text": generate_text(*model_and_tokenizer, SENTENCES[:1])[0]}]
    assert single[0]["translation_text"].strip()


def test_default_decoding_is_the_papers(trained_run, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    translator = TranslationPipeline(model=model, tokenizer=tokenizer)
    assert (translator.model.generation_config.num_beams, translator.model.generation_config.length_penalty) == (4, 0.6)
    paper = generate_text(model, tokenizer, SENTENCES[1:2], num_beams=4, length_penalty=0.6)
    greedy = generate_text(model, tokenizer, SENTENCES[1:2], num_beams=1)
    assert translator(SENTENCES[1])[0]["translation_text"] == paper[0]
    assert translator(SENTENCES[1], num_beams=1)[0]["translation_text"] == greedy[0]


def test_lists_are_batched_and_generation_arguments_pass_through(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    translator = TranslationPipeline(model=model, tokenizer=tokenizer)
    one_by_one = [translator(s, num_beams=1)[0] for s in SENTENCES]
    batched = translator(SENTENCES, batch_size=3, num_beams=1)
    assert batched == one_by_one and all(set(item) == {"translation_text"} for item in batched)

    several = translator(SENTENCES[0], num_beams=3, num_return_sequences=3)
    assert len(several) == 3 and len({item["translation_text"] for item in several}) == 3
    per_input = translator(SENTENCES[:2], num_beams=2, num_return_sequences=2, batch_size=2)
    assert [len(items) for items in per_input] == [2, 2]
    short = translator(SENTENCES[2], max_new_tokens=2, num_beams=1)[0]["translation_text"]
    assert len(tokenizer(short, add_special_tokens=False)["input_ids"]) <= 2


def hub_snapshot(cache, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay `files` out as huggingface_hub's cache holds a downloaded repository (refs/main -> snapshots/<sha>)."""
    repo = cache / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("1" * 40)
    for name, content in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(content)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("1" * 40)


def run_python(code: str, hf_home, package_importable: bool = False) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python, offline, with standard input closed (so a prompt cannot wait for an answer)
    and, unless `package_importable`, where `import hf_vanilla_transformer` fails."""
    block = "" if package_importable else 'import sys\nsys.modules["hf_vanilla_transformer"] = None\n'
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", block + textwrap.dedent(code)],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_pipeline_with_remote_code_from_a_folder_and_from_a_hub_snapshot(trained_run, model_and_tokenizer, tmp_path):
    expected = [{"translation_text": text} for text in generate_text(*model_and_tokenizer, SENTENCES[:2])]
    repo_id, files = trained_run.commits[-1]
    hub_snapshot(tmp_path / "home", repo_id, files)
    output = run_python(
        f"""
        import json
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        results = {{}}
        for source in ({str(trained_run.output)!r}, {repo_id!r}):
            for task in ("translation", None):
                translator = pipeline(task, model=source, trust_remote_code=True)
                results[f"{{source}} {{task}}"] = translator({SENTENCES[:2]!r}, batch_size=2)
        model = AutoModelForSeq2SeqLM.from_pretrained({repo_id!r}, trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained({repo_id!r}, trust_remote_code=True)
        results["class"] = type(model).__module__
        print(json.dumps(results))
        """,
        tmp_path / "home",
    ).stdout
    results = json.loads(output.strip().splitlines()[-1])
    assert results.pop("class").startswith("transformers_modules.")
    assert len(results) == 4 and all(value == expected for value in results.values()), results


TOKENIZER_LOADS = {
    # no code of ours: the folder's tokenizer is a plain `tokenizers` one
    "plain": ("from transformers import PreTrainedTokenizerFast", "PreTrainedTokenizerFast.from_pretrained(source)"),
    "package": (
        "import hf_vanilla_transformer; from transformers import AutoTokenizer",
        "AutoTokenizer.from_pretrained(source)",
    ),
}


@pytest.mark.parametrize("how", TOKENIZER_LOADS)
def test_the_tokenizer_loads_with_no_prompt_and_no_warning(trained_run, model_and_tokenizer, tmp_path, how):
    """As the README and the model card say to load it, from a folder and from the Hub."""
    expected = model_and_tokenizer[1](SENTENCES)["input_ids"]
    repo_id, files = trained_run.commits[-1]
    hub_snapshot(tmp_path / "home", repo_id, files)
    imports, load = TOKENIZER_LOADS[how]
    result = run_python(
        f"""
        import json
        {imports}
        for source in ({str(trained_run.output)!r}, {repo_id!r}):
            tokenizer = {load}
            print(json.dumps(tokenizer({SENTENCES!r})["input_ids"]))
        """,
        tmp_path / "home",
        package_importable=how == "package",
    )
    assert [json.loads(line) for line in result.stdout.splitlines()] == [expected, expected]
    assert result.stderr == ""


def test_auto_tokenizer_alone_asks_to_run_the_model_code_where_the_package_is_missing(trained_run, tmp_path):
    """Why the README and the card load the tokenizer as above: transformers' AutoTokenizer first reads the
    folder's config.json through AutoConfig, which for a model type it does not know asks to run the folder's
    configuration code (and, refused, warns that it reads the config as a generic one). If this test fails,
    transformers changed that, and plain `AutoTokenizer.from_pretrained(folder)` can be documented."""
    result = run_python(
        f"""
        from transformers import AutoTokenizer
        AutoTokenizer.from_pretrained({str(trained_run.output)!r})
        """,
        tmp_path / "home",
    )
    assert "Do you wish to run the custom code? [y/N]" in result.stdout
    assert "You are using a model of type `vanilla_transformer`" in result.stderr


def test_run_translation_pushes_one_complete_folder(trained_run):
    assert len(trained_run.commits) == 1
    repo_id, files = trained_run.commits[0]
    assert repo_id == "someone/tiny-en-de"
    assert set(files) == {
        "model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "configuration_vanilla_transformer.py", "modeling_vanilla_transformer.py", "pipeline_translation.py",
        "README.md", "all_results.json", "train_results.json", "eval_results.json", "predict_results.json",
        "generated_predictions.txt", "trainer_state.json",
    }  # fmt: skip
    config = json.loads(files["config.json"])
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].endswith("VanillaTransformerForConditionalGeneration")
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_translation.TranslationPipeline"
    card = ModelCard(files["README.md"].decode())
    assert card.data.model_name == "someone/tiny-en-de" and "translation" in card.data.tags
    assert {(r.dataset_split, r.metric_type) for r in card.data.eval_results} == {
        ("validation", "bleu"), ("validation", "chrf"), ("test", "bleu"), ("test", "chrf"),
    }  # fmt: skip


def test_model_and_tokenizer_push_to_hub(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    commits = []
    with intercepted_hub(commits):
        model.push_to_hub("someone/pushed", token="hf_test")
        tokenizer.push_to_hub("someone/pushed", token="hf_test")
    (model_repo, model_files), (tokenizer_repo, tokenizer_files) = commits
    assert model_repo == tokenizer_repo == "someone/pushed"
    assert set(model_files) == {
        "model.safetensors", "config.json", "generation_config.json", "configuration_vanilla_transformer.py",
        "modeling_vanilla_transformer.py", "pipeline_translation.py", "README.md",
    }  # fmt: skip
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(tokenizer_files)
    tags = ModelCard(model_files["README.md"].decode()).data.tags
    assert {"translation", "vanilla-transformer"} <= set(tags)


def test_model_card_sections_and_metadata(trained_run):
    card = ModelCard.load(trained_run.output / "README.md")
    for heading in ("## Model", "## Intended uses and limits", "## Training", "## Evaluation", "## How to use"):
        assert heading in card.text
    assert "Attention Is All You Need" in card.text and "@inproceedings{vaswani2017attention" in card.text
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in card.text  # the sacreBLEU signature
    repo_id = "someone/tiny-en-de"
    assert f'AutoModelForSeq2SeqLM.from_pretrained("{repo_id}", trust_remote_code=True)' in card.text
    assert f'PreTrainedTokenizerFast.from_pretrained("{repo_id}")' in card.text
    data = card.data.to_dict()
    assert data["language"] == ["en", "de"] and data["license"] == "apache-2.0"
    assert data["metrics"] == ["bleu", "chrf"] and data["pipeline_tag"] == "translation"
    assert data["model-index"][0]["results"][0]["task"]["type"] == "translation"


def test_the_cards_code_translates_where_the_package_is_missing(trained_run, model_and_tokenizer, tmp_path):
    card = ModelCard.load(trained_run.output / "README.md").text
    code = card.split("## How to use", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    example = code.split('tokenizer(["', 1)[1].split('"]', 1)[0]  # the first test sentence
    repo_id, files = trained_run.commits[-1]
    hub_snapshot(tmp_path / "home", repo_id, files)
    printed = run_python(code, tmp_path / "home").stdout.strip().splitlines()[-1]
    assert printed == str(generate_text(*model_and_tokenizer, [example]))


def vanilla_translate(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    command = shutil.which("vanilla-translate")
    assert command, "the vanilla-translate console script is not installed"
    return subprocess.run([command, *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_translate_command_keeps_order_and_empty_lines(trained_run, model_and_tokenizer, tmp_path):
    lines = [SENTENCES[2], "", SENTENCES[0], "   ", SENTENCES[1]]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    files = ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")]
    result = vanilla_translate("--model", str(trained_run.output), *files, "--num_beams", "1", "--batch_size", "2")
    assert result.returncode == 0, result.stderr
    expected = generate_text(*model_and_tokenizer, [SENTENCES[2], SENTENCES[0], SENTENCES[1]], num_beams=1)
    assert (tmp_path / "out.txt").read_text().split("\n") == [expected[0], "", expected[1], "", expected[2], ""]
    assert "3/3" in result.stderr  # the progress bar, on stderr

    piped = subprocess.run(
        [sys.executable, "-m", "hf_vanilla_transformer.translate", "--model", str(trained_run.output),
         "--max_new_tokens", "3"],
        input=SENTENCES[0] + "\n", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1 and piped.stdout.strip()
    assert "sentence/s" not in piped.stderr


def test_translate_command_errors(trained_run, tmp_path):
    missing_model = vanilla_translate("--model", str(tmp_path / "nothing"), stdin="A dog.\n")
    assert missing_model.returncode == 1
    message = f"vanilla-translate: error: --model {tmp_path / 'nothing'}: not a model folder (no config.json)"
    assert missing_model.stderr.strip() == message
    missing_input = vanilla_translate("--model", str(trained_run.output), "--input", str(tmp_path / "none.txt"))
    assert missing_input.returncode == 1 and "none.txt: no such file" in missing_input.stderr
    (tmp_path / "latin1.txt").write_bytes("Ein Männchen\n".encode("latin-1"))
    not_utf8 = vanilla_translate("--model", str(trained_run.output), "--input", str(tmp_path / "latin1.txt"))
    assert not_utf8.returncode == 1 and "latin1.txt: not UTF-8 text" in not_utf8.stderr
