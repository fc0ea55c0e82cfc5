"""Terminology constraints: beam search whose every output holds given target words or phrases.

Lexically constrained decoding with dynamic beam allocation (Post & Vilar, 2018, "Fast Lexically Constrained
Decoding with Dynamic Beam Allocation for Neural Machine Translation"), vectorised over sentences and beams as Hu et
al. (2019) do, with fairseq's `LexicallyConstrainedBeamSearch` as the reference for the details. transformers 5
removed constrained beam search, so this is a search of its own over the model's public forward: the encoder runs
once, and the decoder reads its `EncoderDecoderCache`, reordered between steps with `reorder_cache`.

A sentence is searched first without its constraints: that search is transformers' beam search, token for token and
score for score (candidates, finished hypotheses, length penalty and stopping rule as `generate(num_beams=...)` has
them), save that a sentence whose search is over leaves the batch, which saves the time of long searches but may
round scores differently. Where its best translation already holds every phrase, that translation stands. Otherwise
the sentence is searched again with its constraints, on a wider beam (`constrained_beams`): each step also
considers, for every hypothesis, the tokens that start or continue an unmet phrase (Post & Vilar, Section 3), and
fills the beam round-robin from banks of hypotheses that have met equally many constraint tokens, the bank of those
that have met none first. A phrase is met as whole words (decoding/words.py): it starts where a word may and the token
after it does not go on with its last word; a hypothesis that leaves a phrase unfinished, or glues a word to it,
drops it and goes back to the bank of what it has met.

    words = TokenWords.of(tokenizer, model.config.vocab_size)
    phrases = encode_phrases(tokenizer, ["Hund", "Schnee"], "word", words)
    batch = tokenizer(["A dog runs in the snow."], return_tensors="pt")
    output = constrained_beam_search(model, batch["input_ids"], batch["attention_mask"], [phrases], words)
    tokenizer.batch_decode(output.sequences, skip_special_tokens=True)
"""

import dataclasses
import math

import torch
from transformers.generation import LogitsProcessorList
from transformers.modeling_outputs import BaseModelOutput

from hf_vanilla_transformer.decoding.words import Phrase, TokenWords
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    CACHE_NAME,
    SourceLengthLimitLogitsProcessor,
    source_length_limit,
)

# transformers' beam search marks finished or impossible candidates with this score instead of -inf, so that its
# arithmetic stays finite; the search below does the same where it must rank as transformers does
BEAM_SEARCH_PENALTY = -1.0e9


def constrained_beams(num_beams: int, tokens: int) -> int:
    """The beam a sentence whose constraints are `tokens` tokens long is searched with again: three times the
    model's, and wide enough that every bank (0 to `tokens` constraint tokens met) keeps a hypothesis and one more
    (Post & Vilar's beams grow with the constraints; chosen on the validation set, BENCHMARKS.md)."""
    return max(3 * num_beams, tokens + 2)


@dataclasses.dataclass
class ConstrainedBeamSearchOutput:
    """What `constrained_beam_search` returns, `num_return_sequences` rows per sentence, best first.

    sequences: `decoder_start_token_id`, the tokens, `</s>` (missing only where `max_new_tokens` cut the hypothesis,
        as in `generate()`), then padding.
    sequences_scores: the ranking score of transformers' beam search: log_prob_sums / generated_length **
        length_penalty, the length counting `</s>`; -inf in a row that holds no hypothesis (`found`).
    token_log_probs: the model's log-probability of each generated token (log-softmax of its logits), 0 after the end.
    log_prob_sums: their sum.
    found: whether the row holds a hypothesis: a sentence may have fewer hypotheses that meet its constraints than
        `num_return_sequences`.
    """

    sequences: torch.LongTensor
    sequences_scores: torch.FloatTensor
    token_log_probs: torch.FloatTensor
    log_prob_sums: torch.FloatTensor
    found: torch.BoolTensor


@dataclasses.dataclass
class ConstraintTables:
    """Each sentence's phrases as tensors, a slot per form (a token sequence that writes a phrase, `Phrase.forms`):
    `tokens` (sentences, forms, longest form; -1 past a form's end), `lengths` (0 for the slots of sentences with
    fewer forms), `phrase` (the index of the phrase a form writes), `opens` and `closes` (its word boundaries),
    `may_lead` (whether it may be the sentence's first word), `sentence_ends` (the tokens that end a sentence its
    translation may write: as many as its translation without constraints has, the last once all are met; None
    before that is known), `shortest` (sentences, phrases: the fewest tokens that write each phrase; 0 for a
    missing one), and
    `shared_prefix[s, f, g, q]`: form g is longer than q tokens and its first q tokens are form f's first q, so a
    hypothesis q tokens into f may go on with g. `words` tells which tokens go on with a word (None: no phrase has
    word boundaries)."""

    tokens: torch.LongTensor
    lengths: torch.LongTensor
    phrase: torch.LongTensor
    opens: torch.BoolTensor
    closes: torch.BoolTensor
    may_lead: torch.BoolTensor
    shortest: torch.LongTensor
    shared_prefix: torch.BoolTensor
    words: TokenWords | None
    sentence_ends: torch.LongTensor | None = None

    @classmethod
    def build(
        cls, constraints: list[list[Phrase]], words: TokenWords | None, device: torch.device
    ) -> "ConstraintTables":
        forms = [
            [
                (index, form, opens, phrase.closes, phrase.may_lead)
                for index, phrase in enumerate(sentence)
                for form, opens in zip(phrase.forms, phrase.opens, strict=True)
            ]
            for sentence in constraints
        ]
        slots = max(1, max(map(len, forms)))  # one empty slot at least, so that no dimension is 0
        phrases = max(1, max(map(len, constraints)))
        longest = max([1, *(len(form) for sentence in forms for _, form, *_ in sentence)])
        tokens = torch.full((len(constraints), slots, longest), -1, dtype=torch.long)
        phrase_of = torch.zeros(len(constraints), slots, dtype=torch.long)
        opens = torch.zeros(len(constraints), slots, dtype=torch.bool)
        closes = torch.zeros(len(constraints), slots, dtype=torch.bool)
        may_lead = torch.zeros(len(constraints), slots, dtype=torch.bool)
        shortest = torch.zeros(len(constraints), phrases, dtype=torch.long)
        for sentence, (sentence_forms, sentence_phrases) in enumerate(zip(forms, constraints, strict=True)):
            for slot, (index, form, *flags) in enumerate(sentence_forms):
                tokens[sentence, slot, : len(form)] = torch.tensor(form, dtype=torch.long)
                phrase_of[sentence, slot] = index
                opens[sentence, slot], closes[sentence, slot], may_lead[sentence, slot] = flags
            for index, phrase in enumerate(sentence_phrases):
                shortest[sentence, index] = phrase.shortest
        if words is None and (opens.any() or closes.any()):
            raise ValueError("phrases matched as whole words need the tokenizer's TokenWords (words=...)")
        lengths = (tokens >= 0).sum(-1)
        # equal[s, f, g, i]: forms f and g agree at position i; a prefix is shared while all positions before agree
        equal = tokens[:, :, None, :] == tokens[:, None, :, :]
        agree_before = torch.cat([torch.ones_like(equal[..., :1]), equal.cumprod(-1).bool()], dim=-1)
        longer = lengths[:, None, :, None] > torch.arange(longest + 1)
        return cls(
            tokens.to(device),
            lengths.to(device),
            phrase_of.to(device),
            opens.to(device),
            closes.to(device),
            may_lead.to(device),
            shortest.to(device),
            (agree_before & longer).to(device),
            None if words is None else words.to(device),
        )

    def total_lengths(self) -> torch.LongTensor:
        """The fewest constraint tokens that meet all of each sentence's phrases."""
        return self.shortest.sum(-1)

    def joins(self, token: torch.LongTensor) -> torch.BoolTensor:
        """Whether each token goes on with a word it follows."""
        return torch.zeros_like(token, dtype=torch.bool) if self.words is None else self.words.joins[token]

    def ends_in_word(self, token: torch.LongTensor) -> torch.BoolTensor:
        """Whether a word may go on after each token: where none may, a phrase written next stands as a word."""
        return torch.zeros_like(token, dtype=torch.bool) if self.words is None else self.words.ends_in_word[token]

    def ends_sentence(self, token: torch.LongTensor) -> torch.BoolTensor:
        return torch.zeros_like(token, dtype=torch.bool) if self.words is None else self.words.ends_sentence[token]

    def opens_word(self, token: torch.LongTensor) -> torch.BoolTensor:
        """Whether the search may place a form that starts a word right after each token (`TokenWords.opens_word`)."""
        return torch.ones_like(token, dtype=torch.bool) if self.words is None else self.words.opens_word[token]


@dataclasses.dataclass
class ConstraintState:
    """Where each hypothesis stands (Post & Vilar's constraint coverage): the phrases it has `met` (missing ones
    count as met), and `progress` tokens into form `form`, the one it is in the middle of (0: none). A form whose
    phrase `closes` stays at its full length until the next token: met if that token does not go on with its last
    word, dropped if it does. `sentence_ends`: the tokens it has written that end a sentence. Rows belong to
    sentences `sentence`."""

    sentence: torch.LongTensor
    met: torch.BoolTensor
    form: torch.LongTensor
    progress: torch.LongTensor
    sentence_ends: torch.LongTensor

    @classmethod
    def start(cls, tables: ConstraintTables, sentence: torch.LongTensor) -> "ConstraintState":
        zeros = torch.zeros_like(sentence)
        return cls(sentence, tables.shortest[sentence] == 0, zeros, zeros, zeros)

    def select(self, rows: torch.LongTensor) -> "ConstraintState":
        return ConstraintState(*(getattr(self, field.name)[rows] for field in dataclasses.fields(self)))

    def current_phrase(self, tables: ConstraintTables) -> torch.LongTensor:
        return tables.phrase[self.sentence, self.form]

    def pending(self, tables: ConstraintTables) -> torch.BoolTensor:
        """Whether the hypothesis has just written all of a form whose phrase waits for the word's end."""
        return (self.progress > 0) & (self.progress == tables.lengths[self.sentence, self.form])

    def met_if_the_word_ends(self, tables: ConstraintTables) -> torch.BoolTensor:
        """The phrases met once the next token does not go on with the word in progress: the met ones, and the one
        whose form was just written whole (`pending`)."""
        slots = self.met.shape[1]
        just_written = torch.nn.functional.one_hot(self.current_phrase(tables), slots).bool()
        return self.met | (just_written & self.pending(tables)[:, None])

    def unmet_tokens(self, tables: ConstraintTables, met: torch.BoolTensor | None = None) -> torch.LongTensor:
        """The fewest tokens that write the phrases not `met` (default: the state's)."""
        met = self.met if met is None else met
        return (tables.shortest[self.sentence] * ~met).sum(-1)

    def need(self, tables: ConstraintTables) -> torch.LongTensor:
        """The fewest tokens that still meet every constraint: the rest of the form in progress (or, if fewer, the
        phrase written anew), then the others."""
        unmet = self.unmet_tokens(tables)
        own = tables.shortest[self.sentence, self.current_phrase(tables)]
        rest = tables.lengths[self.sentence, self.form] - self.progress
        return torch.where(self.progress > 0, unmet - own + torch.minimum(rest, own), unmet)

    def next_tokens(self, tables: ConstraintTables, may_open: torch.BoolTensor, leading: bool) -> torch.LongTensor:
        """(rows, 2 x forms): each form's token after the current progress, then the first token of each form that
        may start here (its phrase unmet; one that starts a word only where `may_open`), -1 where there is none:
        every token that can start or continue a constraint (fairseq's `next_tokens`)."""
        tokens = tables.tokens[self.sentence]
        position = self.progress.clamp(max=tokens.shape[-1] - 1)[:, None, None].expand(-1, tokens.shape[1], 1)
        unmet = ~self.met.gather(1, tables.phrase[self.sentence])
        startable = unmet & (~tables.opens[self.sentence] | may_open[:, None])
        startable &= tables.may_lead[self.sentence] | (not leading)
        firsts = torch.where(startable, tokens[:, :, 0], -1)
        return torch.cat([tokens.gather(2, position).squeeze(2), firsts], dim=1)

    def advance(
        self, tables: ConstraintTables, token: torch.LongTensor, may_open: torch.BoolTensor, leading: bool
    ) -> "ConstraintState":
        """The state after `token` (one per row; `may_open`: whether a word may start before it). A form written
        whole whose phrase waits for the word's end is met if `token` does not go on with that word, else dropped.
        Then `token` continues the form in progress, or a form sharing its start; else it drops the progress and
        may start a form of an unmet phrase. Progress goes one form at a time, so a phrase counts as met only where
        it is a contiguous run of one form's tokens."""
        sentence_phrase = tables.phrase[self.sentence]
        slots = self.met.shape[1]
        met = torch.where(tables.joins(token)[:, None], self.met, self.met_if_the_word_ends(tables))
        progress = torch.where(self.pending(tables), 0, self.progress)
        tokens = tables.tokens[self.sentence]
        unmet = ~met.gather(1, sentence_phrase)
        position = progress.clamp(max=tokens.shape[-1] - 1)[:, None, None].expand(-1, tokens.shape[1], 1)
        shares_prefix = tables.shared_prefix[self.sentence, self.form, :, progress]
        continues = unmet & shares_prefix & (tokens.gather(2, position).squeeze(2) == token[:, None])
        continues &= (progress > 0)[:, None]
        starts = unmet & (tokens[:, :, 0] == token[:, None]) & (~tables.opens[self.sentence] | may_open[:, None])
        starts &= tables.may_lead[self.sentence] | (not leading)
        does_continue = continues.any(-1)
        form = torch.where(does_continue, continues.int().argmax(-1), starts.int().argmax(-1))
        progress = torch.where(does_continue, progress + 1, starts.any(-1).long())
        completes = (progress > 0) & (progress == tables.lengths[self.sentence].gather(1, form[:, None]).squeeze(1))
        completes &= ~tables.closes[self.sentence].gather(1, form[:, None]).squeeze(1)
        phrase = sentence_phrase.gather(1, form[:, None]).squeeze(1)
        met = met | (torch.nn.functional.one_hot(phrase, slots).bool() & completes[:, None])
        sentence_ends = self.sentence_ends + tables.ends_sentence(token).long()
        return ConstraintState(self.sentence, met, form, torch.where(completes, 0, progress), sentence_ends)


def meet_constraints(
    tables: ConstraintTables, sentence: torch.LongTensor, tokens: torch.LongTensor
) -> torch.BoolTensor:
    """Whether each row of `tokens` (generated tokens, `</s>` and padding after them), a hypothesis of sentence
    `sentence`, meets all its constraints, read as the search reads them."""
    state = ConstraintState.start(tables, sentence)
    may_open = torch.ones_like(sentence, dtype=torch.bool)
    for column in tokens.T:  # whatever the model put first stands: `may_lead` is for placing terms only
        state = state.advance(tables, column, may_open, leading=False)
        may_open = ~tables.ends_in_word(column)
    # a hypothesis cut without `</s>` that ends on a phrase's last word: nothing went on with it
    return state.met_if_the_word_ends(tables).all(-1)


def allowed_tokens(
    state: ConstraintState,
    tables: ConstraintTables,
    next_tokens: torch.LongTensor,
    room_left: torch.LongTensor,
    vocab_size: int,
    eos: int,
    may_open: torch.BoolTensor,
    leading: bool,
) -> torch.BoolTensor:
    """(rows, vocabulary): the tokens after which a hypothesis can still meet all its constraints in the room it
    has left (`room_left`: tokens before `</s>` it may still write after this one); `next_tokens` are the state's.
    `</s>` only once all are met.

    Post & Vilar let a hypothesis run out of room; here the last free steps are spent on constraint tokens, so
    every hypothesis that survives meets its constraints."""
    room_left = room_left[:, None]
    # a token that neither continues nor starts a form drops the one in progress; one written whole is met if the
    # token does not go on with its word
    unmet_if_ends = state.unmet_tokens(tables, state.met_if_the_word_ends(tables))[:, None]
    if_joins = state.unmet_tokens(tables)[:, None] <= room_left
    if_ends = unmet_if_ends <= room_left
    vocabulary = torch.arange(vocab_size, device=room_left.device)
    allowed = torch.where(tables.joins(vocabulary)[None, :], if_joins, if_ends)
    if tables.sentence_ends is not None:
        # the translation ends its sentences where the one without constraints did: no term after the last end
        written, most = state.sentence_ends[:, None], tables.sentence_ends[state.sentence][:, None]
        last_too_soon = (written == most - 1) & (unmet_if_ends > 0)
        allowed &= ~(tables.ends_sentence(vocabulary)[None, :] & ((written >= most) | last_too_soon))
    # a slot without a token is checked as `</s>`, whose column is set last
    candidates = torch.where(next_tokens >= 0, next_tokens, eos)
    rows = torch.arange(len(candidates), device=candidates.device).repeat_interleave(candidates.shape[1])
    after = state.select(rows).advance(tables, candidates.flatten(), may_open[rows], leading)
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
    `most` at most), then each bank's second best, and so on. In each round the bank of candidates that have met
    nothing goes first, so that a hypothesis need not start a constraint at once, then the most advanced bank and
    down. A bank without candidates leaves its share to the others; without constraints there is one bank, and this
    is plain top-k."""
    counts = torch.nn.functional.one_hot(banks, most + 1) * eligible[..., None]
    rank_in_bank = counts.cumsum(1).gather(2, banks[..., None]).squeeze(-1) - 1
    stripe = rank_in_bank * (most + 1) + torch.where(banks == 0, 0, most + 1 - banks)
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


def as_phrases(constraints: list[list[Phrase | list[int]]]) -> list[list[Phrase]]:
    """Phrases as given, or token ids made phrases (`Phrase.of_tokens`)."""
    return [[p if isinstance(p, Phrase) else Phrase.of_tokens(list(p)) for p in phrases] for phrases in constraints]


def check_constraints(constraints: list[list[Phrase]], room: list[int], vocab_size: int, settings: Settings) -> None:
    """Bad constraints raise ValueError naming the sentence and the phrase, before any decoding."""
    if len(constraints) != len(room):
        raise ValueError(f"{len(constraints)} constraint lists for {len(room)} sentences")
    for sentence, phrases in enumerate(constraints):
        for phrase in phrases:
            for form in phrase.forms:
                if not form:
                    raise ValueError(f"sentence {sentence}: a constraint has no tokens")
                if any(not 0 <= token < vocab_size or token in (settings.eos, settings.pad) for token in form):
                    raise ValueError(
                        f"sentence {sentence}: constraint {list(form)} has a special token or one out of range"
                    )
        needed = sum(phrase.shortest for phrase in phrases)
        if needed > room[sentence]:
            raise ValueError(
                f"sentence {sentence}: constraints {[phrase.text for phrase in phrases]} need {needed} tokens, but its "
                f"length limit leaves room for {int(room[sentence])}"
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

    def first(self, count: int) -> "Finished":
        """Each sentence's `count` best."""
        index = torch.arange(count, device=self.found.device)[None].expand(len(self.found), -1)
        return Finished(self.hypotheses.take(index), self.lengths[:, :count], self.found[:, :count])

    def keeping(self, kept: torch.BoolTensor) -> "Finished":
        """Only the `kept` hypotheses, each sentence's still best first, the others after them as not found."""
        found = self.found & kept
        order = (~found).int().sort(dim=1, stable=True).indices
        return Finished(self.hypotheses.take(order), self.lengths.gather(1, order), found.gather(1, order))

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
    def start(
        cls, tables: ConstraintTables, chosen: torch.LongTensor, beams: int, settings: Settings, device: torch.device
    ) -> "Running":
        """The beams of sentences `chosen` (their indices into `tables`) before the first step."""
        sentences = len(chosen)
        hypotheses = Hypotheses.empty(sentences, beams, settings, device)
        hypotheses.scores[:, 0] = 0.0  # all beams start alike: only the first is extended, as in transformers
        alive = torch.zeros(sentences, beams, dtype=torch.bool, device=device)
        alive[:, 0] = True
        state = ConstraintState.start(tables, chosen.repeat_interleave(beams))
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
    constraints: list[list[Phrase | list[int]]],
    words: TokenWords | None = None,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    num_return_sequences: int = 1,
    constrained_num_beams: int | None = None,
    length_slack: int | None = 0,
    logits_processor: LogitsProcessorList | None = None,
) -> ConstrainedBeamSearchOutput:
    """Beam search in which every returned hypothesis of sentence i holds each of `constraints[i]` (`Phrase`s from
    `encode_phrases`, matched as their forms and word boundaries say, with `words` the tokenizer's `TokenWords`; or
    lists of token ids, matched as those tokens anywhere), in any order.

    Each sentence is first searched without its constraints: transformers' beam search with `num_beams`,
    `length_penalty` (and `early_stopping`) from the call or the model's generation config, as in `generate()`.
    Where the best hypothesis meets every constraint (or there are none), that search's hypotheses that meet them
    are the result: a translation that already holds its terms is left as it was, and its rows that lack one are
    not returned (`found`). Other sentences are searched again with their constraints on a beam of
    `constrained_num_beams` (default: `constrained_beams` of the constraints' length) by dynamic beam allocation,
    writing at most as many tokens as their translation without constraints had, plus the constraints' tokens and
    `length_slack` (None: no such bound), and ending as many sentences (a full stop, a question mark, ...), the last
    once every constraint is met. Without these bounds a hypothesis that has not placed its terms by the sentence's
    end goes on writing whatever the model finds likely there and tacks them on after it; a slack of 0 was chosen
    on the validation set (BENCHMARKS.md).

    Each sentence ends by Section 6.1's limit, its source length + `max_new_tokens_over_source` tokens (`</s>`
    included), and after `max_new_tokens` (default: as the generation config's `max_length` allows), within
    `max_position_embeddings`. `logits_processor` (processors that read each row's own tokens only, such as
    `AvoidLogitsProcessor`) changes the log-probabilities the search ranks by; other settings of the generation
    config (repetition penalties, forced tokens, ...) are not applied. A sentence whose search is over leaves the
    batch (`generate()` goes on computing it): the others' matrix products then run over fewer rows, which may round
    a score differently in its last bit.

    `</s>` is barred while a hypothesis has unmet constraints, and once the room left is just enough for the
    constraint tokens still missing, only those are allowed, so every hypothesis kept meets its constraints. A
    sentence searched with its constraints starts with no space and writes no special token but `</s>`.
    Constraints that cannot fit in a sentence's limit raise ValueError before any decoding.
    """
    settings = Settings.of(model, num_beams, length_penalty, max_new_tokens)
    if num_return_sequences > settings.num_beams:
        raise ValueError(f"num_return_sequences {num_return_sequences} is more than num_beams {settings.num_beams}")
    constraints = as_phrases(constraints)
    sentences, device = input_ids.shape[0], input_ids.device
    limits = source_limits(model, attention_mask)
    # the most tokens before `</s>`: one fewer than the source rule's limit, or as many as `max_new_tokens`, which
    # cuts a hypothesis without `</s>`
    cap = settings.max_new_tokens
    room = torch.full((sentences,), cap, device=device) if limits is None else (limits - 1).clamp(max=cap)
    check_constraints(constraints, room.tolist(), model.config.vocab_size, settings)
    tables = ConstraintTables.build(constraints, words, device)
    processors = logits_processor or LogitsProcessorList()

    encoder_states = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    everyone = torch.arange(sentences, device=device)
    unconstrained = ConstraintTables.build([[] for _ in range(sentences)], None, device)
    plain = search(model, encoder_states, attention_mask, everyone, unconstrained, room, limits, settings, processors)
    results = plain.first(num_return_sequences)
    tokens = results.hypotheses.sequences[:, :, 1 : int(results.lengths.max()) + 1].flatten(0, 1)
    meets = meet_constraints(tables, everyone.repeat_interleave(num_return_sequences), tokens)
    results = results.keeping(meets.view_as(results.found))
    tables, room = bounded_by(plain, tables, room, length_slack, settings.eos)
    again = [index for index in range(sentences) if constraints[index] and not results.found[index, 0]]
    groups: dict[int, list[int]] = {}
    for index in again:
        beams = constrained_num_beams or constrained_beams(settings.num_beams, int(tables.total_lengths()[index]))
        groups.setdefault(max(beams, num_return_sequences), []).append(index)
    for beams, members in sorted(groups.items()):
        chosen = torch.tensor(members, device=device)
        wider = dataclasses.replace(settings, num_beams=beams)
        found = search(model, encoder_states, attention_mask, chosen, tables, room, limits, wider, processors)
        results.store(chosen, found.first(num_return_sequences))
    return best_hypotheses(results, num_return_sequences)


def bounded_by(
    plain: "Finished", tables: ConstraintTables, room: torch.LongTensor, length_slack: int | None, eos: int
) -> tuple[ConstraintTables, torch.LongTensor]:
    """What each sentence's best translation without constraints (`plain`'s first) bounds in the search with them:
    as many tokens that end a sentence (`ConstraintTables.sentence_ends`), and as many tokens, plus the
    constraints' own and `length_slack` (None: only `room`, the length limit)."""
    best, lengths = plain.hypotheses.sequences[:, 0], plain.lengths[:, 0]
    written = lengths - (best.gather(1, lengths[:, None]).squeeze(1) == eos).long()  # without `</s>`
    generated = torch.arange(1, best.shape[1], device=best.device) <= written[:, None]
    tables = dataclasses.replace(tables, sentence_ends=(tables.ends_sentence(best[:, 1:]) & generated).sum(-1))
    if length_slack is None:
        return tables, room
    return tables, room.minimum(written + tables.total_lengths() + length_slack)


def search(
    model,
    encoder_states: torch.FloatTensor,
    attention_mask: torch.LongTensor,
    chosen: torch.LongTensor,
    tables: ConstraintTables,
    room: torch.LongTensor,
    limits: torch.LongTensor | None,
    settings: Settings,
    processors: LogitsProcessorList,
) -> "Finished":
    """The beam search of the sentences `chosen` (indices into the batch and `tables`; `encoder_states`, the
    encoder's output for the batch), `settings.num_beams` wide: each one's finished hypotheses, best first
    (`update_finished`)."""
    beams, cap, device = settings.num_beams, settings.max_new_tokens, attention_mask.device
    attention_mask, encoder_states = attention_mask[chosen], encoder_states[chosen]
    columns = attention_mask.bool().any(0)  # without the padding no chosen sentence needs
    attention_mask, encoder_states = attention_mask[:, columns], encoder_states[:, columns]
    room, limits = room[chosen], None if limits is None else limits[chosen]
    most = int(tables.total_lengths()[chosen].max())
    constrained = (tables.total_lengths()[chosen] > 0).repeat_interleave(beams)

    encoder_states = encoder_states.repeat_interleave(beams, 0)
    beam_attention_mask = attention_mask.repeat_interleave(beams, 0)
    searching = torch.arange(len(chosen), device=device)  # the sentences still searched, by their index in `chosen`
    running = Running.start(tables, chosen, beams, settings, device)
    finished = Finished.empty(len(chosen), beams, settings, device)
    results = Finished.empty(len(chosen), beams, settings, device)
    may_improve = torch.ones(len(chosen), 1, dtype=torch.bool, device=device)
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
        written = running.hypotheses.sequences.flatten(0, 1)[:, :step]
        if limits is not None:
            log_probs = SourceLengthLimitLogitsProcessor(limits[searching], settings.eos, 1)(written, log_probs)
        log_probs = processors(written, log_probs)
        state = running.state
        may_open = tables.opens_word(written[:, -1])  # where a translator would put a word
        next_tokens = state.next_tokens(tables, may_open, step == 1)
        room_left = room[searching].repeat_interleave(beams) - step
        allowed = allowed_tokens(
            state, tables, next_tokens, room_left, log_probs.shape[-1], settings.eos, may_open, step == 1
        )
        if tables.words is not None:
            # a token that writes nothing would hide where words meet; and no sentence starts with a space, however
            # a phrase is written
            barred = tables.words.silent | (tables.words.starts_with_space & (step == 1))
            allowed &= ~(constrained[:, None] & barred[None, : log_probs.shape[-1]])
        log_probs = log_probs.masked_fill(~allowed, -math.inf).view(len(searching), beams, -1)
        scores = running.hypotheses.scores[..., None] + log_probs
        candidates = step_candidates(scores, log_probs, next_tokens, running.alive)
        count = candidates.token.shape[1]

        row_offset = torch.arange(len(searching), device=device)[:, None] * beams
        rows = (row_offset + candidates.beam).flatten()
        candidate_state = state.select(rows).advance(tables, candidates.token.flatten(), may_open[rows], step == 1)
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

        banks = tables.total_lengths()[chosen[searching], None] - candidate_state.need(tables).view_as(candidates.token)
        picked = allocate_beam(banks, candidates.valid & ~ends, beams, most)
        # a hypothesis that ended goes on only to fill the beam, ranked last (transformers' running beams)
        running_scores = candidates.score + ends * BEAM_SEARCH_PENALTY
        picked = picked.gather(1, running_scores.gather(1, picked).sort(dim=1, descending=True, stable=True).indices)
        kept = candidates.take(picked)
        running = Running(
            running.hypotheses.extended(kept, step, running_scores.gather(1, picked)),
            (candidates.valid & ~ends).gather(1, picked),
            candidate_state.select((row_offset // beams * count + picked).flatten()),
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
            constrained = constrained[rows]
            searching, running, finished, may_improve = (
                searching[go_on],
                running.sentences(go_on),
                finished.sentences(go_on),
                may_improve[go_on],
            )
    return results


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
    best = finished.first(count).hypotheses
    found = finished.found[:, :count].flatten()
    longest = int(finished.lengths[:, :count].flatten()[found].max()) if found.any() else 0
    return ConstrainedBeamSearchOutput(
        sequences=best.sequences.flatten(0, 1)[:, : longest + 1],
        sequences_scores=best.scores.flatten().masked_fill(~found, -math.inf),
        token_log_probs=best.token_log_probs.flatten(0, 1)[:, :longest],
        log_prob_sums=best.token_log_probs.flatten(0, 1).sum(-1).masked_fill(~found, -math.inf),
        found=found,
    )
