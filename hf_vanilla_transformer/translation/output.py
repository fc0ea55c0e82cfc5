"""The one output module: the lines `vanilla-translate` and `vanilla-score` write, in their formats
(`OUTPUT_FORMATS`), and writing them (a file, atomically, or standard output)."""

import json
import sys

from hf_vanilla_transformer.decoding.alignment import format_alignment
from hf_vanilla_transformer.decoding.request import Hypothesis
from hf_vanilla_transformer.files import write_text_atomically

OUTPUT_FORMATS = ("plain", "jsonl")


NBEST_SEPARATOR = " ||| "  # between the fields of an n-best line, as fairseq, Moses and Marian write them


def format_translations(
    found: list[list[Hypothesis]], form: str = "plain", n_best: bool = False, first: int = 0
) -> list[str]:
    """The output lines for the hypotheses of each input line. plain: the best translation a line, or with `n_best`
    each hypothesis as `line ||| translation ||| score ||| log-probability` (the input line counted from 0, as in
    Moses' and fairseq's n-best lists; `first`: the number of `found`'s first line); an alignment, where there is
    one, follows as a last `||| i-j ...` field. jsonl: one JSON object an input line, {"translations": [...]}, each
    hypothesis with what it holds, strict JSON (a score that is not a number is an error, never `Infinity`)."""
    if form == "jsonl":
        return [
            json.dumps(
                {"translations": [hypothesis_fields(h) for h in hypotheses]}, ensure_ascii=False, allow_nan=False
            )
            for hypotheses in found
        ]
    lines = []
    for number, hypotheses in enumerate(found, first):
        for hypothesis in hypotheses if n_best else hypotheses[:1]:
            fields = [hypothesis.text]
            if n_best:
                fields = [str(number), hypothesis.text, f"{hypothesis.score:.4f}", f"{hypothesis.log_probability:.4f}"]
            if hypothesis.alignment is not None:
                fields.append(format_alignment(hypothesis.alignment))
            lines.append(NBEST_SEPARATOR.join(fields))
    return lines


def hypothesis_fields(hypothesis: Hypothesis) -> dict:
    """A hypothesis as JSON: the translation and what it holds besides, the alignment as `i-j` pairs."""
    fields = {"translation": hypothesis.text}
    for name in ("score", "log_probability", "tokens", "token_log_probs"):
        if getattr(hypothesis, name) is not None:
            fields[name] = getattr(hypothesis, name)
    if hypothesis.alignment is not None:
        fields["alignment"] = format_alignment(hypothesis.alignment)
    return fields


def format_scores(scores: list, tokenizer, alignments: list[str | None], form: str = "plain") -> list[str]:
    """The output lines for scored pairs (`SequenceScore`s), a pair a line. plain: its log-probability, and its
    alignment, where there is one, after ' ||| '; jsonl: its whole score as one JSON object (`json_line`)."""
    if form == "plain":
        return [
            str(score.log_probability) if alignment is None else f"{score.log_probability}{NBEST_SEPARATOR}{alignment}"
            for score, alignment in zip(scores, alignments, strict=True)
        ]
    return [json_line(score, tokenizer, alignment) for score, alignment in zip(scores, alignments, strict=True)]


def json_line(score, tokenizer, alignment: str | None = None) -> str:
    """A pair's `SequenceScore` as one JSON object, its tokens as the tokenizer spells them, and its alignment."""
    tokens = tokenizer.convert_ids_to_tokens(score.token_ids)
    fields = {
        "log_probability": score.log_probability,
        "score": score.score,
        "tokens": tokens,
        "token_log_probs": score.token_log_probs,
    }
    fields |= {"alignment": alignment} if alignment is not None else {}
    return json.dumps(fields, ensure_ascii=False, allow_nan=False)


def write_lines(path: str, lines: list[str]) -> None:
    """`lines` to the file `path`, written whole or not at all, or to standard output ('-')."""
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        return
    write_text_atomically(path, text)
