"""`Translator`: what every engine offers its callers and declares it can do. Callers use these methods and
declarations alone, never an engine's type (engines/registry.py picks the engine for a folder)."""

import functools
import warnings
from collections.abc import Callable

import torch

from hf_vanilla_transformer.decoding.request import Hypothesis, Steering
from hf_vanilla_transformer.decoding.words import TokenWords
from hf_vanilla_transformer.model.modeling_vanilla_transformer import length_limits
from hf_vanilla_transformer.model.pipeline_translation import SequenceScore


class Translator:
    """What every kind of folder's translator offers: `hypotheses` (the n best of each sentence, as `steering`
    asks), `translate` (the best one's text), `score` (the model's score of given translations) and `align` (their
    word alignments).

    Each engine declares what it is and what it can do, so that anything else is refused before work
    (engines/registry.py): `engine` names it in messages, `folder` the kind of folder it reads and `folders` the
    same in the plural, `precision` the option that picks its precision (None: none); `ensembles` whether several
    folders decode together; `features` what `Steering` may ask of it, `decoding` the generate() settings it takes,
    `scoring` what it gives of given translations ("scores", "alignments"), `options` the loading options it takes
    beyond device and threads. Every engine sets `tokenizer`, `max_positions`, `max_new_tokens_over_source`
    and `num_beams` as its folder says, and `length_penalty` where it searches with beams."""

    engine: str
    folder: str
    folders: str
    precision: str | None = None
    ensembles = False
    batches_per_call = 1
    features: frozenset[str] = frozenset()
    decoding: frozenset[str] = frozenset({"num_beams", "length_penalty", "max_new_tokens"})
    sampling = frozenset({"do_sample", "top_k", "top_p", "temperature"})  # generate()'s names, for those that sample
    scoring: frozenset[str] = frozenset()
    options: frozenset[str] = frozenset()

    @classmethod
    def reads(cls, path: str) -> bool:
        """Whether `path` is a folder of this engine's format."""
        raise NotImplementedError

    @classmethod
    def loader(
        cls, paths: list[str], device: str | None, threads: int | None, options: dict
    ) -> Callable[[], "Translator"]:
        """A function that loads the translator of `paths` with the `options` it declares, after refusing what can
        be refused without loading (a device this machine lacks, a missing package)."""
        raise NotImplementedError

    def hypotheses(
        self, sentences: list[str], batch_size: int, steering: Steering, **generate_kwargs
    ) -> list[list[Hypothesis]]:
        raise NotImplementedError

    def translate(self, sentences: list[str], batch_size: int, **generate_kwargs) -> list[str]:
        return [found[0].text for found in self.hypotheses(sentences, batch_size, Steering(), **generate_kwargs)]

    def score(
        self,
        sources: list[str],
        targets: list[str] | list[list[int]],
        batch_size: int,
        names: tuple[str, str] = ("sources", "targets"),
        length_penalty: float | None = None,
    ) -> list[SequenceScore]:
        """The model's score of each target as the translation of the source on the same line (forced decoding,
        decoding/forced_decoding.py). `targets` are a translation a line, tokenized anew as training tokenizes
        labels, or each one's token ids as a translator wrote them (`</s>` included where it ended), scored as they
        are. `length_penalty` (default: the folder's generation config's) makes `score`; errors name the lines as
        `names` (of sources, targets) say. Where "scores" is in `scoring`."""
        raise ValueError(f"{self.engine} cannot give scores of given translations; score the model folder instead")

    def align(self, sources: list[str], targets: list[str], batch_size: int) -> list[list[tuple[int, int]]]:
        """The word alignment of each target with the source on the same line (decoding/alignment.py). Where
        "alignments" is in `scoring`."""
        raise ValueError(f"{self.engine} cannot align given translations; align with the model folder instead")

    @staticmethod
    def set_seed(seed: int) -> None:
        """Seeds the random numbers sampling draws (Python's, NumPy's and torch's), so that a seed gives the same
        samples again; called before the translator is made (CTranslate2 seeds its workers as it starts them)."""
        from transformers import set_seed

        set_seed(seed)

    def length_limits(self, source_lengths: list[int], max_new_tokens: int | None = None) -> list[int]:
        """Section 6.1's limit of each source length (`length_limits`) with the folder's settings."""
        lengths = torch.tensor(source_lengths, dtype=torch.long)
        return length_limits(lengths, self.max_positions, self.max_new_tokens_over_source, max_new_tokens).tolist()

    def length_limit(self, source_length: int, max_new_tokens: int | None = None) -> int:
        """The former one-sentence form of `length_limits`, kept for one release (CHANGELOG.md)."""
        warnings.warn(
            "Translator.length_limit is now length_limits, over many lengths; the old name goes in the next release",
            FutureWarning,
            stacklevel=2,
        )
        (limit,) = self.length_limits([source_length], max_new_tokens)
        return limit

    @functools.cached_property
    def token_words(self) -> TokenWords:
        """What each token of the tokenizer does to words, for phrases matched as whole words (read once: it
        decodes the whole vocabulary)."""
        return TokenWords.of(self.tokenizer)
