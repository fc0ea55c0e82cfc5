"""Translation with CTranslate2 from a folder written by `vanilla-export-ctranslate2` (export/ctranslate2.py):
`ctranslate2.Translator`'s `translate_batch` with the model's decoding and its own options for what `Steering` asks
(n-best lists, prefixes, sampling, the attention for alignments), `score_batch` for the tokens' log-probabilities.
The weights' types it converts to (`QUANTIZATIONS`) are the engine's; the export reads them here.
"""

import functools
import itertools
import os

import torch

from hf_vanilla_transformer.decoding.alignment import DEFAULT_METHOD, most_attended, token_words, word_attention
from hf_vanilla_transformer.decoding.avoid import ctranslate2_suppress_sequences
from hf_vanilla_transformer.decoding.forced_decoding import scored_pairs
from hf_vanilla_transformer.decoding.prefix import prefix_token_ids
from hf_vanilla_transformer.decoding.request import Hypothesis, Steering
from hf_vanilla_transformer.engines.base import Translator
from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.formats import is_ctranslate2_folder
from hf_vanilla_transformer.hardware import check_device
from hf_vanilla_transformer.loading import load_tokenizer, max_positions
from hf_vanilla_transformer.model.modeling_vanilla_transformer import max_new_tokens_over_source_of
from hf_vanilla_transformer.model.pipeline_translation import scored

# the weights' types CTranslate2 converts to (its converters' `quantization`)
QUANTIZATIONS = ("float32", "int8", "int8_float32", "float16", "int8_float16", "bfloat16", "int8_bfloat16")
# CTranslate2's compute_type: the weights' type as saved (default), the fastest this device has (auto), or one named
COMPUTE_TYPES = ("default", "auto", *QUANTIZATIONS)


class CTranslate2Translator(Translator):
    """Translation with `ctranslate2.Translator`, decoding as the model's generation config says (for ours the
    paper's: beam 4, length penalty 0.6, at most the source length + 50 tokens, which `max_new_tokens` caps).
    CTranslate2 takes one length limit per call, so a batch decodes up to its longest sentence's limit and each
    translation is then cut to its own: exactly what generate() gives for greedy decoding; a beam that reaches the
    limit may differ.
    n-best lists, prefixes, sampling, phrases to avoid (`suppress_sequences`) and the attention for alignments are
    CTranslate2's own `translate_batch` options; the tokens' log-probabilities come from its `score_batch`, and the
    score is made from them as on every route (a prefix's tokens count), the list re-ranked by it. Constraints and
    ensembles it has not."""

    engine = "CTranslate2"
    folder = "a CTranslate2 folder"
    folders = "CTranslate2 folders"
    precision = "compute_type"
    features = frozenset({"n_best", "scores", "alignments", "prefixes", "avoid"})
    decoding = Translator.decoding | Translator.sampling
    scoring = frozenset({"scores"})
    options = frozenset({"compute_type", "inter_threads", "intra_threads"})

    @classmethod
    def reads(cls, path: str) -> bool:
        return is_ctranslate2_folder(path)

    @classmethod
    def loader(cls, paths: list[str], device: str | None, threads: int | None, options: dict):
        """`threads` is the default inter_threads."""
        options = {"inter_threads": threads, **options}
        ctranslate2_device(device, options.get("compute_type", "default"))
        return functools.partial(cls, paths[0], device, **options)

    def __init__(
        self,
        model_path: str,
        device: str | None,
        compute_type: str = "default",
        inter_threads: int | None = None,
        intra_threads: int | None = None,
    ):
        from transformers import GenerationConfig

        device = ctranslate2_device(device, compute_type)
        import ctranslate2  # found by ctranslate2_device, or it says which extra installs it

        self.tokenizer = load_tokenizer(model_path)
        generation = GenerationConfig.from_pretrained(model_path)
        self.max_positions = max_positions(generation, model_path)
        self.num_beams = generation.num_beams or 1
        # generate()'s default where the generation config sets none (a new model's does not)
        self.length_penalty = 1.0 if generation.length_penalty is None else generation.length_penalty
        self.max_new_tokens_over_source = max_new_tokens_over_source_of(generation)
        # tokens the generation config never lets generate() write (`suppress_tokens`), as CTranslate2 names them
        suppressed = self.tokenizer.convert_ids_to_tokens(generation.suppress_tokens or [])
        self.suppress_sequences = [[token] for token in suppressed]
        self.avoiding: dict[tuple, list[list[str]]] = {}
        # on a CPU, one batch per core, each on one thread, beats all cores on one batch (BENCHMARKS.md has the
        # figures); a call hands over several batches so that every worker has one
        on_cpu = device.type == "cpu"
        inter_threads = inter_threads or (os.cpu_count() if on_cpu else 1)
        intra_threads = intra_threads or (1 if on_cpu else 0)
        self.batches_per_call = 2 * inter_threads
        # CTranslate2 names a device by its type and index apart: cuda:1 is device="cuda", device_index=1
        self.translator = ctranslate2.Translator(
            model_path,
            device=device.type,
            device_index=device.index or 0,
            compute_type=compute_type,
            inter_threads=inter_threads,
            intra_threads=intra_threads,
        )

    @staticmethod
    def set_seed(seed: int) -> None:
        import ctranslate2

        ctranslate2.set_random_seed(seed)

    def hypotheses(
        self,
        sentences: list[str],
        batch_size: int,
        steering: Steering,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_new_tokens: int | None = None,
        do_sample: bool = False,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float | None = None,
    ):
        ids = self.tokenizer(sentences, truncation=True, max_length=self.max_positions)["input_ids"]
        # the most tokens of each translation, `</s>` not counted (CTranslate2 returns none): where Section 6.1's
        # limit ends a translation, its last token is the `</s>` generate() forces there; `max_new_tokens` cuts
        # where it comes first, `</s>` or not, as generate() does
        forced_end = 1 if self.max_new_tokens_over_source is not None else 0
        limits = [limit - forced_end for limit in self.length_limits([len(source) for source in ids])]
        limits = [min(limit, max_new_tokens or limit) for limit in limits]
        source_tokens = [self.tokenizer.convert_ids_to_tokens(source) for source in ids]
        # sampling draws from the whole distribution unless top_k narrows it (CTranslate2's default, 1, is greedy)
        sampling = (
            {"sampling_topk": top_k or 0, "sampling_topp": top_p or 1.0, "sampling_temperature": temperature or 1.0}
            if do_sample
            else {}
        )
        prefixes = None
        if steering.prefixes is not None:
            prefixes = [
                self.tokenizer.convert_ids_to_tokens(p) for p in prefix_token_ids(self.tokenizer, steering.prefixes)
            ]
        options = dict(
            beam_size=1 if do_sample else num_beams or self.num_beams,
            num_hypotheses=steering.n_best,
            length_penalty=self.length_penalty if length_penalty is None else length_penalty,
            max_decoding_length=max(limits),
            max_batch_size=batch_size,
            return_scores=steering.scores,
            return_attention=steering.alignments,
            suppress_sequences=self.suppress_sequences + self.avoid_sequences(steering) or None,
            **sampling,
        )
        # in a beam search over sources of different lengths, CTranslate2's attention of the first target token
        # weighs the padding: for alignments, each call holds sources of one length (the lines come sorted by it)
        groups = [len(source) for source in source_tokens] if steering.alignments else [0] * len(source_tokens)
        results = []
        for _, members in itertools.groupby(range(len(source_tokens)), key=groups.__getitem__):
            members = list(members)
            results += self.translator.translate_batch(
                [source_tokens[i] for i in members],
                target_prefix=None if prefixes is None else [prefixes[i] for i in members],
                **options,
            )
        outputs = [
            [tokens[:limit] for tokens in result.hypotheses] for result, limit in zip(results, limits, strict=True)
        ]
        flat = [Hypothesis(self.decode(tokens)) for hypotheses in outputs for tokens in hypotheses]
        sources = [source for source, hypotheses in zip(source_tokens, outputs, strict=True) for _ in hypotheses]
        targets = [tokens for hypotheses in outputs for tokens in hypotheses]
        if steering.scores:
            # the score of every route: the whole translation's log-probability (a prefix's tokens and `</s>`
            # included) over its length to the power of the length penalty; CTranslate2 ranks without the prefix
            penalty = options["length_penalty"]
            given = self.translator.score_batch(sources, targets, max_batch_size=batch_size)
            flat = [
                hypothesis.scored(
                    scored(self.tokenizer.convert_tokens_to_ids(result.tokens), list(result.log_probs), penalty),
                    result.tokens,
                )
                for hypothesis, result in zip(flat, given, strict=True)
            ]
        if steering.alignments:
            attention = [weights for result in results for weights in result.attention]
            for hypothesis, source, target, weights in zip(flat, sources, targets, attention, strict=True):
                hypothesis.alignment = token_attention_alignment(self.tokenizer, source, target, weights)
        found, start = [], 0
        for hypotheses in outputs:
            found.append(flat[start : start + len(hypotheses)])
            start += len(hypotheses)
        if steering.scores:  # best first by the score given
            found = [sorted(hypotheses, key=lambda h: -h.score) for hypotheses in found]
        return found

    def score(
        self,
        sources: list[str],
        targets: list[str] | list[list[int]],
        batch_size: int,
        names: tuple[str, str] = ("sources", "targets"),
        length_penalty: float | None = None,
    ):
        """`Translator.score` by CTranslate2's `score_batch`, several batches a call, as its threads take them."""
        forced = functools.partial(ctranslate2_forced_decoding, self.translator, self.tokenizer, batch_size)
        length_penalty = self.length_penalty if length_penalty is None else length_penalty
        chunk_size = batch_size * self.batches_per_call
        return scored_pairs(
            self.tokenizer, sources, targets, self.max_positions, chunk_size, forced, length_penalty, names
        )

    def avoid_sequences(self, steering: Steering) -> list[list[str]]:
        """The token sequences that bar `steering.avoid` (`ctranslate2_suppress_sequences`), built once per list."""
        if not steering.avoid:
            return []
        key = (tuple(steering.avoid), steering.constraint_match)
        if key not in self.avoiding:
            self.avoiding[key] = ctranslate2_suppress_sequences(
                self.tokenizer, steering.avoid, steering.constraint_match, self.token_words
            )
        return self.avoiding[key]

    def decode(self, tokens: list[str]) -> str:
        return self.tokenizer.decode(self.tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True)


def token_attention_alignment(tokenizer, source: list[str], target: list[str], weights: list[list[float]]):
    """Word alignment of a source and a translation, both as tokens (`source` ending in `</s>`), from one attention
    matrix between them (a row per target token, a column per source token: CTranslate2's `return_attention`),
    turned into words as decoding/alignment.py turns our model's attention."""

    words = []
    for tokens in (source, target):
        ids = tokenizer.convert_tokens_to_ids(tokens)
        # each token's span in the decoded text: what decoding it adds
        ends = [len(tokenizer.decode(ids[: end + 1], skip_special_tokens=True)) for end in range(len(ids))]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        words.append((token_words(text, list(zip([0, *ends[:-1]], ends, strict=True))), len(text.split())))
    (source_words, source_count), (target_words, target_count) = words
    attention = torch.tensor(weights)[None, None, : len(target)]  # one layer, one head: CTranslate2's average
    pooled = word_attention(attention, source_words, target_words, (source_count, target_count))
    return most_attended(pooled.of(0, None, "predicting"), DEFAULT_METHOD)


def ctranslate2_device(device: str | None, compute_type: str):
    """The device CTranslate2 is to run on (`device`; default: cuda if it finds one, else cpu) as a torch.device,
    refused where CTranslate2 is not installed, finds no such device or cannot compute in `compute_type` there."""
    ctranslate2 = require("ctranslate2", "translating a CTranslate2 folder")
    cuda_devices = ctranslate2.get_cuda_device_count()
    engine = f"CTranslate2 {ctranslate2.__version__}"
    device = check_device(
        device or ("cuda" if cuda_devices else "cpu"), engine, "cuda" if cuda_devices else None, cuda_devices
    )
    supported = ctranslate2.get_supported_compute_types(device.type, device.index or 0)
    if compute_type not in ("default", "auto", *supported):
        types = ", ".join(sorted(supported))
        raise ValueError(f"compute_type {compute_type}: {engine} computes in {types} on this {device.type}")
    return device


def ctranslate2_forced_decoding(
    translator, tokenizer, batch_size: int, pairs: list[tuple[list[int], list[int]]]
) -> list[tuple[list[int], list[float]]]:
    """`forced_decoding` by `ctranslate2.Translator.score_batch`, `batch_size` pairs a batch. CTranslate2 starts
    the target from `<s>` and appends `</s>` itself, so the target goes without its own; the tokens scored are
    those CTranslate2 reports."""
    eos = tokenizer.eos_token_id
    results = translator.score_batch(
        [tokenizer.convert_ids_to_tokens(source) for source, _ in pairs],
        [tokenizer.convert_ids_to_tokens(target[:-1] if target[-1] == eos else target) for _, target in pairs],
        max_batch_size=batch_size,
        max_input_length=0,  # no truncation: the lengths were checked against the model's positions
    )
    return [(tokenizer.convert_tokens_to_ids(result.tokens), list(result.log_probs)) for result in results]
