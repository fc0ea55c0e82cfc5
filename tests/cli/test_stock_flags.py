"""run_translation.py with the flags of transformers' own translation example (examples/pytorch/translation: its
README's commands and its DataTrainingArguments) and the Seq2SeqTrainingArguments a user is likely to pass. Each run
ends with a folder that loads and translates as the run scored; a flag we do not support is refused before training,
in one line."""

import json

import pytest
import torch
from transformers import GenerationConfig, pipeline

import run_translation
from hf_vanilla_transformer.model.pipeline_translation import TranslationPipeline
from support.hostile import assert_one_line_error
from support.paths import TEST, TRAIN, VALIDATION
from support.runs import QUIET_CPU

pytestmark = pytest.mark.slow  # runs run_translation.py on Multi30k slices

# a 1+1-layer d_model 32 model on 200 pairs, 15 steps: each run takes seconds
STOCK_RUN = [
    "--preset",
    "small",
    "--config_overrides",
    "d_model=32,encoder_ffn_dim=64,decoder_ffn_dim=64,encoder_layers=1,decoder_layers=1",
    "--source_lang",
    "en",
    "--target_lang",
    "de",
    "--train_file",
    TRAIN,
    "--validation_file",
    VALIDATION,
    "--test_file",
    TEST,
    "--max_train_samples",
    "200",
    "--max_eval_samples",
    "12",
    "--max_predict_samples",
    "12",
    "--vocab_size",
    "500",
    "--do_train",
    "--do_eval",
    "--do_predict",
    "--predict_with_generate",
    "--max_steps",
    "15",
    "--warmup_steps",
    "5",
    "--per_device_train_batch_size=16",
    "--per_device_eval_batch_size=4",
    *QUIET_CPU,
    "--seed",
    "0",
]


def greedy_sampling_config(tmp_path) -> str:
    path = tmp_path / "sampling.json"
    path.write_text(json.dumps({"do_sample": True, "top_k": 10, "temperature": 0.7, "num_beams": 1}))
    return str(path)


FLAG_GROUPS = {
    "greedy evaluation": ["--num_beams", "1"],
    "greedy through the Trainer's flag": ["--generation_num_beams", "1"],
    "evaluation every few steps": ["--eval_strategy", "steps", "--eval_steps", "5"],
    "a checkpoint per epoch": ["--save_strategy", "epoch"],
    "the best model by BLEU": [
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "5",
        "--save_strategy",
        "steps",
        "--save_steps",
        "5",
        "--load_best_model_at_end",
        "--metric_for_best_model",
        "bleu",
    ],
    "a generation length": ["--generation_max_length", "12"],
    "a source length": ["--max_source_length", "16", "--max_target_length", "16"],
    "gradient accumulation": ["--gradient_accumulation_steps", "2"],
    "bf16 on the CPU": ["--bf16", "true"],
    "gradient checkpointing": ["--gradient_checkpointing", "true"],
    # an epoch's last, smaller batch would be a third shape to compile (its batch size)
    "torch.compile": ["--torch_compile", "true", "--dataloader_drop_last", "true"],
    "the README's bare switches": ["--overwrite_output_dir", "--predict_with_generate"],
    "sampling from a generation config file": ["--generation_config", greedy_sampling_config],
}


@pytest.mark.parametrize("group", FLAG_GROUPS)
def test_each_stock_flag_group_trains_and_saves_a_model_that_translates_as_it_was_scored(group, tmp_path):
    flags = [flag(tmp_path) if callable(flag) else flag for flag in FLAG_GROUPS[group]]
    output = tmp_path / "run"
    results = run_translation.main([*STOCK_RUN, *flags, "--output_dir", str(output)])
    assert results["train_samples"] == 200 and "predict_bleu" in results and "eval_bleu" in results

    saved = GenerationConfig.from_pretrained(output)
    saved.validate(strict=True)  # what transformers requires to save it again
    translator = pipeline("translation", model=str(output), pipeline_class=TranslationPipeline)
    with open(TEST, encoding="utf-8") as file:
        sources = [json.loads(line)["translation"]["en"] for line in file.readlines()[:12]]
    # the evaluation's batches; sampling draws again, so there only the count is the same
    if saved.do_sample:
        torch.manual_seed(0)
    translations = [t["translation_text"] for t in translator(sources, batch_size=4)]
    predictions = (output / "generated_predictions.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(translations) == len(predictions) == 12
    if not saved.do_sample:
        assert translations == predictions


def test_the_saved_decoding_is_the_flags(tmp_path):
    output = tmp_path / "run"
    run_translation.main(
        [
            *STOCK_RUN,
            "--generation_num_beams",
            "3",
            "--generation_max_length",
            "30",
            "--length_penalty",
            "1.2",
            "--output_dir",
            str(output),
        ]
    )
    saved = json.loads((output / "generation_config.json").read_text())
    assert (saved["num_beams"], saved["max_length"], saved["length_penalty"]) == (3, 30, 1.2)
    assert saved["max_new_tokens_over_source"] == 50  # the paper's limit stays beside them
    sampling = tmp_path / "sampling"
    run_translation.main(
        [
            *STOCK_RUN,
            "--generation_config",
            greedy_sampling_config(tmp_path),
            "--num_beams",
            "1",
            "--output_dir",
            str(sampling),
        ]
    )
    saved = json.loads((sampling / "generation_config.json").read_text())
    assert (saved["do_sample"], saved["top_k"], saved["num_beams"]) == (True, 10, 1)
    assert "length_penalty" not in saved  # the paper's 0.6 is for beam search: it went back to the default


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num_beams", "1", "--length_penalty", "0.6"], "length_penalty=0.6 has no effect with greedy decoding"),
        (["--generation_num_beams", "0"], "num_beams=0 must be at least 1"),
        (["--source_prefix", "translate English to German: "], "--source_prefix"),
        (["--val_max_target_length", "128"], "--val_max_target_length"),
        (["--forced_bos_token", "de"], "--forced_bos_token"),
        (["--pad_to_max_length"], "--pad_to_max_length"),
    ],
)
def test_a_flag_we_do_not_support_or_a_decoding_that_cannot_be_saved_is_refused_before_training(
    flags, message, tmp_path, capsys
):
    output = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        run_translation.main([*STOCK_RUN, *flags, "--output_dir", str(output)])
    assert exit_info.value.code != 0
    assert_one_line_error(exit_info.value.code, message)
    assert not (output / "checkpoint-15").exists() and not (output / "model.safetensors").exists()
