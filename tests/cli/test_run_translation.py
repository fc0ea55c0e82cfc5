"""run_translation.py end to end on a slice of Multi30k, and its errors on bad input."""

import json
import re
import tempfile
from pathlib import Path

import pytest
import sacrebleu
import torch
import yaml
from datasets import Dataset
from huggingface_hub import ModelCard
from hypothesis import event, example, given
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from hf_vanilla_transformer.cli import run_translation
from hf_vanilla_transformer.cli.flags import recipe_flags
from hf_vanilla_transformer.model.pipeline_translation import TranslationPipeline
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.checkpoints import MOVING_AVERAGE_NAME
from hf_vanilla_transformer.training.data import file_sentences
from hf_vanilla_transformer.training.metrics import load_translation_metric
from hf_vanilla_transformer.training.run import prepare, tokenize, training_collator
from hf_vanilla_transformer.training.tokenizer import train_shared_bpe
from hf_vanilla_transformer.training.trainer import TranslationTrainer
from support.files import write_bytes_lines, write_dataset, write_lines
from support.hostile import FUZZ_SETTINGS, HOSTILE_LINES, JSON_VALUES, assert_one_line_error
from support.paths import REPO_ROOT, TATOEBA_EN_ZH, TEST, TRAIN
from support.runs import CHINESE_CHARACTER, CHINESE_RUN, QUIET_CPU, TINY_MODEL_RUN

OUTPUT_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "README.md",
    "all_results.json",
    "train_results.json",
    "eval_results.json",
    "predict_results.json",
    "generated_predictions.txt",
    "trainer_state.json",
    "pipeline_translation.py",
}


def test_loss_falls_and_every_output_file_is_written(trained_run):
    output, results = trained_run.output, trained_run.results
    assert {path.name for path in output.iterdir()} >= OUTPUT_FILES
    state = json.loads((output / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 6 and losses[-1] < losses[0] - 1.0, losses
    assert state["global_step"] == 150
    assert json.loads((output / "all_results.json").read_text()) == pytest.approx(results)


def test_bleu_comes_from_the_local_sacrebleu_metric(trained_run):
    output, results = trained_run.output, trained_run.results
    predict = json.loads((output / "predict_results.json").read_text())
    assert predict["predict_bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert predict["predict_chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")
    assert 0 <= predict["predict_bleu"] < 100 and predict["predict_chrf"] > 5
    assert predict["predict_samples"] == 50 and results["eval_samples"] == 40

    lines = (output / "generated_predictions.txt").read_text().split("\n")[:-1]
    assert len(lines) == 50 and sum(bool(line.strip()) for line in lines) >= 45
    references = [json.loads(row)["translation"]["de"] for row in Path(TEST).read_text().splitlines()[:50]]
    metric = load_translation_metric()
    rescored = metric.compute(predictions=lines, references=[[r] for r in references])
    assert rescored["bleu"] == pytest.approx(predict["predict_bleu"])


def test_output_folder_reloads_and_translates(trained_run):
    output = trained_run.output
    tokenizer = AutoTokenizer.from_pretrained(output)
    model = AutoModelForSeq2SeqLM.from_pretrained(output)
    assert len(tokenizer) == model.config.vocab_size == 1000
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty == 0.6
    batch = tokenizer(["A man is sleeping.", "Two dogs play in the snow."], return_tensors="pt", padding=True)
    with torch.no_grad():
        translations = tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
    assert all(len(t.split()) >= 2 for t in translations), translations


def test_the_saved_model_translates_as_it_was_scored(trained_run, tmp_path):
    # two steps of fine-tuning with --num_beams 2 --length_penalty 1.0, which go into the generation config: the
    # reloaded pipeline, given the test sentences in the evaluation's batches, writes generated_predictions.txt
    # again, and the card says how
    output = tmp_path / "tuned"
    run_translation.main(
        [
            "--model_name_or_path",
            str(trained_run.output),
            "--train_file",
            TRAIN,
            "--test_file",
            TEST,
            "--max_train_samples",
            "200",
            "--max_predict_samples",
            "50",
            "--do_train",
            "--do_predict",
            "--predict_with_generate",
            "--max_steps",
            "2",
            "--max_tokens_per_batch",
            "1500",
            "--num_beams",
            "2",
            "--length_penalty",
            "1.0",
            "--per_device_eval_batch_size",
            "32",
            "--output_dir",
            str(output),
            *QUIET_CPU,
        ]
    )
    generation = json.loads((output / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["max_new_tokens_over_source"]) == (
        2,
        1.0,
        50,
    )
    sources = [json.loads(row)["translation"]["en"] for row in Path(TEST).read_text().splitlines()[:50]]
    translator = pipeline("translation", model=str(output), pipeline_class=TranslationPipeline)
    translations = [t["translation_text"] for t in translator(sources, batch_size=32)]
    assert translations == (output / "generated_predictions.txt").read_text().split("\n")[:-1]
    card = " ".join((output / "README.md").read_text().split())
    assert "beam search with 2 beams and length penalty 1.0." in card
    assert (
        "as `generation_config.json` says, as the model was scored: beam size 2, length penalty 1.0 (the "
        "paper's: 4 and 0.6), at most the source length + 50 tokens."
    ) in card


def test_model_card_metadata(trained_run):
    output, results = trained_run.output, trained_run.results
    card = ModelCard.load(output / "README.md")
    assert card.data.language == ["en", "de"] and card.data.pipeline_tag == "translation"
    assert {"translation", "vanilla-transformer"} <= set(card.data.tags)
    scores = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert scores[("test", "bleu")] == round(results["predict_bleu"], 2)
    assert scores[("validation", "chrf")] == round(results["eval_chrf"], 2)
    assert "averaging | last 3" not in card.text and "checkpoint averaging: last 3" in card.text
    assert "Adam (β1=0.9, β2=0.98, ε=1e-09)" in card.text


def test_learning_rate_scale_gives_equation_3_times_the_scale(trained_run):
    # TINY_RUN: d_model 64, --warmup_steps 40, --learning_rate_scale 0.3
    peak = 0.3 * 64**-0.5 * 40**-0.5
    state = json.loads((trained_run.output / "trainer_state.json").read_text())
    logged = {entry["step"]: entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry}
    assert sorted(logged) == [25, 50, 75, 100, 125, 150]
    for step, rate in logged.items():
        # the rate of update `step`: Equation 3 at step_num = step - 1 (transformers' schedule gives the first update
        # rate 0, one step behind the paper's, as the README says)
        assert rate == pytest.approx(0.3 * 64**-0.5 * min((step - 1) ** -0.5, (step - 1) * 40**-1.5), rel=1e-6)
    assert logged[25] == pytest.approx(peak * 24 / 40) and logged[50] == pytest.approx(peak * (40 / 49) ** 0.5)
    card = (trained_run.output / "README.md").read_text()
    assert "learning rate: inverse_sqrt, peak 0.00593 (Equation 3 × 0.3), 40 warmup steps" in card
    assert f"{peak:.3g}" == "0.00593"


def test_the_final_model_is_the_mean_of_the_last_checkpoints(trained_run):
    # TINY_RUN: --save_steps 50, --max_steps 150, --average_last_checkpoints 3
    checkpoints = [
        load_file(trained_run.output / f"checkpoint-{step}" / "model.safetensors") for step in (50, 100, 150)
    ]
    final = load_file(trained_run.output / "model.safetensors")
    assert final.keys() == checkpoints[0].keys()
    for name, tensor in final.items():
        mean = torch.stack([checkpoint[name].double() for checkpoint in checkpoints]).mean(0).float()
        torch.testing.assert_close(tensor, mean, rtol=0, atol=1e-7, msg=name)
    assert not torch.equal(final["model.shared.weight"], checkpoints[-1]["model.shared.weight"])


def test_english_to_chinese_is_scored_with_sacrebleus_zh_tokenization(chinese_run):
    output, results = chinese_run.output, chinese_run.results
    predict = json.loads((output / "predict_results.json").read_text())
    for scores, prefix in ((predict, "predict"), (results, "predict"), (results, "eval")):
        assert re.fullmatch(
            r"nrefs:1\|case:mixed\|eff:no\|tok:zh\|smooth:exp\|version:[\d.]+", scores[f"{prefix}_bleu_signature"]
        )
    assert json.loads((output / "all_results.json").read_text())["predict_bleu_signature"].count("tok:zh") == 1

    # generated_predictions.txt: UTF-8 Chinese, one line a test sentence, scored exactly as sacrebleu scores it
    raw = (output / "generated_predictions.txt").read_bytes()
    assert b"\\u" not in raw
    lines = raw.decode("utf-8").split("\n")[:-1]
    assert len(lines) == 50 and sum(bool(CHINESE_CHARACTER.search(line)) for line in lines) >= 45, lines
    assert sum(line.endswith(("。", "？")) for line in lines) >= 40  # full-width, as the references end
    references = [
        json.loads(row)["translation"]["zh"]
        for row in (TATOEBA_EN_ZH / "test.jsonl").read_text(encoding="utf-8").splitlines()[:50]
    ]
    direct = sacrebleu.metrics.BLEU(tokenize="zh").corpus_score(lines, [references])
    assert predict["predict_bleu"] == pytest.approx(direct.score) and predict["predict_bleu"] > 0.3
    assert sacrebleu.metrics.BLEU(tokenize="13a").corpus_score(lines, [references]).score < direct.score / 2


def test_english_to_chinese_model_card_and_reloaded_pipeline(chinese_run):
    card = ModelCard.load(chinese_run.output / "README.md")
    assert card.data.language == ["en", "zh"]
    bleu = next(r for r in card.data.eval_results if r.dataset_split == "test" and r.metric_type == "bleu")
    assert "|tok:zh|" in bleu.metric_config and "|tok:zh|" in card.text
    source = json.loads((TATOEBA_EN_ZH / "test.jsonl").read_text(encoding="utf-8").splitlines()[0])["translation"]["en"]
    translation = (chinese_run.output / "generated_predictions.txt").read_text(encoding="utf-8").split("\n")[0]
    assert f'translator("{source}"))  # [{{"translation_text": "{translation}"}}]' in card.text
    translator = pipeline("translation", model=str(chinese_run.output), pipeline_class=TranslationPipeline)
    outputs = translator(["I like to eat apples.", "Where is the station?"])
    assert all(CHINESE_CHARACTER.search(output["translation_text"]) for output in outputs), outputs


@pytest.mark.slow
def test_bleu_tokenize_overrides_the_target_languages_choice(tmp_path):
    run_args = [*CHINESE_RUN, "--max_steps", "5", "--do_eval", "false", "--output_dir", str(tmp_path / "out")]
    results = run_translation.main([*run_args, "--bleu_tokenize", "char"])
    assert "|tok:char|" in results["predict_bleu_signature"]
    with pytest.raises(
        SystemExit, match=r"error: bleu_tokenize 'zh-cn' is not a sacreBLEU tokenization; choose one of"
    ):
        run_translation.main([*run_args, "--output_dir", str(tmp_path / "other"), "--bleu_tokenize", "zh-cn"])
    assert not (tmp_path / "other").exists()


def test_tokenization_truncates_to_the_given_lengths():
    dataset = Dataset.from_dict({"source": ["a b c d e f g h i j " * 20], "target": ["x y " * 30]})
    tokenizer = train_shared_bpe(["a b c d e f g h i j", "x y z"] * 50, vocab_size=300)
    tokenized = tokenize(dataset, tokenizer, max_source_length=8, max_target_length=5)
    assert len(tokenized[0]["input_ids"]) == 8 and tokenized[0]["input_ids"][-1] == tokenizer.eos_token_id
    assert len(tokenized[0]["labels"]) == 5 and tokenized[0]["labels"][-1] == tokenizer.eos_token_id


GOOD = json.dumps({"translation": {"en": "A cat.", "de": "Eine Katze."}})


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda d: ["--train_file", str(d / "nope.jsonl")], r"nope.jsonl: no such file"),
        (
            lambda d: ["--train_file", write_lines(d / "t.jsonl", [GOOD, '{"translation": {"de": "Hund."}}'])],
            r"t.jsonl:2: the translation has no 'en' sentence \(it has 'de'\)",
        ),
        (
            lambda d: [
                "--train_file",
                write_lines(d / "t.jsonl", [GOOD, GOOD, '{"translation": {"en": ""']),
            ],
            r"t.jsonl:3: not valid JSON",
        ),
        (
            lambda d: ["--train_file", write_lines(d / "t.jsonl", ['{"translation": {"en": "", "de": "Hund."}}'])],
            r"t.jsonl:1: the 'en' sentence is empty",
        ),
        (
            lambda d: ["--train_file", write_lines(d / "t.jsonl", [GOOD] * 50), "--max_source_length", "5000"],
            r"--max_source_length 5000 must be between 1 and the model's 1024 positions",
        ),
        (
            lambda d: ["--train_file", write_lines(d / "t.jsonl", [GOOD] * 50), "--config_overrides", "colour=3"],
            r"error: config_overrides: 'colour=3' is not NAME=VALUE",
        ),
        (
            lambda d: ["--train_file", write_lines(d / "t.jsonl", [GOOD] * 50), "--config_overrides", "dropout=2"],
            r"dropout=2 is invalid",
        ),
        (
            lambda d: [
                "--train_file",
                write_lines(d / "t.jsonl", [GOOD] * 50),
                "--config_overrides",
                "position_embedding_type=rotary",
            ],
            r"Validation error for field 'position_embedding_type': TypeError: .* expected one of "
            r"\('sinusoidal', 'learned'\), got rotary$",
        ),
        (
            lambda d: ["--tokenizer_name", str(d / "none"), "--train_file", write_lines(d / "t.jsonl", [GOOD] * 50)],
            r"none: no such folder",
        ),
        (
            lambda d: ["--train_file", write_lines(d / "t.jsonl", [GOOD] * 50), "--num_beams", "0"],
            r"num_beams=0 must be at least 1",
        ),
        (
            lambda d: [
                "--train_file",
                write_lines(d / "t.jsonl", [GOOD] * 50),
                "--average_last_checkpoints",
                "5",
                "--save_total_limit",
                "2",
            ],
            r"--average_last_checkpoints 5 is more than the --save_total_limit 2 checkpoints kept$",
        ),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, make_args, message):
    output = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        run_translation.main([*make_args(tmp_path), "--do_train", "--output_dir", str(output), "--report_to", "none"])
    assert str(exit_info.value.code).startswith("run_translation.py: error: ")
    assert re.search(message, str(exit_info.value.code)) and "\n" not in str(exit_info.value.code), exit_info.value.code
    assert not output.exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ("vocabulary", r"the tokenizer has 800 tokens but the model's vocab_size is 1000"),
        ("padding", r"the tokenizer's pad_token_id is 3 but the model config's is 1"),
    ],
)
def test_a_tokenizer_that_does_not_fit_the_model_stops_before_training(trained_run, tmp_path, change, message):
    if change == "vocabulary":
        tokenizer = train_shared_bpe(file_sentences([TRAIN], "en", "de"), vocab_size=800)
    else:
        tokenizer = AutoTokenizer.from_pretrained(trained_run.output)
        tokenizer.pad_token = "<unk>"
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    output = tmp_path / "out"
    arguments = [
        "--model_name_or_path",
        str(trained_run.output),
        "--tokenizer_name",
        str(tmp_path / "tokenizer"),
        "--train_file",
        TRAIN,
        "--max_train_samples",
        "100",
        "--do_train",
        "--output_dir",
        str(output),
    ]
    with pytest.raises(SystemExit) as exit_info:
        run_translation.main(arguments)
    assert re.fullmatch(
        rf"run_translation.py: error: --tokenizer_name \S+ does not fit --model_name_or_path \S+: {message}.*",
        str(exit_info.value.code),
    ), exit_info.value.code
    assert not output.exists()


def test_existing_output_dir_needs_overwrite(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").write_text("earlier")
    with pytest.raises(SystemExit, match="exists and is not empty; add overwrite_output_dir to replace it"):
        run_translation.main(["--train_file", TRAIN, "--do_train", "--output_dir", str(tmp_path / "out")])
    assert (tmp_path / "out" / "model.safetensors").read_text() == "earlier"


@pytest.mark.parametrize("line", HOSTILE_LINES[1:7])
def test_a_hostile_training_file_stops_the_command_in_one_line_naming_file_and_line(tmp_path, line):
    output = tmp_path / "out"
    train_file = write_bytes_lines(tmp_path, "train.jsonl", [GOOD.encode(), line])
    with pytest.raises(SystemExit) as exit_info:
        run_translation.main(["--train_file", train_file, "--do_train", "--output_dir", str(output)])
    assert_one_line_error(exit_info.value.code, f"run_translation.py: error: {train_file}:2: ")
    assert not output.exists()


RECIPE_KEYS = [
    "max_steps",
    "do_train",
    "train_file",
    "learning_rate_scale",
    "normalization",
    "preset",
    "fp16",
    "output_dir",
    "label_smoothing_factor",
    "average_last_checkpoints",
    "seed",
]


@FUZZ_SETTINGS
@given(
    recipe=st.one_of(
        st.dictionaries(st.sampled_from(RECIPE_KEYS) | st.text(max_size=8), JSON_VALUES, max_size=4),
        JSON_VALUES,
    ),
    form=st.sampled_from(["yaml", "json", "text"]),
)
@example(recipe={"average_last_checkpoints": 0}, form="yaml")  # found by 2,000 fresh examples: named no flag
def test_any_recipe_parses_or_is_one_line_naming_the_recipe(recipe, form):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / ("recipe.json" if form == "json" else "recipe.yaml")
        if form == "text":
            path.write_text(str(recipe), encoding="utf-8", errors="surrogatepass")
        else:
            path.write_text(
                json.dumps(recipe) if form == "json" else yaml.safe_dump(recipe),
                encoding="utf-8",
                errors="surrogatepass",
            )
        try:
            run_translation.parse_arguments([str(path), "--output_dir", folder])
            event("parsed")
        except ValueError as error:
            event("refused")
            # argparse names the flag, or (extra values: a list for a one-value flag) the values it did not use
            values = [repr(flag) for flag in recipe_flags(str(path))] if "not used" in str(error) else []
            keys = [f"--{key}" for key in recipe if isinstance(key, str)] if isinstance(recipe, dict) else []
            assert_one_line_error(error, str(path), *keys, *values)


def test_recipe_file_with_overrides(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("train_file: missing.jsonl\ndo_train: true\noutput_dir: x\nmax_tokens_per_batch: 100\n")
    _, data_args, training_args = run_translation.parse_arguments(
        [str(recipe), "--output_dir", str(tmp_path / "y"), "--max_tokens_per_batch", "2000"]
    )
    assert data_args.train_file == "missing.jsonl" and training_args.do_train
    assert training_args.output_dir == str(tmp_path / "y") and training_args.max_tokens_per_batch == 2000
    with pytest.raises(SystemExit, match=r"nothing\.yaml: cannot read the recipe"):
        run_translation.main([str(tmp_path / "nothing.yaml")])


def test_a_dataset_name_after_a_recipe_replaces_its_data_files_and_a_file_its_dataset(tmp_path):
    recipe = str(REPO_ROOT / "recipes" / "multi30k_small.yaml")
    _, data_args, _ = run_translation.parse_arguments([recipe])
    assert data_args.train_file.endswith("multi30k/train.jsonl") and data_args.dataset_name is None
    _, data_args, _ = run_translation.parse_arguments([recipe, "--dataset_name", "bentrevett/multi30k"])
    assert (data_args.dataset_name, data_args.train_file, data_args.validation_file, data_args.test_file) == (
        "bentrevett/multi30k",
        None,
        None,
        None,
    )
    assert data_args.dataset_description == "Multi30k (en-de)"  # the rest of the recipe stays
    _, data_args, _ = run_translation.parse_arguments([recipe, "--dataset-name=x", "--test_file", "mine.jsonl"])
    assert (data_args.dataset_name, data_args.train_file, data_args.test_file) == ("x", None, "mine.jsonl")

    wmt = str(REPO_ROOT / "recipes" / "wmt14_en_de_base.yaml")  # and a file after a recipe replaces its dataset
    _, data_args, _ = run_translation.parse_arguments([wmt, "--bf16", "false"])
    assert (data_args.dataset_name, data_args.dataset_config_name) == ("wmt14", "de-en")
    _, data_args, args = run_translation.parse_arguments([wmt, "--bf16", "false", "--train_file", "big.jsonl"])
    assert (data_args.dataset_name, data_args.dataset_config_name, data_args.train_file) == (None, None, "big.jsonl")
    assert args.max_tokens_per_batch == 3125  # the rest of the recipe stays


def test_a_run_from_a_local_dataset_folder_by_dataset_name(tmp_path):
    # bentrevett/multi30k's layout: a column a language, the validation split in val.jsonl
    animals = [("cat", "Katze"), ("dog", "Hund"), ("horse", "Pferd"), ("bird", "Vogel"), ("man", "Mann")]
    states = [("small", "klein"), ("big", "groß"), ("here", "hier"), ("old", "alt")]
    rows = [{"en": f"The {a} is {s}.", "de": f"Die {b} ist {t}."} for a, b in animals for s, t in states]
    folder = write_dataset(tmp_path / "multi30k", {"train": rows, "validation": rows[:3], "test": rows[3:7]})
    output = tmp_path / "out"
    results = run_translation.main(
        [
            *TINY_MODEL_RUN,
            "--dataset_name",
            folder,
            "--vocab_size",
            "300",
            "--max_steps",
            "2",
            "--warmup_steps",
            "1",
            "--output_dir",
            str(output),
        ]
    )
    assert (results["train_samples"], results["eval_samples"], results["predict_samples"]) == (20, 3, 4)
    assert len((output / "generated_predictions.txt").read_text().split("\n")[:-1]) == 4
    # the vocabulary trained in the run is the one the dataset's training sentences make
    sentences = [row[lang] for lang in ("en", "de") for row in rows]
    expected = train_shared_bpe(sentences, vocab_size=300).get_vocab()
    assert AutoTokenizer.from_pretrained(output).get_vocab() == expected and "Ġist" in expected


def test_a_run_with_bpe_dropout_and_a_moving_average_saves_the_tokenizer_and_the_average(tmp_path):
    pairs = [(a, b) for a in ("cat", "horse", "bird", "woman") for b in ("water", "snow", "streets")]
    rows = [{"translation": {"en": f"The {a} sees {b}.", "de": f"{b} sieht {a}."}} for a, b in pairs]
    data = write_lines(tmp_path / "pairs.jsonl", [json.dumps(row) for row in rows])
    output = tmp_path / "out"
    files = ["--train_file", data, "--validation_file", data, "--test_file", data]
    flags = [*files, "--vocab_size", "300", "--warmup_steps", "1", "--max_steps", "3", "--bpe_dropout", "0.2"]
    results = run_translation.main([*TINY_MODEL_RUN, *flags, "--ema_decay", "0.9", "--output_dir", str(output)])
    assert (results["train_samples"], results["eval_samples"], results["predict_samples"]) == (12, 12, 12)
    assert json.loads((output / "tokenizer.json").read_text())["model"]["dropout"] is None  # evaluation's segmentation
    average = load_file(output / "checkpoint-3" / MOVING_AVERAGE_NAME)
    saved = load_file(output / "model.safetensors")
    tensors = {name.removeprefix("module."): tensor for name, tensor in average.items() if name != "n_averaged"}
    tensors["model.shared.weight"] = tensors.pop("lm_head.weight")  # the tied table, saved under another name
    assert saved.keys() == tensors.keys() and all(torch.equal(saved[name], tensors[name]) for name in saved)
    card = (output / "README.md").read_text()
    assert "BPE-dropout: 0.2" in card and "moving average of the weights: decay 0.9, the final model" in card


def test_pad_to_multiple_of_pads_every_training_batch_to_it_within_the_token_budget(tmp_path):
    rows = [{"translation": {"en": "the cat " * n + "sleeps.", "de": "die Katze " * n + "schläft."}} for n in range(40)]
    data = write_lines(tmp_path / "pairs.jsonl", [json.dumps(row) for row in rows])
    files = ["--train_file", data, "--validation_file", data, "--test_file", data]
    flags = [*files, "--vocab_size", "300", "--max_tokens_per_batch", "96", "--pad_to_multiple_of", "8"]
    run = prepare(*run_translation.parse_arguments([*TINY_MODEL_RUN, *flags, "--output_dir", str(tmp_path / "out")]))
    trainer = TranslationTrainer(
        model=run.model,
        args=run.training_args,
        train_dataset=run.tokenized["train"],
        data_collator=training_collator(run),
    )
    shapes = {(*batch["input_ids"].shape, *batch["labels"].shape) for batch in trainer.get_train_dataloader()}
    assert len(shapes) > 2 and all(length % 8 == 0 for shape in shapes for length in (shape[1], shape[3]))
    assert all(rows * max(source, target) <= 96 for rows, source, _, target in shapes)


@pytest.mark.parametrize("recipe", sorted((REPO_ROOT / "recipes").glob("*.yaml")), ids=lambda path: path.name)
def test_recipes_list_only_what_differs_from_the_papers_defaults(recipe, tmp_path):
    # bf16's default is None, decided by the hardware: a recipe's true or false always says something
    defaults = TranslationTrainingArguments(output_dir=str(tmp_path))
    settings = yaml.safe_load(recipe.read_text())
    repeated = {
        name: value for name, value in settings.items() if name != "bf16" and getattr(defaults, name, object()) == value
    }
    assert not repeated, f"{recipe.name} repeats defaults: {repeated}"
    _, _, args = run_translation.parse_arguments([str(recipe), "--bf16", "false"])  # the WMT recipe's bf16 needs a GPU
    assert (args.adam_beta2, args.adam_epsilon, args.label_smoothing_factor) == (0.98, 1e-9, 0.1)
