"""The steering files of `vanilla-translate`, read and checked before any model is loaded: `--prefix` (a target
prefix a line of input), `--constraints` (a JSON list of required words or phrases a line of input) and `--avoid`
(words or phrases no translation may hold, a JSON string or list of strings a line, all lines together). Each error
is a `SteeringError` that names the file and line: what is not JSON, JSON nested too deeply, a value that is not a
string, a lone surrogate, a phrase of only invisible or control characters, and, once the tokenizer is known, a
special token or markup (`<...>`), which the model writes as no text."""

import dataclasses
import logging
import re
import sys
import unicodedata

from hf_vanilla_transformer.decoding.request import Steering, SteeringError
from hf_vanilla_transformer.files import InputError, check_unicode, decoded_lines, json_value, numbered_lines, shortened

logger = logging.getLogger("vanilla-translate")

# a tag as HTML, XML or a tokenizer's special tokens write it: `<b>`, `</s>`, `<unk>`, `<br/>`
MARKUP = re.compile(r"</?[A-Za-z_][^<>]*>")
# what a phrase of nothing but these has: nothing a reader sees (format characters such as U+200B, controls, spaces)
INVISIBLE_CATEGORIES = ("Cf", "Cc", "Zs", "Zl", "Zp")


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 file ('-': standard input, read as bytes whatever the locale), blank ones included."""
    numbered = decoded_lines(sys.stdin.buffer, "standard input") if path == "-" else numbered_lines(path)
    return [line.rstrip("\r\n") for _, line in numbered]


def checked_phrase(value: object, where: str) -> str:
    """`value` as a word or phrase to require or avoid: a string of Unicode text with something visible in it and
    no control characters (a newline or a NUL in a term is no text a translation holds)."""
    if not isinstance(value, str):
        raise SteeringError(f"{where}: {type(value).__name__} {shortened(value)} is not a string")
    try:
        check_unicode(value, f"{where}: {shortened(value)}")
    except InputError as error:
        raise SteeringError(str(error)) from None
    control = next((character for character in value if unicodedata.category(character) == "Cc"), None)
    if control is not None:
        raise SteeringError(f"{where}: {shortened(value)} holds the control character {control!r}")
    if all(unicodedata.category(character) in INVISIBLE_CATEGORIES for character in value):
        raise SteeringError(f"{where}: {shortened(value)} has no visible characters")
    return checked_text(value, where)


def checked_text(text: str, where: str) -> str:
    """`text`, refused if it holds markup (`MARKUP`, which a tokenizer's special tokens match)."""
    markup = MARKUP.search(text)
    if markup is not None:
        raise SteeringError(f"{where}: {shortened(text)} holds {markup[0]!r}, which is markup, not text")
    return text


def read_phrase_list(line: str, where: str, also_a_string: bool = False) -> list[str]:
    """A line's JSON list of strings (or, with `also_a_string`, one string); a blank line is none."""
    if not line.strip():
        return []
    try:
        value = json_value(line, where, "a JSON list of strings")
    except InputError as error:
        raise SteeringError(f"{error}; write a list of strings") from None
    if also_a_string and isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise SteeringError(f"{where}: {shortened(value)} is not a JSON list of strings")
    return [checked_phrase(phrase, where) for phrase in value]


def read_constraints(path: str) -> list[list[str]]:
    """A constraints file: per line a JSON list of the words or phrases that line's translation must contain (a
    blank line: none)."""
    return [read_phrase_list(line, f"{path}:{number}") for number, line in numbered_steering_lines(path)]


def read_avoid(path: str) -> list[str]:
    """An avoid file: per line a JSON string or list of strings, words or phrases no translation may hold."""
    phrases = []
    for number, line in numbered_steering_lines(path):
        phrases += read_phrase_list(line, f"{path}:{number}", also_a_string=True)
    return list(dict.fromkeys(phrases))


def read_prefixes(path: str) -> list[str]:
    """A prefix file: a target prefix a line (a blank line: none)."""
    return [checked_text(line.rstrip("\r\n"), f"{path}:{number}") for number, line in numbered_steering_lines(path)]


def numbered_steering_lines(path: str):
    try:
        yield from numbered_lines(path)
    except InputError as error:
        raise SteeringError(str(error)) from None


def read_steering_files(
    steering: Steering, prefix_path: str | None, constraints_path: str | None, avoid_path: str | None = None
) -> Steering:
    """`steering` with each line's prefix (`prefix_path`: a prefix a line), constraints (`constraints_path`) and
    the phrases to avoid (`avoid_path`), and the names of their files for errors."""
    read = {}
    for part, path, reader in (
        ("prefixes", prefix_path, read_prefixes),
        ("constraints", constraints_path, read_constraints),
        ("avoid", avoid_path, read_avoid),
    ):
        if path is not None:
            read[part] = reader(path)
    names = {"prefixes": prefix_path, "constraints": constraints_path, "avoid": avoid_path}
    return dataclasses.replace(steering, names=names, **read)


def check_line_counts(steering: Steering, lines: int, input_name: str, complete: bool = True) -> None:
    """Refuses a per-line file with another line count than the input's (`lines`; not `complete`: the input read so
    far, which a file may not be shorter than)."""
    for part in ("prefixes", "constraints"):
        given = getattr(steering, part)
        if given is not None and (len(given) < lines or (complete and len(given) != lines)):
            raise SteeringError(f"{steering.names[part]}: {len(given)} line(s) for the {lines} of {input_name}")


def check_steering_texts(tokenizer, steering: Steering) -> None:
    """Refuses a prefix or phrase that holds one of the tokenizer's special tokens: the model writes `</s>` or
    `<unk>` as no text, so no output could show it (`MARKUP` already caught those written as tags)."""
    special = [token for token in tokenizer.all_special_tokens if token]
    for part in ("prefixes", "constraints", "avoid"):
        given = getattr(steering, part)
        for index, texts in enumerate(given or []):
            # the avoid file's phrases are pooled: they are named by the file and the phrase
            where = steering.names.get(part) or part
            where = where if part == "avoid" else f"{where}:{index + 1}"
            for text in [texts] if isinstance(texts, str) else texts:
                found = next((token for token in special if token in text), None)
                if found is not None:
                    raise SteeringError(f"{where}: {shortened(text)} holds {found!r}, a special token, not text")


def warn_about_blank_lines(steering: Steering, lines: list[str], first_line: int = 1) -> None:
    """A warning for each input line that is blank but has constraints or a prefix: it is not translated."""
    for part in ("prefixes", "constraints"):
        given = getattr(steering, part)
        if given is None:
            continue
        for index, line in enumerate(lines):
            value = given[index]
            if not line.strip() and (value.strip() if isinstance(value, str) else value):
                logger.warning(
                    "%s:%d: given for a blank line of input, which is not translated",
                    steering.names.get(part) or part,
                    first_line + index,
                )
