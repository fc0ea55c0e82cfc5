"""Translating many sentences with a trained model, one a line: what `vanilla-translate` (cli/translate.py) runs.

Input and output are UTF-8, files and standard streams alike. Lines are sorted by length into batches, so that
little padding is computed, and written back in input order; an empty line stays an empty line. Decoding is the
model's own (for ours the paper's: beam 4, length penalty 0.6, at most source length + 50 tokens) unless
--num_beams, --length_penalty or --max_new_tokens say otherwise. A folder written by `vanilla-export-ctranslate2` is
translated with CTranslate2 (the [fast] extra), with the same decoding: many times faster on a CPU.
"""

import functools
import logging
import os
import sys
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.files import decoded_lines, numbered_lines, write_text_atomically
from hf_vanilla_transformer.hardware import check_device, check_torch_device, cpu_has_bf16_units, default_device
from hf_vanilla_transformer.loading import load_model_and_tokenizer, load_tokenizer, model_folder
from hf_vanilla_transformer.model.modeling_vanilla_transformer import source_length_margin
from hf_vanilla_transformer.tools.export_ctranslate2 import QUANTIZATIONS, is_ctranslate2_folder

logger = logging.getLogger("vanilla-translate")
# CTranslate2's compute_type: the weights' type as saved (default), the fastest this device has (auto), or one named
COMPUTE_TYPES = ("default", "auto", *QUANTIZATIONS)


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 file ('-': standard input, read as bytes whatever the locale), blank ones included."""
    numbered = decoded_lines(sys.stdin.buffer, "standard input") if path == "-" else numbered_lines(path)
    return [line.rstrip("\r\n") for _, line in numbered]


def load_translator(model_path: str, device: str | None, dtype: str = "auto", threads: int | None = None,
                    **ctranslate2_options):  # fmt: skip
    """The folder's translator (`translator_loader`'s, loaded)."""
    return translator_loader(model_path, device, dtype, threads, **ctranslate2_options)()


def translator_loader(model_path: str, device: str | None, dtype: str = "auto", threads: int | None = None,
                      **ctranslate2_options) -> Callable[[], "PipelineTranslator | CTranslate2Translator"]:  # fmt: skip
    """A function that loads the folder's translator: for a CTranslate2 folder (from export_ctranslate2)
    ctranslate2.Translator with `ctranslate2_options` (compute_type, inter_threads, intra_threads; None: the
    default) and `threads` as the default inter_threads, for any other our TranslationPipeline with the model in
    `dtype` (`translation_dtype`). What can be refused without loading is refused here, at once: an option
    for the other kind of folder, a device this machine lacks, a missing ctranslate2 package, a compute type the
    device lacks."""
    model_path = model_folder(model_path)
    options = {name: value for name, value in ctranslate2_options.items() if value is not None}
    if is_ctranslate2_folder(model_path):
        if dtype != "auto":
            raise ValueError(f"dtype {dtype} is for model folders; {model_path} is a CTranslate2 folder (compute_type)")
        options = {"inter_threads": threads, **options}
        ctranslate2_device(device, options.get("compute_type", "default"))
        return functools.partial(CTranslate2Translator, model_path, device, **options)
    if options:
        name, value = next(iter(options.items()))
        raise ValueError(f"{name} {value} is for CTranslate2 folders; {model_path} is a model folder (dtype)")
    check_torch_device(default_device(device))
    return functools.partial(PipelineTranslator, model_path, device, translation_dtype(dtype, device))


class PipelineTranslator:
    """Translation with the model's `generate()` through our TranslationPipeline, one batch at a time."""

    batches_per_call = 1

    def __init__(self, model_path: str, device: str | None, dtype=None):
        from hf_vanilla_transformer.model.pipeline_translation import TranslationPipeline

        model, self.tokenizer = load_model_and_tokenizer(model_path, device, dtype)
        self.max_positions = model.config.max_position_embeddings
        self.pipeline = TranslationPipeline(model=model, tokenizer=self.tokenizer, device=model.device)

    def translate(self, sentences: list[str], batch_size: int, **generate_kwargs) -> list[str]:
        if "max_new_tokens" in generate_kwargs:  # --max_new_tokens replaces the model's max_length, which transformers
            generate_kwargs["max_length"] = None  # would otherwise warn about at every batch, and then ignore anyway
        outputs = self.pipeline(sentences, batch_size=batch_size, **generate_kwargs)
        return [output["translation_text"] for output in outputs]


class CTranslate2Translator:
    """Translation with `ctranslate2.Translator`, decoding as the model's generation config says (for ours the
    paper's: beam 4, length penalty 0.6, at most the source length + 50 tokens). CTranslate2 takes one length
    limit per call, so a batch decodes up to its longest source + 50 and each translation is then cut to its own
    source's limit: exactly what generate() gives for greedy decoding; a beam that reaches the limit may differ."""

    def __init__(self, model_path: str, device: str | None, compute_type: str = "default",
                 inter_threads: int | None = None, intra_threads: int | None = None):  # fmt: skip
        from transformers import GenerationConfig

        device = ctranslate2_device(device, compute_type)
        import ctranslate2  # found by ctranslate2_device, or it says which extra installs it

        self.tokenizer = load_tokenizer(model_path)
        generation = GenerationConfig.from_pretrained(model_path)
        self.max_positions = generation.max_length
        self.num_beams = generation.num_beams or 1
        self.length_penalty = generation.length_penalty
        self.new_tokens_over_source = source_length_margin(generation)
        # on a CPU, one batch per core, each on one thread, beats all cores on one batch: 2.3x here for int8
        # (BENCHMARKS.md); a call hands over several batches so that every worker has one
        on_cpu = device.type == "cpu"
        inter_threads = inter_threads or (os.cpu_count() if on_cpu else 1)
        intra_threads = intra_threads or (1 if on_cpu else 0)
        self.batches_per_call = 2 * inter_threads
        # CTranslate2 names a device by its type and index apart: cuda:1 is device="cuda", device_index=1
        self.translator = ctranslate2.Translator(
            model_path, device=device.type, device_index=device.index or 0, compute_type=compute_type,
            inter_threads=inter_threads, intra_threads=intra_threads,
        )  # fmt: skip

    def translate(
        self,
        sentences: list[str],
        batch_size: int,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_new_tokens: int | None = None,
    ) -> list[str]:
        ids = self.tokenizer(sentences, truncation=True, max_length=self.max_positions)["input_ids"]
        if max_new_tokens is not None:
            limits = [max_new_tokens] * len(ids)
        elif self.new_tokens_over_source is not None:
            limits = [len(source) + self.new_tokens_over_source for source in ids]
        else:
            limits = [self.max_positions] * len(ids)
        limits = [min(limit, self.max_positions) for limit in limits]
        results = self.translator.translate_batch(
            [self.tokenizer.convert_ids_to_tokens(source) for source in ids],
            beam_size=num_beams or self.num_beams,
            length_penalty=self.length_penalty if length_penalty is None else length_penalty,
            max_decoding_length=max(limits),
            max_batch_size=batch_size,
        )
        return [
            self.tokenizer.decode(
                self.tokenizer.convert_tokens_to_ids(result.hypotheses[0][:limit]), skip_special_tokens=True
            )
            for result, limit in zip(results, limits, strict=True)
        ]


def ctranslate2_device(device: str | None, compute_type: str):
    """The device CTranslate2 is to run on (`device`; default: cuda if it finds one, else cpu) as a torch.device,
    refused where CTranslate2 is not installed, finds no such device or cannot compute in `compute_type` there."""
    ctranslate2 = require("ctranslate2", "translating a CTranslate2 folder")
    cuda_devices = ctranslate2.get_cuda_device_count()
    engine = f"CTranslate2 {ctranslate2.__version__}"
    device = check_device(device or ("cuda" if cuda_devices else "cpu"), engine, "cuda" if cuda_devices else None,
                          cuda_devices)  # fmt: skip
    supported = ctranslate2.get_supported_compute_types(device.type, device.index or 0)
    if compute_type not in ("default", "auto", *supported):
        types = ", ".join(sorted(supported))
        raise ValueError(f"compute_type {compute_type}: {engine} computes in {types} on this {device.type}")
    return device


def translate_lines(translator, lines: list[str], batch_size: int, generate_kwargs: dict, show_progress: bool):
    """Translations of `lines`, in order; blank lines give empty lines, and the whitespace around a sentence is
    not translated (as in the pipeline). Batches hold sentences of similar length. Only strings are kept, never a
    batch's tensors, so memory grows with the text alone."""
    lines = [line.strip() for line in lines]
    todo = [i for i, line in enumerate(lines) if line]
    lengths = token_counts(translator.tokenizer, [lines[i] for i in todo])
    positions = translator.max_positions
    too_long = [index + 1 for index, length in zip(todo, lengths, strict=True) if length > positions]
    if too_long:
        logger.warning(
            "%d line(s) have more tokens than the model's %d positions; only their first %d are translated "
            "(line %s%s)",
            len(too_long), positions, positions, too_long[0], ", ..." if len(too_long) > 1 else "",
        )  # fmt: skip
    order = [todo[j] for j in sorted(range(len(todo)), key=lengths.__getitem__, reverse=True)]
    translations = [""] * len(lines)
    with tqdm(total=len(order), disable=not show_progress, unit="sentence", file=sys.stderr) as progress:
        step = batch_size * translator.batches_per_call
        for start in range(0, len(order), step):
            batch = order[start : start + step]
            outputs = translator.translate([lines[i] for i in batch], batch_size, **generate_kwargs)
            for index, output in zip(batch, outputs, strict=True):
                # a translation is one line of output whatever the model writes, or every later line is misplaced
                translations[index] = " ".join(output.splitlines())
            progress.update(len(batch))
    return translations


def token_counts(tokenizer, texts: list[str], chunk: int = 4096) -> list[int]:
    """The number of tokens of each text, tokenized a chunk at a time so that all the ids are never held at once."""
    return [
        len(ids)
        for start in range(0, len(texts), chunk)
        for ids in tokenizer(texts[start : start + chunk])["input_ids"]
    ]


def write_lines(path: str, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        return
    write_text_atomically(path, text)


def translation_dtype(name: str, device: str | None) -> torch.dtype:
    """The dtype to load a model in for translating on `device` (None: cuda if available). "auto" is bfloat16 on a
    CPU with bfloat16 units, where generate() ran 1.33x (Intel Xeon, AMX) to 1.65x (AMD EPYC, AVX512-BF16) as fast
    as float32 at the same test BLEU (BENCHMARKS.md, "bfloat16 on a CPU with bf16 units"), and float32 elsewhere
    (not measured faster at equal BLEU)."""
    if name != "auto":
        return getattr(torch, name)
    on_cpu = default_device(device).startswith("cpu")
    return torch.bfloat16 if on_cpu and cpu_has_bf16_units() else torch.float32
