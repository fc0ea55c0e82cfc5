"""Word alignments between a source sentence and its translation, read from the model's encoder-decoder attention.

The decoder's encoder-decoder attention (Section 3.2.3) weighs the source tokens at every target position; where it
weighs most is a word alignment (as Bahdanau et al., 2015, draw it; Garg et al., 2019, "Jointly Learning to Align
and Translate with Transformer Models", read it so from a Transformer's layers). `align` runs the model once per
batch on the sentence pairs, with the target read by teacher forcing (as in training: the target may be the model's
own translation or any other), takes the attention of one decoder layer, averaged over the chosen heads, and turns
it from tokens into words:

- words are the whitespace-separated tokens of each line (as `line.split()` makes them), the units fast_align,
  eflomal and Marian align; a subword token belongs to the word of its first non-whitespace character (from the
  fast tokenizer's character offsets); special tokens (`</s>`) and tokens of whitespace alone belong to none;
- a source word's attention is the sum over its tokens (the attention is a distribution over source tokens: the
  sum is the share the word gets), a target word's the mean over its tokens' rows;
- `method="target"`: each target word is aligned to the source word it attends to most: every target word is
  aligned exactly once (none when the source has no words), a source word any number of times. The attention
  also gives the other direction, each source word's most attending target word; `"intersection"` keeps the links
  both directions make, `"grow-diag-final-and"` symmetrizes the two as Koehn et al. (2003) do the two directions
  of a statistical aligner (as fast_align's `atools -c grow-diag-final-and`).

Which decoder position gives the attention for a target token: the one that predicts it (`"predicting"`, whose
input is the token before), or the one that takes it as input (`"reading"`, Chen et al., 2020, "Accurate Word
Alignment Induction from Neural Machine Translation", Shift-Att). The defaults (layer, heads, position, method)
are the setting that agrees best with eflomal on Multi30k validation for the trained small model (3 decoder layers):
the last layer, the mean of its heads, the predicting positions, grow-diag-final-and (bench/quality/bench_alignments.py,
bench/results/alignments/). Another model may align best with another layer: the benchmark tells.

Alignments are written `i-j` (source word i, target word j, counted from 0), space-separated, as fast_align,
eflomal and Marian write them.

Attention weights come from the eager attention path only (PyTorch's fused `sdpa` kernel does not return them): for
a model on another path, `align` runs an eager copy of it and says so with a warning (load the model with
`attn_implementation="eager"` to spare the copy). The caller's model is left as it was.
"""

import copy
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from hf_vanilla_transformer.errors import transformers_lines_left_out

TargetPosition = Literal["predicting", "reading"]
TARGET_POSITIONS = ("predicting", "reading")
Method = Literal["target", "intersection", "grow-diag-final-and"]
METHODS = ("target", "intersection", "grow-diag-final-and")
# the setting bench/quality/bench_alignments.py chose on Multi30k validation for the 3-layer small model: its last
# layer, the mean of its heads, at the positions that predict the target words, both directions grown (the docstring)
DEFAULT_LAYER = -1
DEFAULT_HEADS = None
DEFAULT_TARGET_POSITION: TargetPosition = "predicting"
DEFAULT_METHOD: Method = "grow-diag-final-and"
WORD = re.compile(r"\S+")  # `str.split()`'s words: runs of non-whitespace
NEIGHBOURS = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]  # grow-diag's, diagonals too


@dataclass
class WordAttention:
    """The encoder-decoder attention of one sentence pair between words, for every layer and head: tensors of shape
    (layers, heads, target words, source words), read at the decoder positions that predict each target word's
    tokens (`predicting`) and at those that take them as input (`reading`)."""

    predicting: torch.Tensor
    reading: torch.Tensor

    def of(self, layer: int, heads: int | Sequence[int] | None, position: TargetPosition) -> torch.Tensor:
        """(target words, source words): one layer's attention, averaged over `heads` (None: all)."""
        weights = getattr(self, position)[layer]
        if heads is not None:
            weights = weights[[heads] if isinstance(heads, int) else list(heads)]
        return weights.mean(0)


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    """`[(0, 0), (1, 2)]` -> `"0-0 1-2"`, the format of fast_align, eflomal and Marian."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def parse_alignment(text: str) -> list[tuple[int, int]]:
    """`"0-0 1-2"` -> `[(0, 0), (1, 2)]`; a ValueError names a pair that is not `i-j` with i, j >= 0."""
    pairs = []
    for pair in text.split():
        i, dash, j = pair.partition("-")
        if not (dash and i.isdigit() and j.isdigit()):
            raise ValueError(f"alignment pair {pair!r} is not i-j with whole numbers i, j >= 0")
        pairs.append((int(i), int(j)))
    return pairs


def token_words(text: str, offsets: Sequence[tuple[int, int]]) -> list[int | None]:
    """For each token (its character span in `text`), the index of the word of `text.split()` it belongs to: the
    word of its first non-whitespace character; None for special tokens (empty spans) and whitespace alone."""
    word_of_character: list[int | None] = [None] * len(text)
    for index, match in enumerate(WORD.finditer(text)):
        word_of_character[match.start() : match.end()] = [index] * (match.end() - match.start())
    return [
        next((word_of_character[c] for c in range(start, end) if word_of_character[c] is not None), None)
        for start, end in offsets
    ]


def pooling(words: Sequence[int | None], word_count: int, mean: bool) -> torch.Tensor:
    """(words, tokens): each word's row sums its tokens (`mean`: averages them); tokens of no word weigh 0."""
    matrix = torch.zeros(word_count, len(words))
    for token, word in enumerate(words):
        if word is not None:
            matrix[word, token] = 1.0
    if mean:
        matrix /= matrix.sum(1, keepdim=True).clamp(min=1.0)
    return matrix


def word_attention(
    weights: torch.Tensor, source_words: list[int | None], target_words: list[int | None], counts: tuple[int, int]
) -> WordAttention:
    """Token attention (layers, heads, target tokens, source tokens) of one pair -> `WordAttention`: a source word
    sums its tokens' columns, a target word averages its tokens' rows, at the positions that predict them or (one
    later) that read them."""
    source_count, target_count = counts
    source = pooling(source_words, source_count, mean=False).T
    # position t + 1 takes target token t as input; position 0 reads `<s>`
    read_words = [None, *target_words[:-1]]
    return WordAttention(
        predicting=pooling(target_words, target_count, mean=True) @ weights @ source,
        reading=pooling(read_words, target_count, mean=True) @ weights @ source,
    )


def grow_diag_final_and(forward: set[tuple[int, int]], reverse: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Koehn et al. (2003)'s symmetrization of two directions' (source, target) links, as Moses and fast_align's
    atools run it: start from the intersection; while any is added, add each link of the union next to (diagonals
    included) an aligned link that aligns a word not yet aligned; then each link of either direction whose two
    words are both still unaligned."""
    alignment = forward & reverse
    union = forward | reverse
    sources, targets = {i for i, _ in alignment}, {j for _, j in alignment}

    def add(link: tuple[int, int]) -> None:
        alignment.add(link)
        sources.add(link[0])
        targets.add(link[1])

    added = True
    while added:
        added = False
        for i, j in sorted(alignment):
            for link in ((i + di, j + dj) for di, dj in NEIGHBOURS):
                if link in union and link not in alignment and (link[0] not in sources or link[1] not in targets):
                    add(link)
                    added = True
    for direction in (forward, reverse):
        for i, j in sorted(direction):
            if i not in sources and j not in targets:
                add((i, j))
    return alignment


def most_attended(attention: torch.Tensor, method: Method = DEFAULT_METHOD) -> list[tuple[int, int]]:
    """Sorted (source word i, target word j) links from the (target words, source words) `attention`: each target
    word with the source word it attends to most (`"target"`), or that direction combined with each source word's
    most attending target word (`"intersection"`, `"grow-diag-final-and"`); none when either side has no words."""
    if attention.numel() == 0:
        return []
    each_target = {(int(i), j) for j, i in enumerate(attention.argmax(1).tolist())}
    if method == "target":
        return sorted(each_target)
    each_source = {(i, int(j)) for i, j in enumerate(attention.argmax(0).tolist())}
    if method == "intersection":
        return sorted(each_target & each_source)
    return sorted(grow_diag_final_and(each_target, each_source))


def check_setting(model, layer: int, heads: int | Sequence[int] | None, position: str, method: str) -> None:
    """Refuse a layer or head the model does not have, and an unknown target position or method."""
    layers, head_count = model.config.decoder_layers, model.config.decoder_attention_heads
    if not -layers <= layer < layers:
        raise ValueError(f"layer {layer}: the decoder has {layers} layers (0 to {layers - 1}, or -1 for the last)")
    chosen = [] if heads is None else [heads] if isinstance(heads, int) else list(heads)
    if heads is not None and not chosen:
        raise ValueError("heads: give at least one head, or None for all")
    for head in chosen:
        if not 0 <= head < head_count:
            raise ValueError(f"head {head}: the decoder's layers have {head_count} heads (0 to {head_count - 1})")
    if position not in TARGET_POSITIONS:
        raise ValueError(f"position {position!r} must be one of {', '.join(TARGET_POSITIONS)}")
    if method not in METHODS:
        raise ValueError(f"method {method!r} must be one of {', '.join(METHODS)}")


def encode_lines(tokenizer, lines: list[str], side: str, first: int, limit: int) -> tuple[dict, list[str]]:
    """The lines without surrounding whitespace (as vanilla-translate reads them), tokenized with character offsets
    and padded on the right (so that no position moves); a line longer than `limit` tokens is refused, named by
    `side` and its index."""
    texts = [line.strip() for line in lines]
    key = "text_target" if side == "targets" else "text"
    encoded = tokenizer(
        **{key: texts}, padding=True, padding_side="right", return_offsets_mapping=True, return_tensors="pt"
    )
    lengths = encoded["attention_mask"].sum(1).tolist()
    for index, length in enumerate(lengths):
        if length > limit:
            raise ValueError(f"{side}[{first + index}]: {length} tokens, more than the model's {limit} positions")
    return encoded, texts


def batch_word_attentions(model, tokenizer, sources: list[str], targets: list[str], first: int) -> list[WordAttention]:
    """`WordAttention` of each pair of one batch, from one teacher-forced forward pass of `model` (on the eager
    attention path); `first`, the batch's first index, names a refused line."""
    limit = model.config.max_position_embeddings
    source, source_texts = encode_lines(tokenizer, sources, "sources", first, limit)
    target, target_texts = encode_lines(tokenizer, targets, "targets", first, limit)
    with torch.no_grad():
        # right padding and the causal mask keep a target's positions from seeing its padding: no decoder mask
        outputs = model(
            input_ids=source["input_ids"].to(model.device),
            attention_mask=source["attention_mask"].to(model.device),
            decoder_input_ids=model.prepare_decoder_input_ids_from_labels(target["input_ids"].to(model.device)),
            output_attentions=True,
        )
    weights = torch.stack(outputs.cross_attentions, 1).float().cpu()  # (batch, layers, heads, target, source)
    return [
        word_attention(
            weights[index],
            token_words(source_text, source["offset_mapping"][index].tolist()),
            token_words(target_text, target["offset_mapping"][index].tolist()),
            (len(source_text.split()), len(target_text.split())),
        )
        for index, (source_text, target_text) in enumerate(zip(source_texts, target_texts, strict=True))
    ]


def word_attentions(
    model, tokenizer, sources: list[str], targets: list[str], batch_size: int = 32
) -> Iterator[WordAttention]:
    """The `WordAttention` of each (source, target) pair, in order, `batch_size` pairs per forward pass. The
    arguments are checked at the call, the pairs computed as they are read."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets: give one target per source")
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} must be at least 1")
    if model.training:
        raise ValueError("the model is in training mode, whose dropout changes the attention: call model.eval()")
    if not tokenizer.is_fast:
        raise ValueError("alignment needs a fast tokenizer (its character offsets map tokens to words)")
    if sources:  # an eager copy at most once per call
        model = on_the_eager_path(model, dict(tokenizer(sources[0].strip(), return_tensors="pt").to(model.device)))
    return (
        attention
        for first in range(0, len(sources), batch_size)
        for attention in batch_word_attentions(
            model, tokenizer, sources[first : first + batch_size], targets[first : first + batch_size], first
        )
    )


def align(
    model,
    tokenizer,
    sources: list[str],
    targets: list[str],
    layer: int = DEFAULT_LAYER,
    heads: int | Sequence[int] | None = DEFAULT_HEADS,
    position: TargetPosition = DEFAULT_TARGET_POSITION,
    method: Method = DEFAULT_METHOD,
    batch_size: int = 32,
) -> list[list[tuple[int, int]]]:
    """Word alignments of each (source, target) pair: sorted (source word, target word) pairs, read by `method`
    from the encoder-decoder attention of decoder `layer` (from 0; negative from the last), averaged over `heads`
    (one index, several, or None for all), at `position` (see the module's docstring). `format_alignment` writes
    them as `i-j` text."""
    check_setting(model, layer, heads, position, method)
    return [
        most_attended(attention.of(layer, heads, position), method)
        for attention in word_attentions(model, tokenizer, sources, targets, batch_size)
    ]


def on_the_eager_path(model, encoded: dict[str, torch.Tensor]):
    """`model` if it runs on the eager attention path, else an eager copy of it, with a warning. transformers has no
    public way to read a model's attention implementation (`config._attn_implementation` is private); whether the
    encoder returns attention weights for `encoded` tells. On another path transformers logs that it returns none, which
    is what the question asks: that line is left out, and the warning here says what happens instead."""
    no_weights = "does not support `output_attentions=True`"
    with torch.no_grad(), transformers_lines_left_out("transformers.integrations.sdpa_attention", no_weights):
        weights = model.get_encoder()(**encoded, output_attentions=True).attentions
    if weights and all(layer is not None for layer in weights):
        return model
    warnings.warn(
        "attention weights need the eager attention path, which the model is not on: this call runs an eager copy of "
        "it (model.set_attn_implementation('eager') spares the copy)",
        stacklevel=3,
    )
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    return eager
