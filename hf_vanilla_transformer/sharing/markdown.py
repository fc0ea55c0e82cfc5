"""Text placed in a model card's Markdown where it stays text: shown as written in a title or prose, one code span,
one code block, one string literal in the code. The cards hold names and sentences that came from anywhere (a folder's
path, a Hub id, a data set's name, a test set's sentence), and none may add a heading, a code block, a link or HTML,
or end the code it is quoted in."""

import json
import re

# The ASCII punctuation that opens or closes something in a line of Markdown as the Hub renders it (CommonMark, with
# GitHub's tables and strikethrough, and math between dollars): escapes, code spans, emphasis, links and pictures,
# HTML and autolinks, entities, table cells, strikethrough, math, and a title's closing `#`s. The rest (quotes,
# brackets, `-`, `.`, `:` and so on) means something only at a line's start, where `markdown_text` escapes it too.
INLINE_SPECIALS = frozenset("\\`*[]<>&|~$#")
# What starts a block at a line's start beyond INLINE_SPECIALS: a list item's marker (`-`, `+`, or a number and `.`
# or `)`, then a space or the line's end), and a rule or a heading's underline (a line of `-` or `=` and spaces). A
# number such as `0.2` starts nothing, and stays as it is.
LINE_START = re.compile(r"([+-]|[0-9]{1,9}[.)])(?= |$)|[-=](?=[-= ]*$)")


def markdown_text(text: str) -> str:
    """`text` as Markdown that shows it as written, on one line, wherever a line of text may go (a title, a
    paragraph, a list item, a table's cell, a picture's description): its whitespace runs (line breaks among them)
    as one space, and the punctuation that would open a code span, emphasis, a link, HTML or a block (CommonMark
    allows a backslash before any ASCII punctuation) backslash-escaped. An underscore inside a word stays as it is
    (`inverse_sqrt`): there it can neither open nor close emphasis."""
    line = " ".join(text.split())
    escaped = [
        f"\\{character}"
        if character in INLINE_SPECIALS
        or (character == "_" and not (line[index - 1 : index].isalnum() and line[index + 1 : index + 2].isalnum()))
        else character
        for index, character in enumerate(line)
    ]
    start = LINE_START.match(line)
    if start:
        escaped[start.end() - 1] = f"\\{line[start.end() - 1]}"
    return "".join(escaped)


def longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)


def inline_code(code: str) -> str:
    """`code`, one non-empty line, as one Markdown code span that shows it as written: fenced by more backticks
    than any run of them inside, and padded by a space on each side (which CommonMark strips) where it begins or
    ends with a backtick, or begins and ends with a space."""
    if not code or "\n" in code or "\r" in code:
        raise ValueError(f"a code span holds one line of code, not {code!r}")
    fence = "`" * (longest_backtick_run(code) + 1)
    padded = code.startswith("`") or code.endswith("`") or (code.startswith(" ") and code.endswith(" "))
    space = " " if padded and code.strip(" ") else ""
    return f"{fence}{space}{code}{space}{fence}"


def fenced_block(language: str, code: str) -> str:
    """`code` as a Markdown code block in `language`, fenced by more backticks than any run of them inside (and at
    least three), so that no line of it ends the block."""
    fence = "`" * max(3, longest_backtick_run(code) + 1)
    body = code if code.endswith(("\n", "\r")) or not code else f"{code}\n"
    return f"{fence}{language}\n{body}{fence}"


def code_literal(text: str) -> str:
    """`text` as a string literal that means `text` in Python and in JavaScript alike, on one line. The cards' code
    quotes a test set's sentence and a path: whatever they hold must stay one string, not end the literal (or, a
    line of its own, the code block around it) and run as code. A JSON string is valid in both languages
    (JavaScript's since ES2019) and escapes quotes, backslashes and line ends; characters that do not print (U+2028,
    bidirectional controls) are escaped too, so that the code reads as it runs. Other non-ASCII text stays as
    written: JSON's ASCII escapes spell a character beyond U+FFFF as two UTF-16 halves, which JavaScript joins and
    Python does not (so the few that do not print up there, such as the tag characters of flag emoji, stay as
    written too)."""
    return "".join(
        character if character.isprintable() or ord(character) > 0xFFFF else f"\\u{ord(character):04x}"
        for character in json.dumps(text, ensure_ascii=False)
    )
