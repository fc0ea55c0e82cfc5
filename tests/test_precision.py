"""The bfloat16 check against what the kernel says of the CPU, and the dtype vanilla-translate chooses from it."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla_transformer.hardware import cpu_has_bf16_units
from hf_vanilla_transformer.tools.translate import load_translator, translate_lines, translation_dtype
from support.models import generate_text, letter_tokenizer, tiny_model


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads Linux's /proc/cpuinfo")
def test_bf16_units_are_the_ones_proc_cpuinfo_lists():
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
        assert translator.pipeline.model.dtype == dtype
        translations = translate_lines(
            translator, sentences, 1, {"num_beams": 2, "max_new_tokens": 8}, show_progress=False
        )
        model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=dtype)  # one sentence a batch: in bfloat16,
        assert translations == [
            generate_text(model, tokenizer, [one], num_beams=2, max_new_tokens=8)[0] for one in sentences
        ], name
        # padding and attention kernels change the sums' rounding, so the reference is the same sdpa model, unbatched
