"""The model's score of given translations: forced decoding, as fairseq's `--score-reference`, marian-scorer and
CTranslate2's `score_batch` compute it, for filtering a corpus, reranking n-best lists or quality estimation. Our
model's engine scores with it (`Translator.score`, which `vanilla-score` runs).

Each target is tokenized as training tokenizes labels (`tokenizer(text_target=...)`, which appends `</s>`) and
scored token by token under teacher forcing: log P(y_t | y_<t, x), the model's log-softmax computed in float32. The
sum is log P(y | x), and the score what transformers' beam search ranks by, log P(y | x) / |y|^length_penalty:
the same numbers `sequence_scores` (model/pipeline_translation.py) gives for a translation `generate()` produced.
Pairs are scored in batches of similar length and returned in input order (`scored_pairs`, which the CTranslate2
engine also uses, with its `score_batch` in place of the forward pass).
"""

import functools
from collections.abc import Callable

import torch

from hf_vanilla_transformer.model.pipeline_translation import SequenceScore, cut_long_lines, scored

# a chunk of pairs, each (source ids, target ids), to the scored target tokens and their log-probabilities
ChunkScorer = Callable[[list[tuple[list[int], list[int]]]], list[tuple[list[int], list[float]]]]


def score_translations(
    model,
    tokenizer,
    sources: list[str],
    targets: list[str],
    batch_size: int = 32,
    length_penalty: float | None = None,
    names: tuple[str, str] = ("sources", "targets"),
) -> list[SequenceScore]:
    """The model's score of each target as the translation of the source on the same position (`SequenceScore`;
    `length_penalty`, default the model's generation config's, makes its `score`). No gradient is computed; the
    model must be in eval mode (dropout would make the scores random). A pair with an empty side, or a side longer
    than the model's positions, is a ValueError naming its line as `names` (of sources, targets) say."""
    if model.training:
        raise ValueError("the model is in training mode, where dropout makes scores random: call model.eval() first")
    if length_penalty is None:
        length_penalty = model.generation_config.length_penalty
    positions = model.config.max_position_embeddings
    forced = functools.partial(forced_decoding, model)
    vocab_size = model.config.vocab_size
    same_shapes = exact_scores_need_same_shapes(model)
    return scored_pairs(
        tokenizer, sources, targets, positions, batch_size, forced, length_penalty, names, vocab_size, same_shapes
    )


def exact_scores_need_same_shapes(model) -> bool:
    """Whether a pair scores the same in any batch only among pairs of its own shape: in a precision below float32
    padding changes a pair's figures (the kernels round differently; no figure changed among pairs of one shape, in
    bfloat16 on the CPUs here), and a pair must score the same in `vanilla-translate`'s n-best lists and in
    `vanilla-score`, whatever else is scored with it."""
    return model.dtype != torch.float32


def check_pairs(
    sources: list[str],
    targets: list[str] | list[list[int]],
    source_name: str = "sources",
    target_name: str = "targets",
) -> None:
    """Refuse sources and targets that do not pair up line by line, or a pair with an empty (blank) side: there is
    no sentence to score. Errors name the lines by `source_name` and `target_name` (a command: the files)."""
    if len(sources) != len(targets):
        raise ValueError(
            f"{source_name} has {len(sources)} lines and {target_name} has {len(targets)}: each target is the "
            "translation of the source on the same line"
        )
    for name, lines in ((source_name, sources), (target_name, targets)):
        blank = next((number for number, line in enumerate(lines, 1) if not is_given(line)), None)
        if blank is not None:
            raise ValueError(f"{name}:{blank}: an empty line; each pair to score needs a sentence on both sides")


def is_given(target: str | list[int]) -> bool:
    """Whether a sentence (text, or token ids) holds anything to score."""
    return bool(target.strip()) if isinstance(target, str) else bool(target)


def scored_pairs(
    tokenizer,
    sources: list[str],
    targets: list[str] | list[list[int]],
    max_positions: int,
    chunk_size: int,
    score_chunk: ChunkScorer,
    length_penalty: float | None,
    names: tuple[str, str],
    vocab_size: int = 0,
    same_shapes: bool = False,
) -> list[SequenceScore]:
    """Each pair tokenized (`checked_ids`), checked, scored by `score_chunk` a chunk at a time, longest pairs
    first so that a chunk holds little padding, and returned in input order."""
    check_pairs(sources, targets, *names)
    source_ids = checked_ids(tokenizer, sources, max_positions, names[0])
    target_ids = checked_ids(tokenizer, targets, max_positions, names[1], target=True)
    pairs = list(zip(source_ids, target_ids, strict=True))
    return scored_ids(pairs, chunk_size, score_chunk, length_penalty, vocab_size, same_shapes)


def checked_ids(
    tokenizer, lines: list[str] | list[list[int]], max_positions: int, name: str, target: bool = False
) -> list[list[int]]:
    """Each line's token ids: a sentence tokenized without the whitespace around it, as the pipeline translates it
    (`target`: as training tokenizes labels), ids given taken as they are. A line of more tokens than
    `max_positions` is a ValueError naming it as `name` says; one much longer is tokenized only from a start that
    already holds more (`cut_long_lines`), since all of a 10 MB line takes seconds and gigabytes to tokenize."""
    if lines and not isinstance(lines[0], str):
        texts = cut = ids = lines
    else:
        texts = [line.strip() for line in lines]
        cut = cut_long_lines(tokenizer, texts, max_positions, target)
        ids = (tokenizer(text_target=cut) if target else tokenizer(cut))["input_ids"]
    for number, row in enumerate(ids, 1):
        if len(row) > max_positions:
            start = cut[number - 1]
            within = "" if len(start) == len(texts[number - 1]) else f" in its first {len(start):,} characters"
            raise ValueError(
                f"{name}:{number}: {len(row)} tokens{within}, more than the model's {max_positions} positions"
            )
    return ids


# the most logits a chunk of forced decoding computes at once (pairs x target tokens x vocabulary), so that an n-best
# list of a thousand hypotheses is scored in pieces
LOGITS_PER_CHUNK = 2**25


def scored_ids(
    pairs: list[tuple[list[int], list[int]]],
    chunk_size: int,
    score_chunk: ChunkScorer,
    length_penalty: float | None,
    vocab_size: int = 0,
    same_shapes: bool = False,
) -> list[SequenceScore]:
    """Each (source ids, target ids) pair scored by `score_chunk` a chunk at a time (at most `chunk_size` pairs, and
    as many as `LOGITS_PER_CHUNK` logits over `vocab_size` tokens allow), longest pairs first so that a chunk holds
    little padding, and returned in input order. With `same_shapes` a chunk holds pairs of one source length and
    one target length only, so none is padded (`exact_scores_need_same_shapes`)."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]) + len(pairs[i][1]), len(pairs[i][0])))[::-1]
    results: list[SequenceScore | None] = [None] * len(pairs)
    start = 0
    while start < len(order):
        first = pairs[order[start]]  # the chunk's longest pair
        size = max(1, min(chunk_size, LOGITS_PER_CHUNK // max(1, len(first[1]) * vocab_size)))
        chunk = order[start : start + size]
        if same_shapes:
            chunk = [i for i in chunk if (len(pairs[i][0]), len(pairs[i][1])) == (len(first[0]), len(first[1]))]
        outputs = score_chunk([pairs[i] for i in chunk])
        for index, (tokens, log_probs) in zip(chunk, outputs, strict=True):
            results[index] = scored(tokens, log_probs, length_penalty)
        start += len(chunk)
    return results


def padded(rows: list[list[int]], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows right-padded with `value` into one tensor, and the mask of their real positions."""
    lengths = torch.tensor([len(row) for row in rows])
    width = int(lengths.max())
    ids = torch.tensor([row + [value] * (width - len(row)) for row in rows])
    return ids, torch.arange(width)[None, :] < lengths[:, None]


def forced_decoding(model, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[float]]]:
    """Each target's tokens and their log-probabilities under teacher forcing, in one padded batch: the decoder
    reads the target shifted right behind `<s>`, as in training (`prepare_decoder_input_ids_from_labels`), and the
    log-softmax is taken in float32, as the training loss takes it."""
    input_ids, attention_mask = padded([source for source, _ in pairs], model.config.pad_token_id)
    labels, target_mask = padded([target for _, target in pairs], -100)  # -100: no token, as in training's labels
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=labels)
    with torch.no_grad():
        logits = model(
            input_ids=input_ids.to(model.device),
            attention_mask=attention_mask.long().to(model.device),
            decoder_input_ids=decoder_input_ids.to(model.device),
        ).logits
        log_probs = logits.float().log_softmax(-1)
        token_log_probs = log_probs.gather(-1, labels.clamp(min=0).to(model.device)[..., None])[..., 0].cpu()
    return [
        (target, row[mask].tolist()) for (_, target), row, mask in zip(pairs, token_log_probs, target_mask, strict=True)
    ]
