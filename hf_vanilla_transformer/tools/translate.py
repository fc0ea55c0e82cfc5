"""Translating many sentences with a trained model, one a line: what `vanilla-translate` (cli/translate.py) runs.

Input and output are UTF-8, files and standard streams alike. Lines are sorted by length into batches, so that
little padding is computed, and written back in input order; an empty line stays an empty line. Decoding is the
model's own (for ours the paper's: beam 4, length penalty 0.6, at most source length + 50 tokens) unless
--num_beams, --length_penalty or --max_new_tokens say otherwise. A folder written by `vanilla-export-ctranslate2` is
translated with CTranslate2 (the [fast] extra), with the same decoding: many times faster on a CPU; one written by
`vanilla-export-onnx` greedily with ONNX Runtime; several model folders together as an ensemble. What is asked
beyond the decoding settings (n-best lists and scores, prefixes, constraints, alignments) is a `Steering`
(tools/translator.py), which each kind of translator gives as far as its engine can and refuses beyond.
"""

import dataclasses
import functools
import json
import logging
import re
import sys
from collections.abc import Callable

import torch
from tqdm.auto import tqdm
from transformers.generation import LogitsProcessorList

from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.files import InputError, decoded_lines, numbered_lines, write_text_atomically
from hf_vanilla_transformer.hardware import check_device, check_torch_device, cpu_has_bf16_units, default_device
from hf_vanilla_transformer.loading import load_model_and_tokenizer, load_tokenizer, model_folder
from hf_vanilla_transformer.model.modeling_vanilla_transformer import max_new_tokens_over_source_of
from hf_vanilla_transformer.model.pipeline_translation import sequence_scores
from hf_vanilla_transformer.tools.alignment import format_alignment
from hf_vanilla_transformer.tools.ctranslate2_runtime import CTranslate2Translator, ctranslate2_device
from hf_vanilla_transformer.tools.export_ctranslate2 import is_ctranslate2_folder
from hf_vanilla_transformer.tools.prefix import PrefixLogitsProcessor, prefix_token_ids
from hf_vanilla_transformer.tools.translator import Hypothesis, Steering, SteeringError, Translator, length_limit

logger = logging.getLogger("vanilla-translate")
OUTPUT_FORMATS = ("plain", "jsonl")
NBEST_SEPARATOR = " ||| "  # between the fields of an n-best line, as fairseq, Moses and Marian write them


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 file ('-': standard input, read as bytes whatever the locale), blank ones included."""
    numbered = decoded_lines(sys.stdin.buffer, "standard input") if path == "-" else numbered_lines(path)
    return [line.rstrip("\r\n") for _, line in numbered]


def read_constraints(path: str) -> list[list[str]]:
    """A constraints file: per line a JSON list of the words or phrases that line's translation must contain (a
    blank line: none). Anything else is refused, naming the file and line."""
    constraints = []
    for number, line in numbered_lines(path):
        try:
            phrases = json.loads(line) if line.strip() else []
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not JSON ({error.msg}); write a list of strings") from None
        if not isinstance(phrases, list) or not all(isinstance(phrase, str) for phrase in phrases):
            raise InputError(f"{path}:{number}: not a JSON list of strings")
        constraints.append(phrases)
    return constraints


def format_translations(found: list[list[Hypothesis]], form: str = "plain", n_best: bool = False) -> list[str]:
    """The output lines for the hypotheses of each input line. plain: the best translation a line, or with `n_best`
    each hypothesis as `line ||| translation ||| score ||| log-probability` (the input line counted from 0, as in
    Moses' and fairseq's n-best lists); an alignment, where there is one, follows as a last `||| i-j ...` field.
    jsonl: one JSON object an input line, {"translations": [...]}, each hypothesis with what it holds."""
    if form == "jsonl":
        return [
            json.dumps({"translations": [hypothesis_fields(h) for h in hypotheses]}, ensure_ascii=False)
            for hypotheses in found
        ]
    lines = []
    for number, hypotheses in enumerate(found):
        for hypothesis in hypotheses if n_best else hypotheses[:1]:
            fields = [hypothesis.text]
            if n_best:
                fields = [str(number), hypothesis.text, f"{hypothesis.score:.4f}", f"{hypothesis.log_probability:.4f}"]
            if hypothesis.alignment is not None:
                fields.append(format_alignment(hypothesis.alignment))
            lines.append(NBEST_SEPARATOR.join(fields))
    return lines


def hypothesis_fields(hypothesis: Hypothesis) -> dict:
    """A hypothesis as JSON: the translation and what it holds besides, the alignment as `i-j` pairs."""
    fields = {"translation": hypothesis.text}
    for name in ("score", "log_probability", "tokens", "token_log_probs"):
        if getattr(hypothesis, name) is not None:
            fields[name] = getattr(hypothesis, name)
    if hypothesis.alignment is not None:
        fields["alignment"] = format_alignment(hypothesis.alignment)
    return fields


def load_translator(
    model_path: str | list[str],
    device: str | None,
    dtype: str = "auto",
    threads: int | None = None,
    **ctranslate2_options,
):
    """The folder's translator (`translator_loader`'s, loaded)."""
    return translator_loader(model_path, device, dtype, threads, **ctranslate2_options)()


def translator_kind(model_paths: list[str]) -> type["Translator"]:
    """The translator class the folders are translated with: a CTranslate2 or an ONNX folder by its engine, model
    folders (one, or several as an ensemble) by our model's `generate()`; an ensemble of exports is refused."""
    from hf_vanilla_transformer.tools.onnx_runtime import OnnxTranslator, is_onnx_folder

    def kind(path: str) -> type[Translator]:
        if is_ctranslate2_folder(path):
            return CTranslate2Translator
        return OnnxTranslator if is_onnx_folder(path) else ModelTranslator

    exports = [path for path in model_paths if kind(path) is not ModelTranslator]
    if len(model_paths) > 1 and exports:
        raise ValueError(f"{exports[0]} is an export; only model folders decode together as an ensemble")
    return kind(model_paths[0])


def translator_loader(
    model_path: str | list[str],
    device: str | None,
    dtype: str = "auto",
    threads: int | None = None,
    attn_implementation: str | None = None,
    **ctranslate2_options,
) -> Callable[[], "Translator"]:
    """A function that loads the folder's translator: for a CTranslate2 folder (from export_ctranslate2)
    ctranslate2.Translator with `ctranslate2_options` (compute_type, inter_threads, intra_threads; None: the
    default) and `threads` as the default inter_threads, for an ONNX folder (export_onnx) ONNX Runtime with `threads`,
    for any other the model in `dtype` (`translation_dtype`) on the attention path `attn_implementation` (default:
    transformers'; "eager" gives alignments without a copy of the model); several model folders decode together as an
    ensemble (tools/ensemble.py). What can be refused without loading is refused here, at once: an option for
    another kind of folder, an ensemble of exports, a device this machine lacks, a missing package, a compute type
    the device lacks."""
    paths = [model_folder(path) for path in ([model_path] if isinstance(model_path, str) else model_path)]
    kind = translator_kind(paths)
    options = {name: value for name, value in ctranslate2_options.items() if value is not None}
    if kind is CTranslate2Translator:
        if dtype != "auto":
            raise ValueError(f"dtype {dtype} is for model folders; {paths[0]} is a CTranslate2 folder (compute_type)")
        options = {"inter_threads": threads, **options}
        ctranslate2_device(device, options.get("compute_type", "default"))
        return functools.partial(CTranslate2Translator, paths[0], device, **options)
    if options:
        name, value = next(iter(options.items()))
        what = "a model folder (dtype)" if kind is ModelTranslator else "an ONNX folder"
        raise ValueError(f"{name} {value} is for CTranslate2 folders; {paths[0]} is {what}")
    if kind is not ModelTranslator:
        if dtype != "auto":
            raise ValueError(f"dtype {dtype} is for model folders; {paths[0]} is an ONNX folder")
        check_device(device or "cpu", "ONNX Runtime (CPU)", None, 0)
        require("onnxruntime", "translating an ONNX folder")
        return functools.partial(kind, paths[0], threads=threads)
    check_torch_device(default_device(device))
    return functools.partial(ModelTranslator, paths, device, translation_dtype(dtype, device), attn_implementation)


def check_request(model_paths: list[str], steering: Steering, generate_kwargs: dict) -> None:
    """Refuses, in one line naming the folder, what its kind of translator cannot do (`translator_kind`), before
    anything is loaded or read."""
    kind = translator_kind(model_paths)
    unable = [name for name in steering.requested() if name not in kind.features]
    unable += [name for name in generate_kwargs if name not in kind.decoding]
    if unable:
        raise ValueError(f"{model_paths[0]} is translated by {kind.engine}, which cannot give {', '.join(unable)}")


class ModelTranslator(Translator):
    """Translation with the model's `generate()` (several models: an ensemble, tools/ensemble.py), one batch at a
    time: prefixes through a logits processor (tools/prefix.py), constraints by constrained beam search
    (tools/constraints.py), scores from generate()'s own logits (`sequence_scores`), alignments from the
    encoder-decoder attention of each translation (tools/alignment.py)."""

    engine = "generate()"
    features = frozenset({"n_best", "scores", "alignments", "prefixes", "constraints"})
    decoding = Translator.decoding | Translator.sampling

    def __init__(
        self, model_paths: str | list[str], device: str | None, dtype=None, attn_implementation: str | None = None
    ):
        model_paths = [model_paths] if isinstance(model_paths, str) else model_paths
        if len(model_paths) > 1:
            from hf_vanilla_transformer.tools.ensemble import load_ensemble

            self.model, self.tokenizer = load_ensemble(model_paths, device, dtype)
        else:
            self.model, self.tokenizer = load_model_and_tokenizer(model_paths[0], device, dtype, attn_implementation)
        self.model_paths = model_paths
        self.max_positions = self.model.config.max_position_embeddings
        self.generation_config = self.model.generation_config
        self.max_new_tokens_over_source = max_new_tokens_over_source_of(self.generation_config)
        self.num_beams = self.generation_config.num_beams or 1

    def hypotheses(self, sentences: list[str], batch_size: int, steering: Steering, **generate_kwargs):
        batch = self.tokenizer(
            sentences, truncation=True, max_length=self.max_positions, padding=True, return_tensors="pt"
        ).to(self.model.device)
        if "max_new_tokens" in generate_kwargs:  # --max_new_tokens replaces the model's max_length, which transformers
            generate_kwargs["max_length"] = None  # would otherwise warn about at every batch, and then ignore anyway
        count = steering.n_best
        length_penalty = generate_kwargs.get("length_penalty", self.generation_config.length_penalty)
        if steering.constraints is not None and any(steering.constraints):
            from hf_vanilla_transformer.tools.constraints import constrained_beam_search, constraint_token_ids

            constraints = [constraint_token_ids(self.tokenizer, phrases) for phrases in steering.constraints]
            settings = {
                key: generate_kwargs[key]
                for key in ("num_beams", "length_penalty", "max_new_tokens")
                if key in generate_kwargs
            }
            output = constrained_beam_search(
                self.model,
                batch["input_ids"],
                batch["attention_mask"],
                constraints,
                num_return_sequences=count,
                **settings,
            )
            scored = output.sequence_scores(self.generation_config.eos_token_id, length_penalty)
        else:
            processors = LogitsProcessorList()
            if steering.prefixes is not None:
                processors.append(PrefixLogitsProcessor(prefix_token_ids(self.tokenizer, steering.prefixes)))
            if len(self.model_paths) > 1:  # an ensemble's length rule is a processor it gives: generate() is not ours
                processors.extend(self.model.source_length_limit(batch))
            output = self.model.generate(
                **batch,
                logits_processor=processors,
                num_return_sequences=count,
                return_dict_in_generate=True,
                output_logits=steering.scores,
                **generate_kwargs,
            )
            scored = sequence_scores(self.model, output, length_penalty) if steering.scores else None
        texts = self.tokenizer.batch_decode(output.sequences, skip_special_tokens=True)
        found = [Hypothesis(text) for text in texts]
        if steering.scores:
            for hypothesis, score in zip(found, scored, strict=True):
                hypothesis.score, hypothesis.log_probability = score.score, score.log_probability
                hypothesis.tokens = self.tokenizer.convert_ids_to_tokens(score.token_ids)
                hypothesis.token_log_probs = score.token_log_probs
        if steering.alignments:
            from hf_vanilla_transformer.tools.alignment import align

            sources = [sentence for sentence in sentences for _ in range(count)]
            # an ensemble's alignments are its first model's: attention weights do not average into words
            aligner = getattr(self.model, "members", [self.model])[0]
            for hypothesis, pairs in zip(found, align(aligner, self.tokenizer, sources, texts), strict=True):
                hypothesis.alignment = pairs
        return [found[start : start + count] for start in range(0, len(found), count)]


def translate_lines(translator, lines: list[str], batch_size: int, generate_kwargs: dict, show_progress: bool):
    """Translations of `lines`, in order (the best hypothesis of each, `translate_lines_in_full`)."""
    found = translate_lines_in_full(translator, lines, batch_size, generate_kwargs, show_progress)
    return [hypotheses[0].text for hypotheses in found]


def translate_lines_in_full(
    translator,
    lines: list[str],
    batch_size: int,
    generate_kwargs: dict,
    show_progress: bool,
    steering: Steering | None = None,
) -> list[list[Hypothesis]]:
    """The hypotheses of each of `lines`, in order, as `steering` asks (its per-line parts follow `lines`); a blank
    line gets one empty translation (scored 0: it is certain), and the whitespace around a sentence is not
    translated (as in the pipeline). Every line's prefix and constraints are checked before the first is translated
    (`SteeringError`). Batches hold sentences of similar length. Only strings and numbers are kept, never a batch's
    tensors, so memory grows with the text alone."""
    steering = steering or Steering()
    positions = translator.max_positions
    lines = cut_long_lines(translator.tokenizer, [line.strip() for line in lines], positions)
    todo = [i for i, line in enumerate(lines) if line]
    lengths = token_counts(translator.tokenizer, [lines[i] for i in todo])
    too_long = [index + 1 for index, length in zip(todo, lengths, strict=True) if length > positions]
    if too_long:
        logger.warning(
            "%d line(s) have more tokens than the model's %d positions; only their first %d are translated (line %s%s)",
            len(too_long),
            positions,
            positions,
            too_long[0],
            ", ..." if len(too_long) > 1 else "",
        )
    limits = [translator.length_limit(length, generate_kwargs.get("max_new_tokens")) for length in lengths]
    check_steering(translator.tokenizer, steering, todo, limits)
    order = [todo[j] for j in sorted(range(len(todo)), key=lengths.__getitem__, reverse=True)]
    scores = {"score": 0.0, "log_probability": 0.0, "tokens": [], "token_log_probs": []} if steering.scores else {}
    empty = Hypothesis("", **scores, alignment=[] if steering.alignments else None)
    found = [[empty]] * len(lines)
    with tqdm(total=len(order), disable=not show_progress, unit="sentence", file=sys.stderr) as progress:
        step = batch_size * translator.batches_per_call
        for start in range(0, len(order), step):
            batch = order[start : start + step]
            outputs = translator.hypotheses(
                [lines[i] for i in batch], batch_size, steering.select(batch), **generate_kwargs
            )
            for index, hypotheses in zip(batch, outputs, strict=True):
                for hypothesis in hypotheses:
                    # a translation is one line of output whatever the model writes, or every later line is misplaced
                    hypothesis.text = " ".join(hypothesis.text.splitlines())
                found[index] = hypotheses
            progress.update(len(batch))
    return found


def read_steering_files(
    steering: Steering, lines: list[str], input_name: str, prefix_path: str | None, constraints_path: str | None
) -> Steering:
    """`steering` with each line's prefix (`prefix_path`: a prefix a line) and constraints (`constraints_path`,
    `read_constraints`), refused (`SteeringError`) where a file's line count is not the input's."""
    per_line = {}
    for part, path, read in (
        ("prefixes", prefix_path, read_lines),
        ("constraints", constraints_path, read_constraints),
    ):
        if path is not None:
            per_line[part] = read(path)
            if len(per_line[part]) != len(lines):
                raise SteeringError(f"{path}: {len(per_line[part])} line(s) for the {len(lines)} of {input_name}")
    return dataclasses.replace(steering, names={"prefixes": prefix_path, "constraints": constraints_path}, **per_line)


def check_steering_of(model_path: str, lines: list[str], steering: Steering, max_new_tokens: int | None) -> None:
    """`check_steering` for the folder `model_path` (any kind), from its tokenizer and generation config alone, so
    that a prefix or constraint that cannot be used is refused before the model is loaded."""
    from transformers import GenerationConfig

    model_path = model_folder(model_path)
    tokenizer, generation = load_tokenizer(model_path), GenerationConfig.from_pretrained(model_path)
    todo = [index for index, line in enumerate(lines) if line.strip()]
    lengths = token_counts(tokenizer, [lines[index].strip() for index in todo])
    max_new_tokens_over_source = max_new_tokens_over_source_of(generation)
    limits = [
        length_limit(length, generation.max_length, max_new_tokens_over_source, max_new_tokens) for length in lengths
    ]
    check_steering(tokenizer, steering, todo, limits)


def check_steering(tokenizer, steering: Steering, todo: list[int], limits: list[int]) -> None:
    """Refuses (`SteeringError`, naming the file and line) a prefix or constraint set that does not fit in its
    line's length limit (`limits`, for the lines at `todo`, `</s>` included), and a constraint that is no tokens."""
    for index, limit in zip(todo, limits, strict=True):
        if steering.prefixes is not None and steering.prefixes[index].strip():
            (tokens,) = prefix_token_ids(tokenizer, [steering.prefixes[index]])
            if len(tokens) + 1 > limit:
                raise SteeringError(
                    f"{steering.names.get('prefixes') or 'prefixes'}:{index + 1}: the prefix's {len(tokens)} tokens "
                    f"and </s> do not fit in the line's limit of {limit} tokens"
                )
        if steering.constraints is not None and steering.constraints[index]:
            from hf_vanilla_transformer.tools.constraints import constraint_token_ids

            name = f"{steering.names.get('constraints') or 'constraints'}:{index + 1}"
            try:
                tokens = constraint_token_ids(tokenizer, steering.constraints[index])
            except ValueError as error:
                raise SteeringError(f"{name}: {error}") from None
            needed = sum(map(len, tokens)) + 1
            if needed > limit:
                raise SteeringError(
                    f"{name}: the constraints' {needed - 1} tokens and </s> do not fit in the line's limit of "
                    f"{limit} tokens"
                )


def cut_long_lines(tokenizer, lines: list[str], positions: int) -> list[str]:
    """`lines`, each cut to a start that holds more than `positions` tokens where it is much longer: only a line's
    first `positions` tokens are translated, and tokenizing all of a 10 MB line to find them takes seconds and
    gigabytes. A line is cut only when it has more characters than `positions` times the vocabulary's longest token
    (a token takes at most that many, so a shorter line cannot hold more than `positions` tokens), and at a space,
    so that the words before the cut are tokenized as in the whole line. Where spaces or characters that make no
    token leave the cut short of `positions` tokens, it doubles until it is not."""
    longest = max(map(len, tokenizer.get_vocab()))
    return [cut_long_line(tokenizer, line, positions, positions * longest) for line in lines]


def cut_long_line(tokenizer, line: str, positions: int, characters: int) -> str:
    while characters < len(line):
        cut = line[:characters]
        last_word = None if line[characters].isspace() else re.search(r"\s\S*\Z", cut)
        if last_word is not None:  # the cut splits a word: it goes, whole
            cut = cut[: last_word.start()]
        if len(tokenizer(cut)["input_ids"]) > positions:
            return cut
        characters *= 2
    return line


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
    CPU with bfloat16 units, where generate() ran faster than in float32 at the same test BLEU (BENCHMARKS.md,
    "bfloat16 on a CPU with bf16 units"), and float32 elsewhere (not measured faster at equal BLEU)."""
    if name != "auto":
        return getattr(torch, name)
    on_cpu = default_device(device).startswith("cpu")
    return torch.bfloat16 if on_cpu and cpu_has_bf16_units() else torch.float32
