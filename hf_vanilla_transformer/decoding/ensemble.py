"""Ensembles of trained models that translate together: one model for transformers' `generate()` whose every
decoding step scores each next token by the mean of its members' log-probabilities.

    ensemble, tokenizer = load_ensemble(["runs/multi30k-small-seed1", "runs/multi30k-small-seed2"])
    batch = tokenizer(["A man is sleeping."], return_tensors="pt", padding=True)
    ids = ensemble.generate(**batch, logits_processor=ensemble.length_limit_processors(batch))

The members share one vocabulary and its special tokens; their sizes may differ. The paper ensembles no
Transformers (its Table 2 lists other models' ensembles); the mean of log-probabilities is Marian's way (a weighted
sum, weights 1 by default), fairseq's is the mean of probabilities. That mean of log-probabilities is not
normalised: its exponential, the geometric mean of the members' distributions, sums to at most one (less where
they disagree), and generate() renormalises it (beam search takes the log-softmax of the logits, sampling their
softmax), so both decode from that geometric mean renormalised; greedy search picks the same token either way.

How it fits `generate()`, which it does not override:
- the encoder (`get_encoder()`) returns one `BaseModelOutput` whose `last_hidden_state` is the members' encoder
  outputs side by side along the hidden dimension, which transformers repeats for the beams as it does any
  encoder output; each decoding step splits it back, one slice per member;
- each member keeps its own decoder cache; the model's output holds them together in an `EnsembleCache`, which
  generate() hands back at the next step and reorders after each beam search step through `reorder_cache`;
- Section 6.1's length rule (each sentence ends by its source length + `max_new_tokens_over_source` tokens), which
  our model's own `generate()` adds, is for the ensemble a logits processor that callers pass:
  `logits_processor=ensemble.length_limit_processors(batch)`.
"""

import copy
import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from hf_vanilla_transformer.loading import load_model_and_tokenizer, load_tokenizer
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    CACHE_NAME,
    VanillaTransformerForConditionalGeneration,
    accepts_both_cache_names,
    source_length_limit,
)

# what the members of an ensemble must agree on: each step averages distributions over the same token ids
SHARED_CONFIG = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
SHARED_TOKENIZER_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")
MEMBERS_SHARE = "an ensemble's members share one vocabulary and its special tokens"


def config_difference(first, other) -> str | None:
    """What two members' configs disagree on among `SHARED_CONFIG`, as "name (first vs other)"; None if nothing."""
    for name in SHARED_CONFIG:
        if getattr(first, name) != getattr(other, name):
            return f"{name} ({getattr(first, name)} vs {getattr(other, name)})"
    return None


def tokenizer_difference(first, other) -> str | None:
    """What two members' tokenizers disagree on: their vocabularies (token to id) or special token ids."""
    first_vocab, other_vocab = first.get_vocab(), other.get_vocab()
    if first_vocab != other_vocab:
        only_first = sorted(set(first_vocab.items()) - set(other_vocab.items()))
        example = f", e.g. {only_first[0][0]!r} = {only_first[0][1]} only in the first" if only_first else ""
        return f"tokenizer vocab ({len(first_vocab)} vs {len(other_vocab)} tokens{example})"
    for name in SHARED_TOKENIZER_IDS:
        if getattr(first, name) != getattr(other, name):
            return f"tokenizer {name} ({getattr(first, name)} vs {getattr(other, name)})"
    return None


class EnsembleCache:
    """The members' decoder caches, one each (an `EncoderDecoderCache` per member), which generate() carries from
    one step to the next as the model's cache. Beam search reorders it after each step with `reorder_cache`
    (the ensemble has no `_reorder_cache`), which reaches every member's cache through its public method."""

    # generate() on Apple's mps may defer its stop check by a step and crop a returned cache back afterwards; these
    # caches are not cropped, so it must not
    is_croppable = False

    def __init__(self, members: list[Cache]):
        self.members = members

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for cache in self.members:
            cache.reorder_cache(beam_idx)

    @property
    def self_attention_cache(self) -> "EnsembleCache":
        """The members' self-attention caches, reordered together (as `EncoderDecoderCache` offers its own)."""
        return EnsembleCache([cache.self_attention_cache for cache in self.members])

    @property
    def cross_attention_cache(self) -> "EnsembleCache":
        return EnsembleCache([cache.cross_attention_cache for cache in self.members])


class EnsembleEncoder(nn.Module):
    """The members' encoders on the same source, their outputs side by side along the hidden dimension (member i's
    `d_model` features after those of the members before it): one tensor, which generate() expands for beams and
    returned sequences as it expands any encoder output."""

    main_input_name = "input_ids"

    def __init__(self, encoders: Sequence[nn.Module]):
        super().__init__()
        self.encoders = nn.ModuleList(encoders)

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
    ) -> BaseModelOutput:
        """`output_attentions` and `output_hidden_states` are refused: the members' layers and heads differ, so an
        ensemble has none of its own (ask a member, `ensemble.members[i]`). `return_dict` is generate()'s: the
        output is always a `BaseModelOutput`."""
        refuse_member_details(output_attentions, output_hidden_states)
        states = [encoder(input_ids=input_ids, attention_mask=attention_mask)[0] for encoder in self.encoders]
        return BaseModelOutput(last_hidden_state=torch.cat(states, dim=-1))


def refuse_member_details(output_attentions: bool | None, output_hidden_states: bool | None) -> None:
    if output_attentions or output_hidden_states:
        raise ValueError(
            "an ensemble has no attentions or hidden states of its own (its members' layers differ): "
            "ask a member, ensemble.members[i]"
        )


class TranslationEnsemble(nn.Module, GenerationMixin):
    """Models with one vocabulary and its special tokens that decode as one: at each step the mean of their
    log-probabilities, which `forward` returns as the logits (see the module's docstring for how generate()
    renormalises it). Every generate() strategy that needs nothing but the logits and a reorderable cache works:
    greedy and beam search (with `num_return_sequences`), sampling, `output_scores`, `output_logits`,
    `return_dict_in_generate` and `compute_transition_scores`.

    `config` is a copy of the first member's, which generate() reads the shared special tokens from, with
    `max_position_embeddings` the smallest of the members'; `generation_config` is a copy of the first member's:
    its decoding (beam, length penalty) is the ensemble's. Section 6.1's length rule is `length_limit_processors`.
    """

    main_input_name = "input_ids"
    base_model_prefix = ""  # no base model: generate() finds the encoder as `encoder`, the first place it looks

    def __init__(self, members: Sequence[VanillaTransformerForConditionalGeneration]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        for index, member in enumerate(members[1:], start=1):
            difference = config_difference(members[0].config, member.config)
            if difference:
                raise ValueError(f"members 0 and {index} differ in {difference}: {MEMBERS_SHARE}")
        self.members = nn.ModuleList(members)
        self.encoder = EnsembleEncoder([member.get_encoder() for member in members])
        self.hidden_sizes = [member.config.d_model for member in members]
        self.config = copy.deepcopy(members[0].config)
        self.config.max_position_embeddings = min(member.config.max_position_embeddings for member in members)
        self.generation_config = copy.deepcopy(members[0].generation_config)

    @property
    def device(self) -> torch.device:
        return self.members[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.members[0].dtype

    def is_remote_code(self) -> bool:
        """generate() asks; the ensemble is this package's code, not a Hub folder's."""
        return False

    def get_experts_implementation(self) -> dict[str, str | None]:
        """generate() asks, to switch a mixture of experts' kernels while decoding; the members have no experts."""
        return self.members[0].get_experts_implementation()

    def get_encoder(self) -> EnsembleEncoder:
        return self.encoder

    @accepts_both_cache_names
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: EnsembleCache | Cache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
    ) -> Seq2SeqLMOutput:
        r"""
        The mean over members of log_softmax(member logits), as `logits`, and the members' caches as one
        `EnsembleCache` (under transformers' name for the cache, `CACHE_NAME`).

        encoder_outputs: the ensemble encoder's output (`get_encoder()`), as generate() passes it; computed from
            `input_ids` when not given.
        cache: an `EnsembleCache` from an earlier step to continue from. The empty cache generate() prepares for
            the first step is of transformers' kind, one for one model: the members then start caches of their own.
        Other arguments as in `VanillaTransformerForConditionalGeneration.forward`; `output_attentions` and
        `output_hidden_states` are refused (the members' layers differ), `return_dict` is generate()'s: the output
        is always a `Seq2SeqLMOutput`.
        """
        refuse_member_details(output_attentions, output_hidden_states)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        encoder_states = encoder_outputs[0]
        log_probs, caches = [], []
        for member, states, member_cache in zip(
            self.members, encoder_states.split(self.hidden_sizes, dim=-1), self.member_caches(cache), strict=True
        ):
            output = member(
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask,
                encoder_outputs=BaseModelOutput(last_hidden_state=states),
                cache=member_cache,
                use_cache=use_cache,
            )
            log_probs.append(output.logits.float().log_softmax(-1))
            caches.append(getattr(output, CACHE_NAME))
        ensemble_cache = EnsembleCache(caches) if all(cache is not None for cache in caches) else None
        return Seq2SeqLMOutput(
            logits=torch.stack(log_probs).mean(0),
            encoder_last_hidden_state=encoder_states,
            **{CACHE_NAME: ensemble_cache},
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """The decoder's input for teacher forcing on `labels`, the same for every member (`SHARED_CONFIG`)."""
        return self.members[0].prepare_decoder_input_ids_from_labels(labels=labels)

    def member_caches(self, cache: EnsembleCache | Cache | None) -> list[Cache | None]:
        """Each member's cache to continue from: those of an `EnsembleCache`, or none (a fresh start), for no
        cache or the empty one generate() prepares for a single model's first step."""
        if isinstance(cache, EnsembleCache):
            return cache.members
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError(
                f"an ensemble continues only from its own EnsembleCache, not from a {type(cache).__name__} that "
                "already holds steps: each member keeps a cache of its own"
            )
        return [None] * len(self.members)

    def length_limit_processors(
        self, batch: Mapping, generation_config: GenerationConfig | None = None
    ) -> LogitsProcessorList:
        """Section 6.1's length rule for `self.generate(**batch, ...)`, to pass as its `logits_processor`: each
        sentence of `batch` (the tokenizer's output; its `decoder_input_ids` too, if generate() gets them) may
        produce at most its source length + `max_new_tokens_over_source` tokens, `</s>` included, the setting and
        `</s>` taken from `generation_config` if it has them, else from the ensemble's. It is the processor our
        model's own `generate()` adds, with the same limits; empty when the setting is None (no such rule).

        A function rather than part of generate(), which the ensemble does not override: transformers' generate()
        offers no other way for a model to add a processor of its own.
        """
        limit = source_length_limit(self, batch.get("input_ids"), generation_config, dict(batch))
        return LogitsProcessorList([] if limit is None else [limit])

    def source_length_limit(
        self, batch: Mapping, generation_config: GenerationConfig | None = None
    ) -> LogitsProcessorList:
        """The former name of `length_limit_processors`, kept for one release (CHANGELOG.md)."""
        warnings.warn(
            "TranslationEnsemble.source_length_limit is now length_limit_processors; the old name goes in the next "
            "release",
            FutureWarning,
            stacklevel=2,
        )
        return self.length_limit_processors(batch, generation_config)


class MembersDiffer(ValueError):
    """Models that cannot decode together: the message names both folders and what differs."""


def check_members(folders: Sequence[str]) -> None:
    """Refuses (`MembersDiffer`) folders whose tokenizers (vocabulary, special token ids) or configs
    (`SHARED_CONFIG`) differ, from their tokenizer and config files alone, before any weights are read."""
    from transformers import AutoConfig

    first_tokenizer, first_config = load_tokenizer(folders[0]), AutoConfig.from_pretrained(folders[0])
    for folder in folders[1:]:
        difference = tokenizer_difference(first_tokenizer, load_tokenizer(folder)) or config_difference(
            first_config, AutoConfig.from_pretrained(folder)
        )
        if difference:
            raise MembersDiffer(f"{folders[0]} and {folder} differ in {difference}: {MEMBERS_SHARE}")


def load_ensemble(folders: Sequence[str], device: str | None = None, dtype=None):
    """The ensemble of the models in `folders` (loaded as `load_model_and_tokenizer` loads one, on `device` and in
    `dtype`) and the first folder's tokenizer; folders that cannot decode together are refused first
    (`check_members`)."""
    if not folders:
        raise ValueError("an ensemble needs at least one model folder")
    check_members(folders)
    models, tokenizers = zip(*(load_model_and_tokenizer(folder, device, dtype) for folder in folders), strict=True)
    return TranslationEnsemble(list(models)).eval(), tokenizers[0]  # evaluation mode, as each member is loaded
