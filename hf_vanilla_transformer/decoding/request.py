"""What is asked of a translator and what comes back, whatever engine runs it: `Steering`, what is asked beyond the
decoding settings (n-best lists, scores, alignments, prefixes, constraints, phrases to avoid), with its per-line
checks; `Hypothesis`, one translation and what the model says of it; `SteeringError`, a line that cannot be used."""

import dataclasses

from hf_vanilla_transformer.decoding.words import PhraseMatch
from hf_vanilla_transformer.model.pipeline_translation import SequenceScore


@dataclasses.dataclass
class Hypothesis:
    """One translation of a sentence and, where asked for, what the model says of it: `score` is what beam search
    ranks by (the log-probability over the length to the power of the length penalty), `log_probability` the sum
    of the tokens' log-probabilities, `alignment` the (source word, target word) pairs."""

    text: str
    score: float | None = None
    log_probability: float | None = None
    tokens: list[str] | None = None
    token_log_probs: list[float] | None = None
    alignment: list[tuple[int, int]] | None = None

    def scored(self, score: SequenceScore, tokens: list[str]) -> "Hypothesis":
        """This translation with what `score` says of it, its tokens spelled as the tokenizer spells them."""
        return dataclasses.replace(
            self,
            score=score.score,
            log_probability=score.log_probability,
            tokens=tokens,
            token_log_probs=score.token_log_probs,
        )


@dataclasses.dataclass(frozen=True)
class Steering:
    """What a translator is asked beyond the decoding settings: `n_best` hypotheses a sentence, their scores, word
    alignments, per sentence a target prefix to continue ("" for none) and the phrases the translation must
    contain (terminology constraints), and the phrases no translation may hold (`avoid`); constraints and avoided
    phrases are matched as whole words or, with `constraint_match="subword"`, anywhere (decoding/words.py). `names`
    are the files they came from and `first_line` the number of the first sentence's line, for errors."""

    n_best: int = 1
    scores: bool = False
    alignments: bool = False
    prefixes: list[str] | None = None
    constraints: list[list[str]] | None = None
    avoid: list[str] | None = None
    constraint_match: PhraseMatch = "word"
    names: dict[str, str | None] = dataclasses.field(default_factory=dict)
    first_line: int = 1

    def requested(self) -> list[str]:
        """The features asked for, by the names `Translator.features` uses."""
        asked = {
            "n_best": self.n_best > 1,
            "scores": self.scores,
            "alignments": self.alignments,
            "prefixes": self.prefixes is not None,
            "constraints": self.constraints is not None,
            "avoid": self.avoid is not None,
        }
        return [name for name, wanted in asked.items() if wanted]

    def select(self, indices: list[int]) -> "Steering":
        """The same request for the sentences at `indices` only."""
        return dataclasses.replace(
            self,
            prefixes=None if self.prefixes is None else [self.prefixes[i] for i in indices],
            constraints=None if self.constraints is None else [self.constraints[i] for i in indices],
        )

    def blank_line_hypothesis(self) -> Hypothesis:
        """What a blank line gets: an empty translation, scored 0 where scores are asked (it is certain), with
        nothing to align."""
        if self.scores:
            return Hypothesis("", 0.0, 0.0, [], [], [] if self.alignments else None)
        return Hypothesis("", alignment=[] if self.alignments else None)

    def lines(self, start: int, stop: int) -> "Steering":
        """The same request for lines `start` to `stop` (from 0) of the input, numbered as in it."""
        return dataclasses.replace(self.select(list(range(start, stop))), first_line=self.first_line + start)


class SteeringError(ValueError):
    """A line's prefix or constraints that cannot be used; the message names the file (or list) and line."""
