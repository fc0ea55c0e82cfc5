"""pipeline("translation"): the package's TranslationPipeline, and the same pipeline as remote code."""

import json

import torch
from transformers import pipeline

from hf_vanilla_transformer import TranslationPipeline
from support.hub import hub_snapshot
from support.models import SENTENCES, generate_text, german_tokenizer, tiny_model
from support.processes import run_python
from support.tokenizing import LongestText


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


def test_a_10_mb_line_is_cut_before_it_is_tokenized_and_translated_from_its_start(tmp_path):
    """Only a sentence's first 128 tokens (the positions) are translated: a much longer one is cut to a start that
    holds them before the tokenizer sees it, at a space, or inside a word too long to wait for one, so that the
    tokenizer (a byte-level BPE, which spells every character) never sees more than twice the positions times the
    longest token. Each translates as its start truncated does, as every sentence did before."""
    tokenizer, _ = german_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer))  # 128 positions
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    recording = LongestText(tokenizer)
    translator = pipeline("translation", model=str(tmp_path), tokenizer=recording, pipeline_class=TranslationPipeline)
    word, words = "b" * 10_000_000, "Ein Hund " * 1_000_000
    starts = ["Ein Hund", words[:2000].strip(), word[:2000], "A " + word[:2000]]  # the last three: over 128 tokens
    truncated = []
    for start in starts:
        batch = tokenizer(start, truncation=True, max_length=128, return_tensors="pt")
        with torch.no_grad():
            truncated.append(tokenizer.decode(model.generate(**batch, num_beams=1)[0], skip_special_tokens=True))
    found = translator(["Ein Hund", words, word, "A " + word], num_beams=1)
    assert [item["translation_text"] for item in found] == truncated and len(set(truncated)) == 4
    assert recording.longest <= 2 * 128 * max(map(len, tokenizer.get_vocab()))
