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

import copy
import functools
import json
import logging
import sys
from collections.abc import Callable

import torch
from tqdm.auto import tqdm
from transformers.generation import LogitsProcessorList

from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.files import write_text_atomically
from hf_vanilla_transformer.hardware import check_device, check_torch_device, cpu_has_bf16_units, default_device
from hf_vanilla_transformer.loading import device_memory, load_model_and_tokenizer, load_tokenizer, model_folder
from hf_vanilla_transformer.model.modeling_vanilla_transformer import max_new_tokens_over_source_of, source_length_limit
from hf_vanilla_transformer.model.pipeline_translation import cut_long_lines, generated_length
from hf_vanilla_transformer.tools.alignment import format_alignment
from hf_vanilla_transformer.tools.avoid import AvoidLogitsProcessor
from hf_vanilla_transformer.tools.ctranslate2_runtime import CTranslate2Translator, ctranslate2_device
from hf_vanilla_transformer.tools.export_ctranslate2 import is_ctranslate2_folder
from hf_vanilla_transformer.tools.prefix import PrefixLogitsProcessor, prefix_token_ids
from hf_vanilla_transformer.tools.scoring import exact_scores_need_same_shapes, forced_decoding, scored_ids
from hf_vanilla_transformer.tools.steering_files import warn_about_blank_lines
from hf_vanilla_transformer.tools.translator import Hypothesis, Steering, SteeringError, Translator, length_limit
from hf_vanilla_transformer.tools.words import TokenWords, encode_phrases, holds

logger = logging.getLogger("vanilla-translate")
OUTPUT_FORMATS = ("plain", "jsonl")
NBEST_SEPARATOR = " ||| "  # between the fields of an n-best line, as fairseq, Moses and Marian write them
# the memory one search may hold (`ModelTranslator.search_bytes`): a batch of sentences with many hypotheses each
# (--n_best 1000) is searched a few sentences at a time
SEARCH_MEMORY = 2**30


def format_translations(
    found: list[list[Hypothesis]], form: str = "plain", n_best: bool = False, first: int = 0
) -> list[str]:
    """The output lines for the hypotheses of each input line. plain: the best translation a line, or with `n_best`
    each hypothesis as `line ||| translation ||| score ||| log-probability` (the input line counted from 0, as in
    Moses' and fairseq's n-best lists; `first`: the number of `found`'s first line); an alignment, where there is
    one, follows as a last `||| i-j ...` field. jsonl: one JSON object an input line, {"translations": [...]}, each
    hypothesis with what it holds, strict JSON (a score that is not a number is an error, never `Infinity`)."""
    if form == "jsonl":
        return [
            json.dumps(
                {"translations": [hypothesis_fields(h) for h in hypotheses]}, ensure_ascii=False, allow_nan=False
            )
            for hypotheses in found
        ]
    lines = []
    for number, hypotheses in enumerate(found, first):
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
    **ctranslate2_options,
) -> Callable[[], "Translator"]:
    """A function that loads the folder's translator: for a CTranslate2 folder (from export_ctranslate2)
    ctranslate2.Translator with `ctranslate2_options` (compute_type, inter_threads, intra_threads; None: the
    default) and `threads` as the default inter_threads, for an ONNX folder (export_onnx) ONNX Runtime with `threads`,
    for any other the model in `dtype` (`translation_dtype`); several model folders decode together as an
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
    return functools.partial(ModelTranslator, paths, device, translation_dtype(dtype, device))


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
    (tools/constraints.py), scores by forced decoding of each translation's tokens (tools/scoring.py, as
    `vanilla-score` computes them), alignments from the encoder-decoder attention of each translation
    (tools/alignment.py), read from an eager copy of the model so that the translation stays the one the model's
    own attention path gives."""

    engine = "generate()"
    features = frozenset({"n_best", "scores", "alignments", "prefixes", "constraints", "avoid"})
    decoding = Translator.decoding | Translator.sampling

    def __init__(self, model_paths: str | list[str], device: str | None, dtype=None):
        model_paths = [model_paths] if isinstance(model_paths, str) else model_paths
        if len(model_paths) > 1:
            from hf_vanilla_transformer.tools.ensemble import load_ensemble

            self.model, self.tokenizer = load_ensemble(model_paths, device, dtype)
        else:
            self.model, self.tokenizer = load_model_and_tokenizer(model_paths[0], device, dtype)
        self.model_paths = model_paths
        self.max_positions = self.model.config.max_position_embeddings
        self.generation_config = self.model.generation_config
        self.max_new_tokens_over_source = max_new_tokens_over_source_of(self.generation_config)
        self.num_beams = self.generation_config.num_beams or 1
        self.length_penalty = self.generation_config.length_penalty
        self.avoiding: dict[tuple, AvoidLogitsProcessor] = {}  # built once per list: it reads the whole vocabulary

    @functools.cached_property
    def token_words(self) -> TokenWords:
        """`Translator.token_words` over the model's vocabulary, which may hold more ids than the tokenizer."""
        return TokenWords.of(self.tokenizer, self.model.config.vocab_size)

    @functools.cached_property
    def aligner(self):
        """The model on the eager attention path, which alone returns attention weights: a copy, so that the
        translations keep the model's own path (an ensemble's: its first member's, since attention weights do not
        average into words)."""
        first = self.model.members[0] if len(self.model_paths) > 1 else self.model
        eager = copy.deepcopy(first)
        eager.set_attn_implementation("eager")
        return eager

    def avoid_processors(self, steering: Steering) -> LogitsProcessorList:
        """The processor that bars `steering.avoid`, if it has phrases."""
        if not steering.avoid:
            return LogitsProcessorList()
        key = (tuple(steering.avoid), steering.constraint_match)
        if key not in self.avoiding:
            self.avoiding[key] = AvoidLogitsProcessor(
                self.tokenizer, steering.avoid, steering.constraint_match, self.token_words
            )
        return LogitsProcessorList([self.avoiding[key]])

    def search_bytes(self, sentences: int, source_length: int, rows_per_sentence: int) -> int:
        """About the memory a search of `sentences` sources of `source_length` tokens holds at once, with
        `rows_per_sentence` hypotheses each: every row's decoder cache (keys and values of each layer, for the
        translation's longest length and the source) and a step's logits over the vocabulary, which the search
        copies a few times in float32 (log-probabilities, the processors' scores, the ranking)."""
        config, members = self.model.config, len(self.model_paths)
        length = self.length_limit(source_length)
        element = torch.finfo(self.model.dtype).bits // 8
        cache = 2 * config.decoder_layers * (length + source_length) * config.d_model * element
        logits = 4 * 6 * config.vocab_size
        return sentences * rows_per_sentence * members * (cache + logits)

    def sentences_per_call(self, lengths: list[int], steering: Steering, generate_kwargs: dict) -> int:
        """How many of sentences of these token `lengths` (longest first) one search may take within
        `SEARCH_MEMORY`: as many as fit, one at least. A search of even one that needs more memory than the device
        has is refused, naming what it needs."""
        rows = max(steering.n_best, generate_kwargs.get("num_beams", self.num_beams))
        if steering.constraints is not None and any(steering.constraints):  # searched again on a wider beam
            from hf_vanilla_transformer.tools.constraints import constrained_beams

            rows = max(rows, constrained_beams(rows, 0))
        one = self.search_bytes(1, lengths[0], rows)
        available = device_memory(self.model.device)
        if available is not None and one > available:
            raise ValueError(
                f"translating a sentence of {lengths[0]} tokens with {rows} hypotheses (--n_best, --num_beams) needs "
                f"about {one / 2**30:,.1f} GiB, more than this device's {available / 2**30:,.1f} GiB"
            )
        return max(1, SEARCH_MEMORY // one)

    def hypotheses(self, sentences: list[str], batch_size: int, steering: Steering, **generate_kwargs):
        batch = self.tokenizer(
            sentences, truncation=True, max_length=self.max_positions, padding=True, return_tensors="pt"
        ).to(self.model.device)
        lengths = sorted(batch["attention_mask"].sum(-1).tolist(), reverse=True)
        per_call = self.sentences_per_call(lengths, steering, generate_kwargs)
        if per_call < len(sentences):  # many hypotheses a sentence: fewer sentences a search
            return [
                found
                for start in range(0, len(sentences), per_call)
                for found in self.hypotheses(
                    sentences[start : start + per_call],
                    batch_size,
                    steering.select(list(range(start, min(start + per_call, len(sentences))))),
                    **generate_kwargs,
                )
            ]
        count = steering.n_best
        sequences, found = self.search(batch, steering, generate_kwargs)
        eos = self.generation_config.eos_token_id
        ends = torch.tensor([eos] if isinstance(eos, int) else eos)
        kept = [
            (index // count, row[: generated_length(row, ends)].tolist())
            for index, (row, is_found) in enumerate(zip(sequences[:, 1:].cpu(), found, strict=True))
            if is_found
        ]
        texts = self.tokenizer.batch_decode([tokens for _, tokens in kept], skip_special_tokens=True)
        found_hypotheses = [Hypothesis(text) for text in texts]
        if steering.scores:
            rows = zip(batch["input_ids"].cpu(), batch["attention_mask"].cpu(), strict=True)
            sources = [ids[mask.bool()].tolist() for ids, mask in rows]
            pairs = [(sources[sentence], tokens) for sentence, tokens in kept]
            forced = functools.partial(forced_decoding, self.model)
            length_penalty = generate_kwargs.get("length_penalty", self.length_penalty)
            same_shapes = exact_scores_need_same_shapes(self.model)
            vocab_size = self.model.config.vocab_size
            scores = scored_ids(pairs, batch_size * count, forced, length_penalty, vocab_size, same_shapes)
            found_hypotheses = [
                hypothesis.scored(score, self.tokenizer.convert_ids_to_tokens(score.token_ids))
                for hypothesis, score in zip(found_hypotheses, scores, strict=True)
            ]
        if steering.alignments:
            from hf_vanilla_transformer.tools.alignment import align

            # a line longer than the positions is aligned as it was translated: from its first tokens
            shown = [self.within_positions(sentences[sentence]) for sentence, _ in kept]
            for hypothesis, pairs in zip(
                found_hypotheses, align(self.aligner, self.tokenizer, shown, texts), strict=True
            ):
                hypothesis.alignment = pairs
        results = [[] for _ in sentences]
        for (sentence, _), hypothesis in zip(kept, found_hypotheses, strict=True):
            results[sentence].append(hypothesis)
        for sentence, hypotheses in enumerate(results):
            if not hypotheses:  # the phrases to avoid barred every way to the terms: an empty line keeps the order
                logger.warning(
                    "no translation of %r meets its constraints and avoids the phrases to avoid",
                    sentences[sentence][:80],
                )
                hypotheses.append(steering.blank_line_hypothesis())
        if steering.scores:  # best first by the score given: sampled hypotheses come in no order
            results = [sorted(hypotheses, key=lambda h: -h.score) for hypotheses in results]
        return results

    def search(self, batch, steering: Steering, generate_kwargs: dict) -> tuple[torch.LongTensor, list[bool]]:
        """`steering.n_best` rows a sentence of `batch` (each `decoder_start_token_id`, the tokens, `</s>`, padding),
        and whether each holds a hypothesis: constrained beam search may find fewer that meet the constraints."""
        count = steering.n_best
        if steering.constraints is not None and any(steering.constraints):
            from hf_vanilla_transformer.tools.constraints import constrained_beam_search

            constraints = [
                encode_phrases(self.tokenizer, phrases, steering.constraint_match, self.token_words)
                for phrases in steering.constraints
            ]
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
                self.token_words,
                num_return_sequences=count,
                logits_processor=self.avoid_processors(steering),
                **settings,
            )
            return output.sequences, output.found.tolist()
        if "max_new_tokens" in generate_kwargs:  # --max_new_tokens replaces the model's max_length, which transformers
            generate_kwargs = {**generate_kwargs, "max_length": None}  # would warn about at every batch, then ignore
        processors = LogitsProcessorList()
        if steering.prefixes is not None:
            processors.append(PrefixLogitsProcessor(prefix_token_ids(self.tokenizer, steering.prefixes)))
        # Section 6.1's limit before the phrases to avoid, so that a row the limit ends is not also barred `</s>`:
        # given here, our model's generate() adds it no more, and an ensemble's (transformers') never does
        limit = source_length_limit(self.model, batch["input_ids"], None, dict(batch))
        processors.extend([] if limit is None else [limit])
        processors.extend(self.avoid_processors(steering))
        limited = {} if len(self.model_paths) > 1 else {"max_new_tokens_over_source": None}
        sequences = self.model.generate(
            **batch, logits_processor=processors, num_return_sequences=count, **limited, **generate_kwargs
        )
        return sequences, [True] * len(sequences)

    def within_positions(self, sentence: str) -> str:
        """The start of `sentence` that its tokens within the model's positions hold (the sentence itself where it
        fits): what is translated of it."""
        offsets = self.tokenizer(sentence, truncation=True, max_length=self.max_positions, return_offsets_mapping=True)
        ends = [end for start, end in offsets["offset_mapping"] if end > start]
        return sentence[: ends[-1]] if ends and len(offsets["input_ids"]) >= self.max_positions else sentence


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
    words = translator.token_words if steering.constraints is not None else None
    check_steering(translator.tokenizer, steering, todo, limits, words)
    warn_about_blank_lines(steering, lines)
    order = [todo[j] for j in sorted(range(len(todo)), key=lengths.__getitem__, reverse=True)]
    found = [[steering.blank_line_hypothesis()] for _ in lines]
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


def check_steering(
    tokenizer, steering: Steering, todo: list[int], limits: list[int], words: TokenWords | None = None
) -> None:
    """Refuses (`SteeringError`, naming the file and line) a prefix or constraint set that does not fit in its
    line's length limit (`limits`, for the lines at `todo`, `</s>` included), a constraint that is no tokens, and a
    prefix or constraint that holds a phrase to avoid: no translation could have both. `words`: the tokenizer's
    `TokenWords`, where the caller has them."""
    if steering.constraints is not None and words is None:
        words = TokenWords.of(tokenizer)
    for index, limit in zip(todo, limits, strict=True):
        line = steering.first_line + index
        for part in ("prefixes", "constraints"):
            given = getattr(steering, part)
            texts = [] if given is None else [given[index]] if part == "prefixes" else given[index]
            for text in texts:
                avoided = next(
                    (a for a in steering.avoid or [] if holds(text, a.strip(), steering.constraint_match)), None
                )
                if avoided is not None:
                    raise SteeringError(
                        f"{steering.names.get(part) or part}:{line}: {text!r} holds {avoided!r}, which "
                        f"{steering.names.get('avoid') or 'avoid'} bars"
                    )
        if steering.prefixes is not None and steering.prefixes[index].strip():
            (tokens,) = prefix_token_ids(tokenizer, [steering.prefixes[index]])
            if len(tokens) + 1 > limit:
                raise SteeringError(
                    f"{steering.names.get('prefixes') or 'prefixes'}:{line}: the prefix's {len(tokens)} tokens "
                    f"and </s> do not fit in the line's limit of {limit} tokens"
                )
        if steering.constraints is not None and steering.constraints[index]:
            name = f"{steering.names.get('constraints') or 'constraints'}:{line}"
            try:
                phrases = encode_phrases(tokenizer, steering.constraints[index], steering.constraint_match, words)
            except ValueError as error:
                raise SteeringError(f"{name}: {error}") from None
            needed = sum(phrase.shortest for phrase in phrases) + 1
            if needed > limit:
                raise SteeringError(
                    f"{name}: the constraints' {needed - 1} tokens and </s> do not fit in the line's limit of "
                    f"{limit} tokens"
                )


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
