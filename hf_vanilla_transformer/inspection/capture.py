"""Looking inside a trained model: its three attentions (Section 3.2.3) and its decoding, one step at a time.

The paper's model attends in three ways: the encoder's self-attention, the decoder's masked self-attention and the
encoder-decoder attention (Figure 1). `attention_maps` returns all three, for every layer and head, for the
translation the model produces or for a given target read with teacher forcing (as in training).
`decoding_steps` replays `generate()` (greedy or Section 6.1's beam search) and tells, at each step, the
hypotheses kept, each linked to the one it extends, the alternatives with their probabilities and where the
encoder-decoder attention looked (last layer, mean over heads: `winning_path` gives the translation's rows);
`teacher_forced_steps` tells the same of a given target, with the probability the model gave each of its tokens.

Attention weights come from the eager attention path only (PyTorch's fused `sdpa` kernel does not return them): for
a model on another path, both functions run an eager copy of it and say so with a warning (load the model with
`attn_implementation="eager"`, or call `model.set_attn_implementation("eager")`, to spare the copy).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessor
from transformers.convert_slow_tokenizer import bytes_to_unicode

from hf_vanilla_transformer.decoding.alignment import on_the_eager_path

# Figure 1's three attentions: weights of shape (layers, heads, queries, keys) under these names
ATTENTION_KINDS = {
    "encoder_self_attention": "encoder self-attention",
    "decoder_self_attention": "decoder masked self-attention",
    "encoder_decoder_attention": "encoder-decoder attention",
}
_BYTE_OF_CHARACTER = {character: byte for byte, character in bytes_to_unicode().items()}


@dataclass
class AttentionMaps:
    """The attention weights of one sentence pair, with readable tokens for the axes.

    Queries and keys: the encoder's self-attention relates `source_tokens` to themselves; the decoder's position i
    predicts `target_tokens[i]` from `decoder_input_tokens[: i + 1]` (`<s>` then the target shifted right), so its
    self-attention has `target_tokens` as queries and `decoder_input_tokens` as keys, and the encoder-decoder
    attention `target_tokens` as queries and `source_tokens` as keys.
    """

    source: str
    translation: str
    teacher_forced: bool
    source_tokens: list[str]
    target_tokens: list[str]
    decoder_input_tokens: list[str]
    weights: dict[str, torch.Tensor]  # ATTENTION_KINDS' names -> (layers, heads, queries, keys)
    target_probabilities: list[float]  # the model's probability of each target token, given the ones before it
    target_alternatives: list[list[tuple[str, float]]]  # at each target position, the model's top-k tokens

    def queries_and_keys(self, kind: str) -> tuple[list[str], list[str]]:
        return {
            "encoder_self_attention": (self.source_tokens, self.source_tokens),
            "decoder_self_attention": (self.target_tokens, self.decoder_input_tokens),
            "encoder_decoder_attention": (self.target_tokens, self.source_tokens),
        }[kind]


@dataclass
class PartialTranslation:
    """One partial translation kept after a decoding step, and how the step extended it."""

    tokens: Sequence[str]  # the target tokens so far, `<s>` left out
    token: str  # the token this step added
    probability: float  # the model's probability of `token` after `tokens[:-1]`
    log_probability: float  # of all of `tokens`: the score beam search ranks by before its length penalty
    alternatives: list[tuple[str, float]]  # the top-k next tokens at this step and their probabilities
    looked_at: str  # the source token the encoder-decoder attention weighed most (last layer, mean over heads)
    attention: torch.Tensor  # that attention over the source tokens
    parent: int | None = None  # the hypothesis it extends: its index in the step before (None at step 1)
    finished: bool = False  # it ended with `</s>`: a whole translation
    winner: bool = False  # the translation `generate()` returned


@dataclass
class DecodingStep:
    step: int  # 1 for the first target token
    hypotheses: list[PartialTranslation] = field(default_factory=list)


def encode_sentence(text: str, parameter: str, tokenizer, model, as_target: bool = False) -> dict[str, torch.Tensor]:
    """`text` tokenized (as a source, or as a target) without the whitespace around it, refused when empty or longer
    than the model's positions; errors name `parameter`."""
    text = text.strip()  # whitespace around a sentence is not part of it, as in vanilla-translate and the pipeline
    if not text:
        raise ValueError(f"{parameter}: the sentence is empty")
    encoded = tokenizer(text_target=text, return_tensors="pt") if as_target else tokenizer(text, return_tensors="pt")
    length, limit = encoded["input_ids"].shape[1], model.config.max_position_embeddings
    if length > limit:
        raise ValueError(f"{parameter}: {length} tokens, more than the model's {limit} positions")
    return dict(encoded.to(model.device))


def source_labels(tokenizer, model, source: str) -> list[str]:
    """The tokens of `source` as `decoding_steps` and `attention_maps` read it, as a reader would write them."""
    return token_labels(tokenizer, encode_sentence(source, "source", tokenizer, model)["input_ids"][0])


def check_top_k(top_k: int, model) -> None:
    """Refuse a number of alternatives a step cannot have: at least one, at most the vocabulary."""
    if not 1 <= top_k <= model.config.vocab_size:
        raise ValueError(f"top_k {top_k}: a step has 1 to {model.config.vocab_size} alternatives (the vocabulary)")


def token_labels(tokenizer, ids) -> list[str]:
    """Each token as a reader would write it: byte-level pieces turned back into text (`Ġ` is a space), special
    tokens as they are, and a piece holding only part of a character's UTF-8 bytes as those bytes, e.g. `<E6 88>`."""
    ids = [int(i) for i in ids]
    special = set(tokenizer.all_special_ids)
    byte_level = type(tokenizer.backend_tokenizer.decoder).__name__ == "ByteLevel"
    labels = []
    for token_id, token in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True):
        if token_id in special or not byte_level or any(c not in _BYTE_OF_CHARACTER for c in token):
            labels.append(token if token_id in special else tokenizer.convert_tokens_to_string([token]))
            continue
        raw = bytes(_BYTE_OF_CHARACTER[c] for c in token)
        try:
            labels.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            labels.append("<" + " ".join(f"{byte:02X}" for byte in raw) + ">")
    return labels


def attention_maps(
    model, tokenizer, source: str, target: str | None = None, top_k: int = 5, **generate_kwargs
) -> AttentionMaps:
    """The three attentions of every layer and head for `source` and its translation: the model's own
    (`generate()` with `generate_kwargs`, else the model's generation config), or `target`, teacher-forced; and
    at each target position the probability of the target's token and the model's `top_k` choices."""
    check_top_k(top_k, model)
    encoded = encode_sentence(source, "source", tokenizer, model)
    model = on_the_eager_path(model, encoded)
    with torch.no_grad():
        if target is None:
            labels = model.generate(**encoded, **generate_kwargs)[:, 1:]  # without the decoder's `<s>`
        else:
            labels = encode_sentence(target, "target", tokenizer, model, as_target=True)["input_ids"]
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
        outputs = model(**encoded, decoder_input_ids=decoder_input_ids, output_attentions=True)
    probabilities = outputs.logits[0].float().softmax(-1)
    top = probabilities.topk(top_k)
    return AttentionMaps(
        source=source,
        translation=target if target is not None else tokenizer.decode(labels[0], skip_special_tokens=True),
        teacher_forced=target is not None,
        source_tokens=token_labels(tokenizer, encoded["input_ids"][0]),
        target_tokens=token_labels(tokenizer, labels[0]),
        decoder_input_tokens=token_labels(tokenizer, decoder_input_ids[0]),
        weights={
            kind: torch.stack([layer[0] for layer in layers]).float().cpu()
            for kind, layers in zip(
                ATTENTION_KINDS,
                (outputs.encoder_attentions, outputs.decoder_attentions, outputs.cross_attentions),
                strict=True,
            )
        },
        target_probabilities=probabilities.gather(-1, labels[0, :, None])[:, 0].tolist(),
        target_alternatives=[
            list(zip(token_labels(tokenizer, indices), values.tolist(), strict=True))
            for indices, values in zip(top.indices, top.values, strict=True)
        ],
    )


class StepRows:
    """What one decoding step gives of a kind, its rows, kept for every step in one buffer that doubles when full. A
    step's rows are copied in: a long search makes a few allocations, not several a step, since small blocks kept
    from every step would sit between the key-value cache's growing ones and keep the memory allocator from reusing
    the space they leave (a thousand-step beam search held gigabytes)."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None
        self.length = 0

    def append(self, rows: torch.Tensor) -> None:
        if self.buffer is None:
            self.buffer = rows.new_empty((16, *rows.shape))
        elif self.length == len(self.buffer):
            bigger = self.buffer.new_empty((2 * len(self.buffer), *rows.shape))
            bigger[: self.length] = self.buffer
            self.buffer = bigger
        self.buffer[self.length] = rows
        self.length += 1

    def on_cpu(self) -> torch.Tensor:
        """The rows of every step, (steps, *rows' shape), on the CPU, without the buffer's free end (none: empty)."""
        return torch.empty(0) if self.buffer is None else self.buffer[: self.length].to("cpu", copy=True)


class _StepRecorder(LogitsProcessor):
    """Records what `decoding_steps` shows of each step of `generate()`, and nothing more, so that what it keeps
    grows with the length, not with its square: as a forward hook, each row's top-k, log-probability of `</s>` and
    last-layer encoder-decoder attention (mean over heads, last position); as a logits processor (called after that
    forward, with the sequences of its rows: for beam search, the beams it kept), the row each row extends in the
    step before, the token it added and that token's log-probability, read from the step before's distribution,
    which is then dropped. The last step's distribution stays: a hypothesis the length limit ended may end there
    with any token. Each is a `StepRows`, on the model's device."""

    def __init__(self, top_k: int, eos_token_id: int):
        self.top_k, self.eos_token_id = top_k, eos_token_id
        self.top_log_probabilities = StepRows()  # per step: the top_k log-probabilities of each row, best first
        self.top_tokens = StepRows()  # per step: their tokens
        self.eos_log_probabilities = StepRows()  # per step: (rows,)
        self.attention = StepRows()  # per step: (rows, source)
        self.parents = StepRows()  # per step after the first: the row of the step before each row extends
        self.tokens = StepRows()  # per step after the first: the token each row added
        self.token_log_probabilities = StepRows()  # per step before the last: (rows of the next step,)
        self.log_probabilities: torch.Tensor | None = None  # the latest step's, (rows, vocabulary)
        self.sequences: torch.Tensor | None = None  # the latest step's rows
        self.pending: torch.Tensor | None = None  # the distribution of the forward whose rows come next

    @staticmethod
    def ask_for_attentions(module, args, kwargs):
        # a forward pre-hook: generate() keeps every step's attentions of every layer when asked for them itself
        return args, {**kwargs, "output_attentions": True}

    def record_outputs(self, module, inputs, outputs) -> None:
        log_probabilities = outputs.logits[:, -1].float().log_softmax(-1)
        top = log_probabilities.topk(self.top_k)
        self.top_log_probabilities.append(top.values)
        self.top_tokens.append(top.indices)
        self.eos_log_probabilities.append(log_probabilities[:, self.eos_token_id])
        self.attention.append(outputs.cross_attentions[-1][:, :, -1, :].mean(1).float())
        self.pending = log_probabilities

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.sequences is not None:
            # a row extends the last row of the step before with its prefix (at the first step all rows are `<s>`)
            same = (input_ids[:, None, :-1] == self.sequences[None]).all(-1)
            parents = same.shape[1] - 1 - same.flip(1).int().argmax(1)
            tokens = input_ids[:, -1]
            self.parents.append(parents)
            self.tokens.append(tokens)
            self.token_log_probabilities.append(self.log_probabilities[parents, tokens])
        self.sequences, self.log_probabilities = input_ids.clone(), self.pending
        return scores


def up_to_end(sequence: list[int], eos_token_id: int) -> tuple[int, ...]:
    """A sequence `generate()` returned, without the padding after its `</s>` (after the first token: the decoder
    may start with the id of `</s>`); one without `</s>` ran to the length limit and is whole."""
    if eos_token_id in sequence[1:]:
        return tuple(sequence[: sequence.index(eos_token_id, 1) + 1])
    return tuple(sequence)


class TokensSoFar(Sequence):
    """The target tokens of a hypothesis, read as a list (length, items, slices, equality with a list): those of the
    hypothesis it extends, shared rather than copied, and one more, so that a search's hypotheses hold memory in
    proportion to their number, not to the square of their length."""

    __slots__ = ("before", "last", "length")

    def __init__(self, before: "TokensSoFar | None", last: str):
        self.before, self.last = before, last
        self.length = 1 + (len(before) if before is not None else 0)

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return reversed(list(reversed(self)))

    def __reversed__(self):  # the last token first, each once: Sequence's would index, copying the list each time
        link = self
        while link is not None:
            yield link.last
            link = link.before

    def __getitem__(self, index):
        return list(self)[index]

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(list(self))


def decoding_steps(model, tokenizer, source: str, num_beams: int = 1, top_k: int = 5, **generate_kwargs):
    """`generate()` on `source`, step by step: greedy (`num_beams=1`) or beam search; the model's generation config
    gives every other setting (length penalty, length limits) unless `generate_kwargs` say otherwise.

    Returns the steps, each with the hypotheses kept after it, best first, each linked to the one it extends (a
    tree); the hypotheses beam search had finished when it stopped are marked `finished` at the step they ended,
    the one `generate()` returned `winner`; and that translation. The running beams of the last step are not
    seen: the search stopped before keeping any.
    """
    check_top_k(top_k, model)
    encoded = encode_sentence(source, "source", tokenizer, model)
    eos_token_id = model.config.eos_token_id
    recorder = _StepRecorder(top_k, eos_token_id)
    model = on_the_eager_path(model, encoded)
    hooks = (
        model.register_forward_pre_hook(recorder.ask_for_attentions, with_kwargs=True),
        model.register_forward_hook(recorder.record_outputs),
    )
    try:
        with torch.no_grad():
            sequences = model.generate(
                **encoded,
                # every finished hypothesis, best first: the first is the translation
                **{**generate_kwargs, "num_beams": num_beams, "do_sample": False, "num_return_sequences": num_beams},
                logits_processor=[recorder],
            )
    finally:
        for hook in hooks:
            hook.remove()
    source_tokens = token_labels(tokenizer, encoded["input_ids"][0])
    labels: dict[int, str] = {}  # token id -> its label, one string shared by every hypothesis holding it

    def label(token_id: int) -> str:
        if token_id not in labels:
            labels[token_id] = token_labels(tokenizer, [token_id])[0]
        return labels[token_id]

    returned = [up_to_end(sequence.tolist(), eos_token_id) for sequence in sequences]
    ended_at = {}  # step index -> the returned hypotheses that wrote their last token there
    for sequence in returned:
        ended_at.setdefault(len(sequence) - 2, []).append(sequence)
    top_log_probabilities, top_tokens = recorder.top_log_probabilities.on_cpu(), recorder.top_tokens.on_cpu()
    parents, tokens_added = recorder.parents.on_cpu().tolist(), recorder.tokens.on_cpu().tolist()
    token_log_probabilities = recorder.token_log_probabilities.on_cpu().tolist()
    last = len(top_log_probabilities) - 1
    root = returned[0][:1]  # `<s>`, which every row of the first step holds
    running = [root] * top_log_probabilities.shape[1]
    # the hypotheses of the step before -> their index, tokens and log-probability
    previous: dict[tuple, tuple[int | None, TokensSoFar | None, float]] = {root: (None, None, 0.0)}
    steps = []
    for index, (top_values, top_indices, eos_log_probabilities, attention) in enumerate(
        zip(
            top_log_probabilities,
            top_tokens,
            recorder.eos_log_probabilities.on_cpu(),
            recorder.attention.on_cpu(),
            strict=True,
        )
    ):
        rows = {sequence: row for row, sequence in enumerate(running)}
        # the hypotheses kept: the returned ones that ended here, then the rows of the next step
        kept = [(sequence, None) for sequence in ended_at.get(index, [])]
        if index < last:
            following = [
                running[parent] + (token,) for parent, token in zip(parents[index], tokens_added[index], strict=True)
            ]
            kept += zip(following, token_log_probabilities[index], strict=True)
        step, positions = DecodingStep(step=index + 1), {}
        for sequence, token_log_probability in kept:
            row = rows[sequence[:-1]]
            if token_log_probability is None:  # a finished one: it ended with `</s>`, or at the last step
                token_log_probability = float(
                    eos_log_probabilities[row]
                    if sequence[-1] == eos_token_id
                    else recorder.log_probabilities[row, sequence[-1]]
                )
            parent, before, log_probability = previous[sequence[:-1]]
            log_probability += token_log_probability
            weights = attention[row]
            tokens = TokensSoFar(before, label(sequence[-1]))
            positions[sequence] = len(step.hypotheses), tokens, log_probability
            step.hypotheses.append(
                PartialTranslation(
                    tokens=tokens,
                    token=tokens.last,
                    probability=math.exp(token_log_probability),
                    log_probability=log_probability,
                    alternatives=[
                        (label(token_id), probability)
                        for token_id, probability in zip(
                            top_indices[row].tolist(), top_values[row].exp().tolist(), strict=True
                        )
                    ],
                    looked_at=source_tokens[int(weights.argmax())],
                    attention=weights,
                    parent=parent,
                    finished=sequence[-1] == eos_token_id,
                    winner=sequence == returned[0],
                )
            )
        if step.hypotheses:  # the last step keeps none when no hypothesis ended there
            steps.append(step)
        previous = positions
        if index < last:
            running = following
    return steps, tokenizer.decode(returned[0], skip_special_tokens=True)


def winning_path(steps: list[DecodingStep]) -> list[PartialTranslation]:
    """The hypotheses of the translation `generate()` returned, one a step from the first: the winner and those it
    extends. Their `attention` rows are the encoder-decoder attention of the translation's tokens (last layer, mean
    over heads), those `attention_maps` reads of it in a second pass."""
    for index in reversed(range(len(steps))):
        winners = [hypothesis for hypothesis in steps[index].hypotheses if hypothesis.winner]
        if winners:
            path = winners
            for step in reversed(steps[:index]):
                path.append(step.hypotheses[path[-1].parent])
            return path[::-1]
    raise ValueError("the steps hold no winner: they are not decoding_steps' of one search")


def teacher_forced_steps(maps: AttentionMaps) -> list[DecodingStep]:
    """The steps of a teacher-forced pass (`attention_maps(..., target=...)`), one hypothesis each: the reference
    token, the probability the model gave it, the model's own top-k and where the encoder-decoder attention looked
    (last layer, mean over heads)."""
    attention = maps.weights["encoder_decoder_attention"][-1].mean(0)  # (target, source)
    steps, log_probability, tokens = [], 0.0, None
    for index, (token, probability) in enumerate(zip(maps.target_tokens, maps.target_probabilities, strict=True)):
        log_probability += math.log(max(probability, 1e-45))
        weights = attention[index]
        tokens = TokensSoFar(tokens, token)
        hypothesis = PartialTranslation(
            tokens=tokens,
            token=token,
            probability=probability,
            log_probability=log_probability,
            alternatives=maps.target_alternatives[index],
            looked_at=maps.source_tokens[int(weights.argmax())],
            attention=weights,
            parent=0 if index else None,
            finished=index + 1 == len(maps.target_tokens),
        )
        steps.append(DecodingStep(step=index + 1, hypotheses=[hypothesis]))
    return steps
