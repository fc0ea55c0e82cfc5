"""Translating many sentences with a trained model, one a line: what `vanilla-translate` (cli/translate.py) runs.

Input and output are UTF-8, files and standard streams alike. Lines are sorted by length into batches, so that
little padding is computed, and written back in input order; an empty line stays an empty line. Decoding is the
model's own (for ours the paper's: beam 4, length penalty 0.6, at most source length + 50 tokens) unless
--num_beams, --length_penalty or --max_new_tokens say otherwise. A folder written by `vanilla-export-ctranslate2` is
translated with CTranslate2 (the [fast] extra), with the same decoding: many times faster on a CPU; one written by
`vanilla-export-onnx` greedily with ONNX Runtime; several model folders together as an ensemble. What is asked
beyond the decoding settings (n-best lists and scores, prefixes, constraints, alignments) is a `Steering`
(decoding/request.py), which each kind of translator gives as far as its engine can and refuses beyond.
"""

import logging
import sys

import torch
from tqdm.auto import tqdm

from hf_vanilla_transformer.decoding.prefix import prefix_token_ids
from hf_vanilla_transformer.decoding.request import Hypothesis, Steering, SteeringError
from hf_vanilla_transformer.decoding.words import TokenWords, encode_phrases, holds
from hf_vanilla_transformer.loading import load_tokenizer, max_positions, model_folder
from hf_vanilla_transformer.model.modeling_vanilla_transformer import length_limits, max_new_tokens_over_source_of
from hf_vanilla_transformer.model.pipeline_translation import cut_long_lines
from hf_vanilla_transformer.translation.steering_files import warn_about_blank_lines

logger = logging.getLogger("vanilla-translate")


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
    limits = translator.length_limits(lengths, generate_kwargs.get("max_new_tokens"))
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
    lengths = torch.tensor(token_counts(tokenizer, [lines[index].strip() for index in todo]), dtype=torch.long)
    over_source = max_new_tokens_over_source_of(generation)
    limits = length_limits(lengths, max_positions(generation, model_path), over_source, max_new_tokens).tolist()
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
