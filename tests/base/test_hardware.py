"""The bfloat16 check against what the kernel says of the CPU, and what follows from it: the dtype
vanilla-translate chooses, and training under bfloat16 autocast with eager attention."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla_transformer.cli import run_translation
from hf_vanilla_transformer.engines.generate import translation_dtype
from hf_vanilla_transformer.engines.registry import load_translator
from hf_vanilla_transformer.hardware import ONEDNN_KERNELS_KEPT, cpu_has_bf16_units
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.run import prepare, train_and_evaluate
from hf_vanilla_transformer.translation.lines import translate_lines
from support.files import write_dataset
from support.models import generate_text, letter_tokenizer, tiny_model
from support.runs import TINY_MODEL_RUN


@pytest.fixture(params=[True, False], ids=["bf16 units", "no bf16 units"])
def bf16_units(request, monkeypatch):
    """This CPU as torch describes it, with or without bfloat16 units: the one place the hardware is read, so on
    either kind of CPU the test runs both kinds."""
    capabilities = {**torch.cpu.get_capabilities(), "avx512_bf16": request.param, "amx_bf16": request.param}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
    return request.param


def test_bf16_units_are_the_ones_proc_cpuinfo_lists():
    """What torch reports against what Linux lists (the tests run on Linux: a system without /proc/cpuinfo fails)."""
    flags = set(Path("/proc/cpuinfo").read_text().split())
    assert cpu_has_bf16_units() == bool({"avx512_bf16", "amx_bf16"} & flags)


def test_translation_is_bfloat16_exactly_where_the_cpu_has_bf16_units(tmp_path):
    assert translation_dtype("auto", "cpu") == (torch.bfloat16 if cpu_has_bf16_units() else torch.float32)
    assert translation_dtype("auto", "cuda") == torch.float32 and translation_dtype("float32", "cpu") == torch.float32
    model, tokenizer = tiny_model(), letter_tokenizer()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    sentences = ["a b c d", "j i h", "c a f e b e d"]
    for name in ("auto", "float32", "bfloat16"):
        translator = load_translator(str(tmp_path), "cpu", name)
        dtype = translation_dtype(name, "cpu")
        assert translator.model.dtype == dtype
        translations = translate_lines(
            translator, sentences, 1, {"num_beams": 2, "max_new_tokens": 8}, show_progress=False
        )
        model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=dtype)  # one sentence a batch: in bfloat16,
        assert translations == [
            generate_text(model, tokenizer, [one], num_beams=2, max_new_tokens=8)[0] for one in sentences
        ], name
        # padding and attention kernels change the sums' rounding, so the reference is the same sdpa model, unbatched


def test_training_is_bfloat16_by_default_exactly_on_a_cpu_with_bf16_units(bf16_units, tmp_path):
    def parsed(*flags):
        return run_translation.parse_arguments(["--output_dir", str(tmp_path), "--do_train", *flags])[2]

    assert cpu_has_bf16_units() is bf16_units
    on_cpu = ("--use_cpu", "true")
    for args in (parsed(*on_cpu), TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True)):
        assert (args.bf16, args.device.type) == (bf16_units, "cpu")
    # without --use_cpu transformers refuses bf16 on a machine without a GPU, and --use_cpu would change more than the
    # precision (several processes join one CPU run): float32, as transformers' own default
    assert parsed().bf16 is False and TranslationTrainingArguments(output_dir=str(tmp_path)).bf16 is False
    # the flag as transformers' example takes it, bare or with a value, wins over the hardware
    assert parsed("--bf16", *on_cpu).bf16 is True and parsed("--bf16", "true", *on_cpu).bf16 is True
    assert parsed("--bf16", "false").bf16 is False
    assert TranslationTrainingArguments(output_dir=str(tmp_path), bf16=False).bf16 is False


@pytest.mark.parametrize("flags", [[], ["--bf16", "false"], ["--attn_implementation", "sdpa"]], ids=" ".join)
def test_a_run_trains_in_bfloat16_with_eager_attention_exactly_on_a_cpu_with_bf16_units(
    bf16_units, flags, tmp_path, monkeypatch
):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "")  # so that the variable the run sets goes with the test
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    rows = [
        {"en": f"The {a} is {b}.", "de": f"Die {c} ist {d}."}
        for a, c in (("cat", "Katze"), ("dog", "Hund"), ("bird", "Vogel"))
        for b, d in (("small", "klein"), ("big", "groß"), ("old", "alt"))
    ]
    folder = write_dataset(tmp_path / "data", {"train": rows, "test": rows[:3]})
    output = tmp_path / "run"
    run = prepare(
        *run_translation.parse_arguments(
            [
                *TINY_MODEL_RUN,
                "--dataset_name",
                folder,
                "--vocab_size",
                "300",
                "--max_steps",
                "3",
                "--warmup_steps",
                "1",
                "--do_eval",
                "false",
                "--output_dir",
                str(output),
                *flags,
            ]
        )
    )
    bf16 = bf16_units and flags != ["--bf16", "false"]
    eager = bf16 and not flags
    encoded = run.tokenizer(["The cat is small."], return_tensors="pt")
    weights = run.model.get_encoder()(**encoded, output_attentions=True).attentions  # none on the sdpa path
    assert (len(weights) == 2 and all(layer is not None for layer in weights)) is eager
    seen = []  # (training?, dtype) of a matrix product's output and of the logits, at each call
    for module in (run.model.get_encoder().layers[0].feed_forward.fc1, run.model.lm_head):
        module.register_forward_hook(lambda module, args, output: seen.append((module.training, output.dtype)))
    train_and_evaluate(run)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_KERNELS_KEPT)
    products = torch.bfloat16 if bf16 else torch.float32
    assert {dtype for training, dtype in seen if training} == {products}  # three steps, under autocast or not
    assert {dtype for training, dtype in seen if not training} == {torch.float32}  # prediction: the saved precision
    assert {tensor.dtype for tensor in load_file(output / "model.safetensors").values()} == {torch.float32}
    record = json.loads((output / "run_record.json").read_text())
    assert record["training"]["precision"] == (
        "bfloat16 autocast, float32 weights (saved in float32)" if bf16 else "float32"
    )
    assert "_attn_implementation" not in json.loads((output / "config.json").read_text())


# In a process of its own, whose oneDNN has built no kernel yet: products of more shapes than oneDNN keeps by default,
# twice over; in the second round oneDNN prints a line for each kernel it builds ("cache_miss") or finds kept. The
# products are float32 convolutions, which torch runs through oneDNN on every x86 CPU (its bfloat16 matrix products
# only on CPUs with bfloat16 units); oneDNN keeps the kernels of both in the one cache the variable sizes.
SHAPES_TWICE = """
import torch
from hf_vanilla_transformer.hardware import keep_more_onednn_kernels
keep_more_onednn_kernels()
weights = torch.ones(16, 16, 3, 3)
for width in range(3, 1203):
    torch.nn.functional.conv2d(torch.ones(1, 16, 4, width), weights)
with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
    for width in range(3, 1203):
        torch.nn.functional.conv2d(torch.ones(1, 16, 4, width), weights)
"""


@pytest.mark.slow  # 1,200 shapes' kernels built twice in a process of its own
@pytest.mark.parametrize("capacity", [None, "1024"], ids=["ours", "the user's"])
def test_onednn_keeps_the_kernels_of_every_batch_shape_unless_the_user_says_otherwise(capacity):
    environment = {key: value for key, value in os.environ.items() if key != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if capacity is not None:
        environment["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = capacity
    second_round = subprocess.run(
        [sys.executable, "-c", SHAPES_TWICE], env=environment, capture_output=True, text=True, check=True
    ).stdout
    built, found = second_round.count("create:cache_miss"), second_round.count("create:cache_hit")
    # ours keeps every shape's kernels from the first round; with 1,024 kept, the second round builds them again
    if capacity is None:
        assert built == 0 and found > 1200, (built, found)
    else:
        assert built > 1200, (built, found)
