"""pipeline("translation"): the package's TranslationPipeline, and the same pipeline as remote code."""

import json

from transformers import pipeline

from hf_vanilla_transformer import TranslationPipeline
from support.hub import hub_snapshot
from support.models import SENTENCES, generate_text
from support.processes import run_python


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
