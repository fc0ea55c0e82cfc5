"""Terminology constraints: beam search whose every output contains given target phrases.

Lexically constrained decoding with dynamic beam allocation (Post & Vilar, 2018, "Fast Lexically Constrained
Decoding with Dynamic Beam Allocation for Neural Machine Translation"), vectorised over sentences and beams as Hu et
al. (2019) do, with fairseq's `LexicallyConstrainedBeamSearch` as the reference for the details. transformers 5
removed constrained beam search, so this is a search of its own over the model's public forward: the encoder runs
once, and the decoder reads its `EncoderDecoderCache`, reordered between steps with `reorder_cache`.

Without constraints it is transformers' beam search, token for token and score for score (candidates, finished
hypotheses, length penalty and stopping rule as `generate(num_beams=...)` has them), save that a sentence whose
search is over leaves the batch, which saves the time of long searches but may round scores differently. With
constraints each step also considers, for every hypothesis, the tokens that start or continue an unmet phrase
(Post & Vilar, Section 3), and fills the beam round-robin from banks of hypotheses that have met equally many
constraint tokens.

    tokens = constraint_token_ids(tokenizer, ["Hund", "Schnee"])
    batch = tokenizer(["A dog runs in the snow."], return_tensors="pt")
    output = constrained_beam_search(model, batch["input_ids"], batch["attention_mask"], [tokens])
    tokenizer.batch_decode(output.sequences, skip_special_tokens=True)
"""

import dataclasses
import math

import torch
from transformers.modeling_outputs import BaseModelOutput

from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    CACHE_NAME,
    SourceLengthLimitLogitsProcessor,
    source_length_limit,
)
from hf_vanilla_transformer.model.pipeline_translation import SequenceScore, generated_length, scored

# transformers' beam search marks finished or impossible candidates with this score instead of -inf, so that its
# arithmetic stays finite; the search below does the same where it must rank as transformers does
BEAM_SEARCH_PENALTY = -1.0e9


def constraint_token_ids(tokenizer, phrases: list[str]) -> list[list[int]]:
    """Each phrase's tokens as it appears inside a target sentence, after a space: with byte-level BPE a word there
    is spelled `Ġword`, not `word` as at a sentence's start. A leading token that is whitespace alone is left out,
    so that a phrase of a language written without spaces (Chinese) matches inside a word. A phrase without tokens
    raises ValueError naming it."""
    if not phrases:
        return []
    empty = [phrase for phrase in phrases if not phrase.strip()]
    if empty:
        raise ValueError(f"constraint {empty[0]!r} has no tokens")
    encoded = tokenizer(text_target=[" " + phrase.strip() for phrase in phrases], add_special_tokens=False)
    return [ids[1:] if len(ids) > 1 and not tokenizer.decode(ids[:1]).strip() else ids for ids in encoded["input_ids"]]


@dataclasses.dataclass
class ConstrainedBeamSearchOutput:
    """What `constrained_beam_search` returns, `num_return_sequences` rows per sentence, best first.

    sequences: `decoder_start_token_id`, the tokens, `</s>` (missing only where `max_new_tokens` cut the hypothesis,
        as in `generate()`), then padding.
    sequences_scores: the ranking score of transformers' beam search: log_prob_sums / generated_length **
        length_penalty, the length counting `</s>`.
    token_log_probs: the model's log-probability of each generated token (log-softmax of its logits), 0 after the end.
    log_prob_sums: their sum.
    """

    sequences: torch.LongTensor
    sequences_scores: torch.FloatTensor
    token_log_probs: torch.FloatTensor
    log_prob_sums: torch.FloatTensor

    def sequence_scores(self, eos_token_id: int, length_penalty: float | None) -> list[SequenceScore]:
        """Each row's `SequenceScore` (as `sequence_scores` gives generate()'s): its tokens up to `</s>`, their
        log-probabilities, and the score the search ranked it by."""
        ends = torch.tensor([eos_token_id])
        scores = []
        for tokens, log_probs, score in zip(
            self.sequences[:, 1:].cpu(), self.token_log_probs.cpu(), self.sequences_scores.tolist(), strict=True
        ):
            length = generated_length(tokens, ends)
            scores.append(scored(tokens[:length].tolist(), log_probs[:length].tolist(), length_penalty, score))
        return scores


@dataclasses.dataclass
class ConstraintTables:
    """Each sentence's phrases as tensors: `tokens` (sentences, phrases, longest phrase; -1 past a phrase's end),
    `lengths` (0 for the slots of sentences with fewer phrases), and `shared_prefix[s, p, j, q]`: phrase j is longer
    than q tokens and its first q tokens are phrase p's first q, so a hypothesis q tokens into p may go on with j."""

    tokens: torch.LongTensor
    lengths: torch.LongTensor
    shared_prefix: torch.BoolTensor

    @classmethod
    def build(cls, constraints: list[list[list[int]]], device: torch.device) -> "ConstraintTables":
        phrases = max(1, max(map(len, constraints)))  # one empty slot at least, so that no dimension is 0
        longest = max([1, *(len(phrase) for sentence in constraints for phrase in sentence)])
        tokens = torch.full((len(constraints), phrases, longest), -1, dtype=torch.long)
        for sentence, sentence_phrases in enumerate(constraints):
            for slot, phrase in enumerate(sentence_phrases):
                tokens[sentence, slot, : len(phrase)] = torch.tensor(phrase, dtype=torch.long)
        lengths = (tokens >= 0).sum(-1)
        # equal[s, p, j, i]: phrases p and j agree at position i; a prefix is shared while all positions before agree
        equal = tokens[:, :, None, :] == tokens[:, None, :, :]
        agree_before = torch.cat([torch.ones_like(equal[..., :1]), equal.cumprod(-1).bool()], dim=-1)
        longer = lengths[:, None, :, None] > torch.arange(longest + 1)
        return cls(tokens.to(device), lengths.to(device), (agree_before & longer).to(device))

    def total_lengths(self) -> torch.LongTensor:
        return self.lengths.sum(-1)


@dataclasses.dataclass
class ConstraintState:
    """Where each hypothesis stands (Post & Vilar's constraint coverage): `met` phrases (empty slots count as met),
    and `progress` tokens into phrase `phrase`, the one it is in the middle of (0: none). Rows belong to sentences
    `sentence`."""

    sentence: torch.LongTensor
    met: torch.BoolTensor
    phrase: torch.LongTensor
    progress: torch.LongTensor

    @classmethod
    def start(cls, tables: ConstraintTables, sentence: torch.LongTensor) -> "ConstraintState":
        zeros = torch.zeros_like(sentence)
        return cls(sentence, tables.lengths[sentence] == 0, zeros, zeros)

    def select(self, rows: torch.LongTensor) -> "ConstraintState":
        return ConstraintState(self.sentence[rows], self.met[rows], self.phrase[rows], self.progress[rows])

    def unmet_tokens(self, tables: ConstraintTables) -> torch.LongTensor:
        """Tokens of the unmet phrases: what a hypothesis that drops its phrase in progress still has to write."""
        return (tables.lengths[self.sentence] * ~self.met).sum(-1)

    def need(self, tables: ConstraintTables) -> torch.LongTensor:
        """The fewest tokens that still meet every constraint: the rest of the phrase in progress, then the others."""
        return self.unmet_tokens(tables) - self.progress

    def next_tokens(self, tables: ConstraintTables) -> torch.LongTensor:
        """(rows, 2 x phrases): each phrase's token after the current progress, then each phrase's first token (-1
        where there is none): every token that can start or continue a constraint (fairseq's `next_tokens`)."""
        tokens = tables.tokens[self.sentence]
        position = self.progress.clamp(max=tokens.shape[-1] - 1)[:, None, None].expand(-1, tokens.shape[1], 1)
        return torch.cat([tokens.gather(2, position).squeeze(2), tokens[:, :, 0]], dim=1)

    def advance(self, tables: ConstraintTables, token: torch.LongTensor) -> "ConstraintState":
        """The state after `token` (one per row): it continues the phrase in progress, or a phrase sharing its
        start; else it drops the progress and may start an unmet phrase. Progress goes one phrase at a time, so a
        phrase counts as met only where it is a contiguous run of its own tokens."""
        tokens = tables.tokens[self.sentence]
        unmet = ~self.met
        position = self.progress.clamp(max=tokens.shape[-1] - 1)[:, None, None].expand(-1, tokens.shape[1], 1)
        shares_prefix = tables.shared_prefix[self.sentence, self.phrase, :, self.progress]
        continues = unmet & shares_prefix & (tokens.gather(2, position).squeeze(2) == token[:, None])
        continues &= (self.progress > 0)[:, None]
        starts = unmet & (tokens[:, :, 0] == token[:, None])
        does_continue = continues.any(-1)
        phrase = torch.where(does_continue, continues.int().argmax(-1), starts.int().argmax(-1))
        progress = torch.where(does_continue, self.progress + 1, starts.any(-1).long())
        completes = (progress > 0) & (progress == tables.lengths[self.sentence].gather(1, phrase[:, None]).squeeze(1))
        met = self.met | (torch.nn.functional.one_hot(phrase, tokens.shape[1]).bool() & completes[:, None])
        return ConstraintState(self.sentence, met, phrase, torch.where(completes, 0, progress))


def allowed_tokens(
    state: ConstraintState,
    tables: ConstraintTables,
    next_tokens: torch.LongTensor,
    room_left: torch.LongTensor,
    vocab_size: int,
    eos: int,
) -> torch.BoolTensor:
    """(rows, vocabulary): the tokens after which a hypothesis can still meet all its constraints in the room it
    has left (`room_left`: tokens before `</s>` it may still write after this one); `next_tokens` are the state's.
    `</s>` only once all are met.

    Post & Vilar let a hypothesis run out of room; here the last free steps are spent on constraint tokens, so
    every hypothesis that survives meets its constraints."""
    room_left = room_left[:, None]
    allowed = (state.unmet_tokens(tables)[:, None] <= room_left).expand(-1, vocab_size).clone()
    # a slot without a token is checked as `</s>`, whose column is set last
    candidates = torch.where(next_tokens >= 0, next_tokens, eos)
    rows = torch.arange(len(candidates), device=candidates.device).repeat_interleave(candidates.shape[1])
    after = state.select(rows).advance(tables, candidates.flatten())
    allowed.scatter_(1, candidates, (after.need(tables).view_as(candidates) <= room_left))
    allowed[:, eos] = state.need(tables) == 0
    return allowed


@dataclasses.dataclass
class Candidates:
    """One step's candidate extensions of each sentence's beam (sentences, candidates), best score first: the beam
    they extend, their token, the model's log-probability of it, their running score, and whether they may be
    kept (from a live hypothesis, finite, not a repeat)."""

    beam: torch.LongTensor
    token: torch.LongTensor
    log_prob: torch.FloatTensor
    score: torch.FloatTensor
    valid: torch.BoolTensor

    def take(self, index: torch.LongTensor) -> "Candidates":
        return Candidates(*(getattr(self, field.name).gather(1, index) for field in dataclasses.fields(self)))


def step_candidates(
    scores: torch.FloatTensor, log_probs: torch.FloatTensor, next_tokens: torch.LongTensor, alive: torch.BoolTensor
) -> Candidates:
    """Post & Vilar's candidate set: the best 2 x beam extensions over the whole beam (transformers' beam search
    keeps these), each live hypothesis' best token, and each live hypothesis' tokens that start or continue a
    constraint; repeats dropped. `scores` (sentences, beams, vocabulary) are running scores plus `log_probs`."""
    sentences, beams, vocab_size = scores.shape
    top_scores, top_index = scores.flatten(1).topk(2 * beams)
    best = scores.argmax(-1, keepdim=True)
    # a slot without a token repeats the best one, and goes as a repeat
    next_tokens = next_tokens.view(sentences, beams, -1)
    own = torch.cat([torch.where(next_tokens >= 0, next_tokens, best), best], dim=-1)
    own_beam = torch.arange(beams, device=scores.device)[None, :, None].expand_as(own)
    beam = torch.cat([top_index // vocab_size, own_beam.flatten(1)], dim=1)
    token = torch.cat([top_index % vocab_size, own.flatten(1)], dim=1)
    score = torch.cat([top_scores, scores.gather(2, own).flatten(1)], dim=1)
    log_prob = log_probs.flatten(1).gather(1, beam * vocab_size + token)
    # the first of equal (beam, token) pairs stays: a stable sort puts repeats right after it
    key, order = (beam * vocab_size + token).sort(dim=1, stable=True)
    repeat = torch.zeros_like(key, dtype=torch.bool)
    repeat[:, 1:] = key[:, 1:] == key[:, :-1]
    repeat = torch.zeros_like(repeat).scatter(1, order, repeat)
    valid = alive.gather(1, beam) & score.isfinite() & ~repeat
    # the top 2 x beam come first and keep their order among equal scores, as transformers ranks them
    ranked = score.masked_fill(~valid, -math.inf).sort(dim=1, descending=True, stable=True).indices
    return Candidates(beam, token, log_prob, score, valid).take(ranked)


def allocate_beam(banks: torch.LongTensor, eligible: torch.BoolTensor, beams: int, most: int) -> torch.LongTensor:
    """Dynamic beam allocation (Post & Vilar, Section 3.1; fairseq's stripes): `beams` candidates per sentence out of
    the eligible ones (best first), the best of each bank (candidates that have met equally many constraint tokens,
    `most` at most), most advanced bank first, then each bank's second best, and so on. A bank without candidates
    leaves its share to the others; without constraints there is one bank, and this is plain top-k."""
    counts = torch.nn.functional.one_hot(banks, most + 1) * eligible[..., None]
    rank_in_bank = counts.cumsum(1).gather(2, banks[..., None]).squeeze(-1) - 1
    stripe = rank_in_bank * (most + 1) + (most - banks)
    order = torch.arange(banks.shape[1], device=banks.device)
    key = torch.where(eligible, stripe, stripe.numel() * (most + 2) + order)
    return key.sort(dim=1, stable=True).indices[:, :beams]


@dataclasses.dataclass
class Settings:
    """The search's settings, each from the call or else the model's generation config, as `generate()` takes them."""

    num_beams: int
    length_penalty: float
    early_stopping: bool | str
    max_new_tokens: int
    eos: int
    pad: int
    start: int

    @classmethod
    def of(cls, model, num_beams, length_penalty, max_new_tokens) -> "Settings":
        config = model.generation_config
        if max_new_tokens is None:
            max_new_tokens = config.max_new_tokens or config.max_length - 1
        eos = torch.tensor(config.eos_token_id if config.eos_token_id is not None else model.config.eos_token_id)
        if eos.numel() != 1:
            raise ValueError(f"constrained beam search takes one eos_token_id, not {eos.tolist()}")
        return cls(
            num_beams=num_beams or config.num_beams,
            length_penalty=config.length_penalty if length_penalty is None else length_penalty,
            early_stopping=config.early_stopping,
            max_new_tokens=min(max_new_tokens, model.config.max_position_embeddings - 1),
            eos=int(eos),
            pad=config.pad_token_id if config.pad_token_id is not None else model.config.pad_token_id,
            start=config.decoder_start_token_id
            if config.decoder_start_token_id is not None
            else model.config.decoder_start_token_id,
        )


def source_limits(model, attention_mask: torch.LongTensor) -> torch.LongTensor | None:
    """Section 6.1's limit as the model's `generate()` sets it: source length + `max_new_tokens_over_source` tokens,
    `</s>` included."""
    limit = source_length_limit(model, None, None, {"attention_mask": attention_mask})
    return None if limit is None else limit.max_new_tokens


def check_constraints(constraints: list[list[list[int]]], room: list[int], vocab_size: int, settings: Settings) -> None:
    """Bad constraints raise ValueError naming the sentence and the phrase, before any decoding."""
    if len(constraints) != len(room):
        raise ValueError(f"{len(constraints)} constraint lists for {len(room)} sentences")
    for sentence, phrases in enumerate(constraints):
        for phrase in phrases:
            if not phrase:
                raise ValueError(f"sentence {sentence}: a constraint has no tokens")
            if any(not 0 <= token < vocab_size or token in (settings.eos, settings.pad) for token in phrase):
                raise ValueError(f"sentence {sentence}: constraint {phrase} has a special token or one out of range")
        needed = sum(map(len, phrases))
        if needed > room[sentence]:
            raise ValueError(
                f"sentence {sentence}: constraints {phrases} need {needed} tokens, but its length limit leaves room "
                f"for {int(room[sentence])}"
            )


@dataclasses.dataclass
class Hypotheses:
    """Hypotheses per sentence (sentences, beams, ...): tokens after `decoder_start_token_id`, the model's
    log-probability of each, and a score (running: the sum; finished: the length-penalised sum)."""

    sequences: torch.LongTensor
    token_log_probs: torch.FloatTensor
    scores: torch.FloatTensor

    @classmethod
    def empty(cls, sentences: int, beams: int, settings: Settings, device: torch.device) -> "Hypotheses":
        sequences = torch.full((sentences, beams, settings.max_new_tokens + 1), settings.pad, device=device)
        sequences[:, :, 0] = settings.start
        token_log_probs = torch.zeros(sentences, beams, settings.max_new_tokens, device=device)
        return cls(sequences, token_log_probs, torch.full((sentences, beams), BEAM_SEARCH_PENALTY, device=device))

    def extended(self, candidates: Candidates, step: int, scores: torch.FloatTensor) -> "Hypotheses":
        """The candidates' hypotheses: their beam's, with their token as the step-th, scored `scores`."""
        sequences = self.sequences.gather(1, candidates.beam[..., None].expand(-1, -1, self.sequences.shape[-1]))
        sequences[:, :, step] = candidates.token
        index = candidates.beam[..., None].expand(-1, -1, self.token_log_probs.shape[-1])
        token_log_probs = self.token_log_probs.gather(1, index)
        token_log_probs[:, :, step - 1] = candidates.log_prob
        return Hypotheses(sequences, token_log_probs, scores)

    def of_sentences(self, index: torch.LongTensor) -> "Hypotheses":
        return Hypotheses(*(getattr(self, field.name)[index] for field in dataclasses.fields(self)))

    def take(self, index: torch.LongTensor) -> "Hypotheses":
        """The hypotheses at `index` (sentences, k) of each sentence."""
        return Hypotheses(
            self.sequences.gather(1, index[..., None].expand(-1, -1, self.sequences.shape[-1])),
            self.token_log_probs.gather(1, index[..., None].expand(-1, -1, self.token_log_probs.shape[-1])),
            self.scores.gather(1, index),
        )


@dataclasses.dataclass
class Finished:
    """Each sentence's best finished hypotheses, best first, their lengths (`</s>` included) and whether a slot
    holds one yet."""

    hypotheses: Hypotheses
    lengths: torch.LongTensor
    found: torch.BoolTensor

    @classmethod
    def empty(cls, sentences: int, beams: int, settings: Settings, device: torch.device) -> "Finished":
        empty = torch.zeros(sentences, beams, dtype=torch.long, device=device)
        return cls(Hypotheses.empty(sentences, beams, settings, device), empty, empty.bool())

    def sentences(self, index: torch.LongTensor) -> "Finished":
        return Finished(self.hypotheses.of_sentences(index), self.lengths[index], self.found[index])

    def store(self, index: torch.LongTensor, other: "Finished") -> None:
        """Puts `other`'s sentences in place of sentences `index`."""
        for field in dataclasses.fields(Hypotheses):
            getattr(self.hypotheses, field.name)[index] = getattr(other.hypotheses, field.name)
        self.lengths[index] = other.lengths
        self.found[index] = other.found


@dataclasses.dataclass
class Running:
    """The hypotheses each sentence still extends, best first: whether each is live (an extension that may go on;
    the others only fill the beam, as in transformers), and where each stands with its constraints."""

    hypotheses: Hypotheses
    alive: torch.BoolTensor
    state: ConstraintState

    @classmethod
    def start(cls, tables: ConstraintTables, beams: int, settings: Settings, device: torch.device) -> "Running":
        sentences = len(tables.lengths)
        hypotheses = Hypotheses.empty(sentences, beams, settings, device)
        hypotheses.scores[:, 0] = 0.0  # all beams start alike: only the first is extended, as in transformers
        alive = torch.zeros(sentences, beams, dtype=torch.bool, device=device)
        alive[:, 0] = True
        state = ConstraintState.start(tables, torch.arange(sentences, device=device).repeat_interleave(beams))
        return cls(hypotheses, alive, state)

    def sentences(self, index: torch.LongTensor) -> "Running":
        beams = self.alive.shape[1]
        rows = (index[:, None] * beams + torch.arange(beams, device=index.device)).flatten()
        return Running(self.hypotheses.of_sentences(index), self.alive[index], self.state.select(rows))


@torch.no_grad()
def constrained_beam_search(
    model,
    input_ids: torch.LongTensor,
    attention_mask: torch.LongTensor,
    constraints: list[list[list[int]]],
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    num_return_sequences: int = 1,
) -> ConstrainedBeamSearchOutput:
    """Beam search in which every returned hypothesis of sentence i contains each of `constraints[i]` (token ids,
    `constraint_token_ids`) as a contiguous run of tokens, in any order (Post & Vilar's dynamic beam allocation).

    `num_beams`, `length_penalty` (and `early_stopping`) default to the model's generation config, as in
    `generate()`; each sentence ends by Section 6.1's limit, its source length + `max_new_tokens_over_source` tokens
    (`</s>` included), and after `max_new_tokens` (default: as the generation config's `max_length` allows), within
    `max_position_embeddings`. Other settings of the generation config (repetition penalties, forced tokens, ...)
    are not applied. Without constraints the output is `generate()`'s beam search, token for token and score for
    score, except that a sentence whose search is over leaves the batch (`generate()` goes on computing it): the
    others' matrix products then run over fewer rows, which may round a score differently in its last bit.

    `</s>` is barred while a hypothesis has unmet constraints, and once the room left is just enough for the
    constraint tokens still missing, only those are allowed, so every hypothesis kept meets its constraints. The
    beam is shared round-robin among banks of hypotheses that have met equally many constraint tokens; with
    `num_beams` no larger than the constraint tokens, some banks get no beam in a step (the most advanced go
    first, as with fairseq's and Post & Vilar's banks), which narrows the search but loses no constraint. A
    sentence whose constraints allow fewer than `num_return_sequences` hypotheses gets, in the missing rows, score
    -inf and no tokens. Constraints that cannot fit in a sentence's limit raise ValueError before any decoding.
    """
    settings = Settings.of(model, num_beams, length_penalty, max_new_tokens)
    beams, cap = settings.num_beams, settings.max_new_tokens
    if num_return_sequences > beams:
        raise ValueError(f"num_return_sequences {num_return_sequences} is more than num_beams {beams}")
    sentences, device = input_ids.shape[0], input_ids.device
    limits = source_limits(model, attention_mask)
    # the most tokens before `</s>`: one fewer than the source rule's limit, or as many as `max_new_tokens`, which
    # cuts a hypothesis without `</s>`
    room = torch.full((sentences,), cap, device=device) if limits is None else (limits - 1).clamp(max=cap)
    check_constraints(constraints, room.tolist(), model.config.vocab_size, settings)
    tables = ConstraintTables.build(constraints, device)
    most = int(tables.total_lengths().max())

    encoder_states = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    encoder_states = encoder_states.repeat_interleave(beams, 0)
    beam_attention_mask = attention_mask.repeat_interleave(beams, 0)
    searching = torch.arange(sentences, device=device)  # the sentences still searched, by their index in the batch
    running = Running.start(tables, beams, settings, device)
    finished = Finished.empty(sentences, beams, settings, device)
    results = Finished.empty(sentences, beams, settings, device)
    may_improve = torch.ones(sentences, 1, dtype=torch.bool, device=device)
    cache = None
    for step in range(1, cap + 1):
        output = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states),
            attention_mask=beam_attention_mask,
            decoder_input_ids=running.hypotheses.sequences[:, :, step - 1].reshape(-1, 1),
            cache=cache,
            use_cache=True,
        )
        cache = getattr(output, CACHE_NAME)
        log_probs = torch.log_softmax(output.logits[:, -1].float(), dim=-1)
        if limits is not None:
            length_limit = SourceLengthLimitLogitsProcessor(limits[searching], settings.eos, 1)
            log_probs = length_limit(running.hypotheses.sequences.flatten(0, 1)[:, :step], log_probs)
        state = running.state
        next_tokens = state.next_tokens(tables)
        room_left = room[state.sentence] - step
        allowed = allowed_tokens(state, tables, next_tokens, room_left, log_probs.shape[-1], settings.eos)
        log_probs = log_probs.masked_fill(~allowed, -math.inf).view(len(searching), beams, -1)
        scores = running.hypotheses.scores[..., None] + log_probs
        candidates = step_candidates(scores, log_probs, next_tokens, running.alive)
        count = candidates.token.shape[1]

        row_offset = torch.arange(len(searching), device=device)[:, None] * beams
        candidate_state = state.select((row_offset + candidates.beam).flatten()).advance(
            tables, candidates.token.flatten()
        )
        ends = (candidates.token == settings.eos) | (step == cap)
        # transformers' beam search: of the candidates, those among the first `beams` that end are finished
        first = torch.arange(beams, device=device)[None].expand(len(searching), -1)
        finished = update_finished(
            finished,
            running.hypotheses.extended(candidates.take(first), step, candidates.score[:, :beams]),
            (candidates.valid & ends)[:, :beams],
            step,
            settings,
            may_improve,
        )

        banks = tables.total_lengths()[searching, None] - candidate_state.need(tables).view_as(candidates.token)
        chosen = allocate_beam(banks, candidates.valid & ~ends, beams, most)
        # a hypothesis that ended goes on only to fill the beam, ranked last (transformers' running beams)
        running_scores = candidates.score + ends * BEAM_SEARCH_PENALTY
        chosen = chosen.gather(1, running_scores.gather(1, chosen).sort(dim=1, descending=True, stable=True).indices)
        kept = candidates.take(chosen)
        running = Running(
            running.hypotheses.extended(kept, step, running_scores.gather(1, chosen)),
            (candidates.valid & ~ends).gather(1, chosen),
            candidate_state.select((row_offset // beams * count + chosen).flatten()),
        )
        may_improve = may_improve & can_improve(
            running.hypotheses.scores, finished.hypotheses.scores, finished.found, step, settings
        )

        # a sentence whose finished hypotheses can no longer change leaves the batch
        done = ~may_improve[:, 0] | (finished.found.all(-1) & (settings.early_stopping is True)) | (step == cap)
        results.store(searching[done], finished.sentences(done.nonzero()[:, 0]))
        go_on = (~done).nonzero()[:, 0]
        if len(go_on) == 0:
            break
        cache.self_attention_cache.reorder_cache((row_offset + kept.beam)[go_on].flatten())
        if done.any():
            rows = (row_offset[go_on] + torch.arange(beams, device=device)).flatten()
            cache.cross_attention_cache.reorder_cache(rows)
            encoder_states, beam_attention_mask = encoder_states[rows], beam_attention_mask[rows]
            searching, running, finished, may_improve = (
                searching[go_on],
                running.sentences(go_on),
                finished.sentences(go_on),
                may_improve[go_on],
            )
    return best_hypotheses(results, num_return_sequences)


def update_finished(
    finished: Finished,
    new: Hypotheses,
    ending: torch.BoolTensor,
    step: int,
    settings: Settings,
    may_improve: torch.BoolTensor,
) -> Finished:
    """transformers' update of the finished hypotheses: the `ending` ones of `new`, scored by their sum / step **
    length_penalty, join the finished; the best `num_beams` stay. A sentence that cannot improve takes no more."""
    scores = new.scores / (step**settings.length_penalty)
    full = finished.found.all(-1, keepdim=True) & (settings.early_stopping is True)
    scores = scores + full * BEAM_SEARCH_PENALTY + ~may_improve * BEAM_SEARCH_PENALTY
    scores = scores.masked_fill(~ending, -math.inf)
    merged = Hypotheses(
        torch.cat([finished.hypotheses.sequences, new.sequences], dim=1),
        torch.cat([finished.hypotheses.token_log_probs, new.token_log_probs], dim=1),
        torch.cat([finished.hypotheses.scores, scores], dim=1),
    )
    best = merged.scores.topk(settings.num_beams, dim=1).indices
    lengths = torch.cat([finished.lengths, torch.full_like(ending, step, dtype=torch.long)], dim=1)
    return Finished(
        merged.take(best), lengths.gather(1, best), torch.cat([finished.found, ending], dim=1).gather(1, best)
    )


def can_improve(
    running_scores: torch.FloatTensor,
    finished_scores: torch.FloatTensor,
    is_finished: torch.BoolTensor,
    step: int,
    settings: Settings,
) -> torch.BoolTensor:
    """transformers' early-stopping heuristic: whether the best running hypothesis, at the length it would have
    (this step's; with `early_stopping="never"` and a positive length penalty, the longest allowed), still beats
    the worst finished one (or a slot is still free)."""
    if settings.early_stopping == "never" and settings.length_penalty > 0.0:
        best_length = settings.max_new_tokens
    else:
        best_length = step
    best_running = running_scores[:, :1] / (best_length**settings.length_penalty)
    worst_finished = torch.where(
        is_finished, finished_scores.min(dim=1, keepdim=True).values, finished_scores.new_tensor(BEAM_SEARCH_PENALTY)
    )
    return (best_running > worst_finished).any(dim=-1, keepdim=True)


def best_hypotheses(finished: Finished, count: int) -> ConstrainedBeamSearchOutput:
    """The `count` best finished hypotheses of each sentence, flattened, cut to the longest of them."""
    best = finished.hypotheses.take(
        torch.arange(count, device=finished.lengths.device)[None].expand(len(finished.lengths), -1)
    )
    longest = int(finished.lengths[:, :count].max())
    found = finished.found[:, :count].flatten()
    return ConstrainedBeamSearchOutput(
        sequences=best.sequences.flatten(0, 1)[:, : longest + 1],
        sequences_scores=best.scores.flatten().masked_fill(~found, -math.inf),
        token_log_probs=best.token_log_probs.flatten(0, 1)[:, :longest],
        log_prob_sums=best.token_log_probs.flatten(0, 1).sum(-1).masked_fill(~found, -math.inf),
    )
