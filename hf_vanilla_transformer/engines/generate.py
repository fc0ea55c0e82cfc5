"""Our model's own engine: translation with its `generate()`, or an ensemble's (decoding/ensemble.py), steered by
the decoding features of decoding/ (prefixes, constraints, phrases to avoid, scores, alignments)."""

import copy
import functools
import logging

import torch
from transformers.generation import LogitsProcessorList

from hf_vanilla_transformer.decoding.alignment import align
from hf_vanilla_transformer.decoding.avoid import AvoidLogitsProcessor
from hf_vanilla_transformer.decoding.forced_decoding import (
    exact_scores_need_same_shapes,
    forced_decoding,
    score_translations,
    scored_ids,
)
from hf_vanilla_transformer.decoding.prefix import PrefixLogitsProcessor, prefix_token_ids
from hf_vanilla_transformer.decoding.request import Hypothesis, Steering
from hf_vanilla_transformer.decoding.words import TokenWords, encode_phrases
from hf_vanilla_transformer.engines.base import Translator
from hf_vanilla_transformer.hardware import check_torch_device, cpu_has_bf16_units, default_device
from hf_vanilla_transformer.loading import device_memory, load_model_and_tokenizer
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    max_new_tokens_over_source_of,
    source_length_limit,
)
from hf_vanilla_transformer.model.pipeline_translation import generated_length

logger = logging.getLogger("vanilla-translate")

# the memory one search may hold (`ModelTranslator.search_bytes`): a batch of sentences with many hypotheses each
# (--n_best 1000) is searched a few sentences at a time
SEARCH_MEMORY = 2**30


class ModelTranslator(Translator):
    """Translation with the model's `generate()` (several models: an ensemble, decoding/ensemble.py), one batch at a
    time: prefixes through a logits processor (decoding/prefix.py), constraints by constrained beam search
    (decoding/constraints.py), scores by forced decoding of each translation's tokens (decoding/forced_decoding.py,
    as `vanilla-score` computes them), alignments from the encoder-decoder attention of each translation
    (decoding/alignment.py), read from an eager copy of the model so that the translation stays the one the model's
    own attention path gives."""

    engine = "generate()"
    folder = "a model folder"
    folders = "model folders"
    precision = "dtype"
    ensembles = True
    features = frozenset({"n_best", "scores", "alignments", "prefixes", "constraints", "avoid"})
    decoding = Translator.decoding | Translator.sampling
    scoring = frozenset({"scores", "alignments"})
    options = frozenset({"dtype"})

    @classmethod
    def reads(cls, path: str) -> bool:
        return True  # any folder the other engines do not read: loading says what is wrong with it

    @classmethod
    def loader(cls, paths: list[str], device: str | None, threads: int | None, options: dict):
        """The model in `options`' dtype (default "auto", `translation_dtype`); `threads` are torch's, which the
        command sets."""
        check_torch_device(default_device(device))
        return functools.partial(cls, paths, device, translation_dtype(options.get("dtype", "auto"), device))

    def __init__(self, model_paths: str | list[str], device: str | None, dtype=None):
        model_paths = [model_paths] if isinstance(model_paths, str) else model_paths
        if len(model_paths) > 1:
            from hf_vanilla_transformer.decoding.ensemble import load_ensemble

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
        (length,) = self.length_limits([source_length])
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
            from hf_vanilla_transformer.decoding.constraints import constrained_beams

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
            from hf_vanilla_transformer.decoding.constraints import constrained_beam_search

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

    def score(
        self,
        sources: list[str],
        targets: list[str] | list[list[int]],
        batch_size: int,
        names: tuple[str, str] = ("sources", "targets"),
        length_penalty: float | None = None,
    ):
        """`Translator.score` by the model's forced decoding (an ensemble's: the mean of its members'
        log-probabilities, renormalised, as it decodes)."""
        return score_translations(self.model, self.tokenizer, sources, targets, batch_size, length_penalty, names)

    def align(self, sources: list[str], targets: list[str], batch_size: int) -> list[list[tuple[int, int]]]:
        return align(self.aligner, self.tokenizer, sources, targets, batch_size=batch_size)

    def within_positions(self, sentence: str) -> str:
        """The start of `sentence` that its tokens within the model's positions hold (the sentence itself where it
        fits): what is translated of it."""
        offsets = self.tokenizer(sentence, truncation=True, max_length=self.max_positions, return_offsets_mapping=True)
        ends = [end for start, end in offsets["offset_mapping"] if end > start]
        return sentence[: ends[-1]] if ends and len(offsets["input_ids"]) >= self.max_positions else sentence


def translation_dtype(name: str, device: str | None) -> torch.dtype:
    """The dtype to load a model in for translating on `device` (None: cuda if available). "auto" is bfloat16 on a
    CPU with bfloat16 units, where generate() ran faster than in float32 at the same test BLEU (BENCHMARKS.md,
    "bfloat16 on a CPU with bf16 units"), and float32 elsewhere (not measured faster at equal BLEU)."""
    if name != "auto":
        return getattr(torch, name)
    on_cpu = default_device(device).startswith("cpu")
    return torch.bfloat16 if on_cpu and cpu_has_bf16_units() else torch.float32
