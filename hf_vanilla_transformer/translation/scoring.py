"""Scoring given translations read from files, as `vanilla-score` (cli/score.py) does: the n-best lists
`vanilla-translate --format jsonl` writes (`read_hypotheses`), scored on the tokens they were written in and aligned
again (`rescored`) by the folder's engine (`Translator.score`, `Translator.align`)."""

from hf_vanilla_transformer.decoding.request import Hypothesis, Steering
from hf_vanilla_transformer.files import InputError, json_value
from hf_vanilla_transformer.translation.steering_files import read_lines


def read_hypotheses(path: str, lines: int, names: tuple[str, str]) -> list[list[tuple[str, list[str]]]]:
    """`vanilla-translate --format jsonl` output ('-': standard input): per line, each hypothesis' translation and
    tokens; as many lines as the sources (`lines`). Errors name the file and line as `names` (sources, targets)
    call them."""
    read = []
    for number, line in enumerate(read_lines(path), 1):
        where = f"{names[1]}:{number}"
        row = json_value(line, where, "a line of vanilla-translate --format jsonl")
        translations = row.get("translations") if isinstance(row, dict) else None
        if not isinstance(translations, list):
            raise InputError(f'{where}: not a line of vanilla-translate --format jsonl (no "translations" list)')
        hypotheses = []
        for hypothesis in translations:
            tokens = hypothesis.get("tokens") if isinstance(hypothesis, dict) else None
            text = hypothesis.get("translation") if isinstance(hypothesis, dict) else None
            if not isinstance(text, str) or not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise InputError(f'{where}: a hypothesis without "translation" text and "tokens" (a list of strings)')
            hypotheses.append((text, tokens))
        read.append(hypotheses)
    if len(read) != lines:
        raise InputError(f"{names[1]} has {len(read)} lines and {names[0]} has {lines}: one line a source line")
    return read


def rescored(
    translator,
    sources: list[str],
    hypotheses: list[list[tuple[str, list[str]]]],
    batch_size: int,
    names: tuple[str, str],
    length_penalty: float | None = None,
    alignments: bool = False,
) -> list[list[Hypothesis]]:
    """Each source's hypotheses (`read_hypotheses`) scored on the tokens they were written in (`Translator.score`), as
    `vanilla-translate` gives them, and aligned if asked: the n-best list's own figures again. A blank source's
    empty hypothesis keeps its score of 0; a blank source with tokens, tokens for a source that is blank, and a
    token the vocabulary lacks are errors naming the target file's line."""
    steering = Steering(scores=True, alignments=alignments)
    vocabulary, found, pairs = translator.tokenizer.get_vocab(), [[] for _ in sources], []
    for number, (source, line_hypotheses) in enumerate(zip(sources, hypotheses, strict=True), 1):
        for text, tokens in line_hypotheses:
            unknown = next((token for token in tokens if token not in vocabulary), None)
            if unknown is not None:
                raise InputError(f"{names[1]}:{number}: the token {unknown!r} is not in the model's vocabulary")
            if bool(source.strip()) != bool(tokens):
                side = "the source is blank" if tokens else "a hypothesis has no tokens"
                raise InputError(f"{names[1]}:{number}: {side}; each pair to score needs a sentence on both sides")
            if not tokens:
                found[number - 1].append(steering.blank_line_hypothesis())
                continue
            pairs.append((number - 1, text, translator.tokenizer.convert_tokens_to_ids(tokens)))
    line_sources = [sources[line] for line, _, _ in pairs]
    scores = translator.score(line_sources, [ids for _, _, ids in pairs], batch_size, names, length_penalty)
    targets = [text for _, text, _ in pairs]
    aligned = translator.align(line_sources, targets, batch_size) if alignments else [None] * len(pairs)
    for (line, text, _), score, alignment in zip(pairs, scores, aligned, strict=True):
        tokens = translator.tokenizer.convert_ids_to_tokens(score.token_ids)
        found[line].append(Hypothesis(text, alignment=alignment).scored(score, tokens))
    return found
