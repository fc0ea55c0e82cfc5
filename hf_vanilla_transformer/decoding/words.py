"""Words and phrases in token space: a phrase the translation must hold (decoding/constraints.py) or must not hold
(decoding/avoid.py) matches as whole words, whatever the tokenizer splits it into.

A word boundary is where a word character meets a character that is not one. Word characters are the letters, digits
and marks of scripts that separate words with spaces; scripts written without spaces between words (Han, Hiragana,
Katakana, Thai, Lao, Khmer, Myanmar) show no word boundaries in the text, so a phrase in them matches inside what a
reader takes for a word, as `holds` checks it. With `match="subword"` a phrase matches anywhere, as plain text.

A phrase has several spellings in tokens: with byte-level BPE "Hund" inside a sentence is `ĠHund` (after a space),
but at the sentence's start or after an opening quote it is `Hund`, tokenized apart. `encode_phrases` gives both
forms and says where each may stand; `TokenWords` says of every token of the vocabulary whether it continues the
word before it, so that a search can tell "Hund" from the start of "Hunde".
"""

import dataclasses
import unicodedata
from typing import Literal

import regex
import torch

PhraseMatch = Literal["word", "subword"]
PHRASE_MATCHES: tuple[PhraseMatch, ...] = ("word", "subword")

UNSPACED_SCRIPTS = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}"
WORD_CHARACTER = regex.compile(rf"[[\p{{L}}\p{{N}}\p{{M}}]--[{UNSPACED_SCRIPTS}]]", regex.V1)
UNSPACED_CHARACTER = regex.compile(rf"[{UNSPACED_SCRIPTS}]")
# opening brackets (Ps), opening quotes (Pi) and dashes (Pd): a word may follow them with no space
OPENING = ("Ps", "Pi", "Pd")
SENTENCE_ENDS = ".!?…。！？"
# what may follow a sentence's end: closing quotes and brackets, spaces
CLOSING = "\"'”’»)]}」』） \t"
# byte-level BPE spells a character it has no token for as its bytes; a token holding part of one decodes to this
PART_OF_A_CHARACTER = "\ufffd"


def is_word_character(character: str) -> bool:
    """Letters, digits and marks of a script written with spaces, and the part of a character a byte token holds."""
    return character == PART_OF_A_CHARACTER or WORD_CHARACTER.fullmatch(character) is not None


def joined(before: str, after: str, match: PhraseMatch = "word") -> bool:
    """Whether two neighbouring characters are of one word, as `match` reads words (never, matching subwords)."""
    return match == "word" and is_word_character(before) and is_word_character(after)


def holds(text: str, phrase: str, match: PhraseMatch = "word") -> bool:
    """Whether `text` holds `phrase`: as whole words (no word character joined to it on either side) or, with
    `match="subword"`, anywhere."""
    start = text.find(phrase)
    while start >= 0:
        end = start + len(phrase)
        joined_before = start > 0 and joined(text[start - 1], phrase[0], match)
        joined_after = end < len(text) and joined(phrase[-1], text[end], match)
        if not joined_before and not joined_after:
            return True
        start = text.find(phrase, start + 1)
    return False


@dataclasses.dataclass(frozen=True)
class TokenWords:
    """What each token of a vocabulary does to words (a tensor each, indexed by token id): `joins[v]`, written right
    after a word character, it goes on with that word (its text starts with a word character, and the tokenizer
    puts no space between tokens); `ends_in_word[v]`, its text ends with a word character, so that a word may go on
    after it; `opens_word[v]`, a word may follow it directly as typesetting has it (its text ends with a space, an
    opening bracket or quote, a dash or a straight quote, not a comma or a full stop, after which a space comes
    first; and the decoder's start); `starts_with_space[v]`, its text starts with whitespace, which no sentence
    does; `silent[v]`, it writes no text (a special token but `</s>`, or an id beyond the tokenizer's), so that it
    would hide where words meet; `ends_sentence[v]`, its text ends a sentence (a full stop, question or exclamation
    mark, or an ellipsis, Latin or CJK, before any closing quotes or brackets). Special tokens do none of the
    others: `</s>` ends a word."""

    joins: torch.BoolTensor
    ends_in_word: torch.BoolTensor
    opens_word: torch.BoolTensor
    ends_sentence: torch.BoolTensor
    starts_with_space: torch.BoolTensor
    silent: torch.BoolTensor

    @classmethod
    def of(cls, tokenizer, vocab_size: int | None = None) -> "TokenWords":
        """The table of `tokenizer`'s tokens, `vocab_size` of them (default: the tokenizer's). A token's text is what
        decoding it gives; a tokenizer that writes a space between any two tokens (a word-level one) is seen by
        decoding each token twice, so that every token is a word of its own there."""
        size = len(tokenizer) if vocab_size is None else vocab_size
        ids = list(range(min(size, len(tokenizer))))
        decode = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
        texts = tokenizer.batch_decode([[index] for index in ids], **decode)
        twice = tokenizer.batch_decode([[index, index] for index in ids], **decode)
        special = set(tokenizer.all_special_ids)
        joins, ends_in_word, opens_word, ends_sentence, starts_with_space = (
            torch.zeros(size, dtype=torch.bool) for _ in range(5)
        )
        silent = torch.ones(size, dtype=torch.bool)
        for index, text, doubled in zip(ids, texts, twice, strict=True):
            silent[index] = index in special and index != tokenizer.eos_token_id
            if index in special or not text:
                opens_word[index] = True  # the decoder's start: the sentence's first word follows
                continue
            joins[index] = doubled == text + text and is_word_character(text[0])
            ends_in_word[index] = is_word_character(text[-1])
            opens_word[index] = text[-1].isspace() or text[-1] in "\"'" or unicodedata.category(text[-1]) in OPENING
            ends_sentence[index] = text.rstrip(CLOSING).endswith(tuple(SENTENCE_ENDS))
            starts_with_space[index] = text[0].isspace()
        return cls(joins, ends_in_word, opens_word, ends_sentence, starts_with_space, silent)

    def to(self, device: torch.device) -> "TokenWords":
        return TokenWords(*(getattr(self, field.name).to(device) for field in dataclasses.fields(self)))


@dataclasses.dataclass(frozen=True)
class Phrase:
    """A word or phrase as the model may write it: `text` as the tokenizer normalises it; `forms`, the token
    sequences that spell it, the first as it stands after a space; `opens[i]`, form i may start only where a word
    may (the sentence's start, or after a token that does not end in a word character); `closes`, the token after
    it must not go on with its last word (it ends in a word character); `may_lead`, it may be the sentence's first
    word (not where it starts with a small letter: a sentence of a script with capitals starts with a capital).
    `opens` and `closes` are False for a phrase matched as subwords, and all three are permissive for token ids
    given directly (`Phrase.of_tokens`)."""

    text: str
    forms: tuple[tuple[int, ...], ...]
    opens: tuple[bool, ...]
    closes: bool
    may_lead: bool = True

    @classmethod
    def of_tokens(cls, tokens: list[int]) -> "Phrase":
        """A phrase given as token ids: matched as those tokens, anywhere."""
        return cls(str(tokens), (tuple(tokens),), (False,), False)

    @property
    def shortest(self) -> int:
        """The fewest tokens that write it wherever the search stands: its shortest form that may start anywhere."""
        return min(len(form) for form, opens in zip(self.forms, self.opens, strict=True) if not opens)


def encode_phrases(
    tokenizer, phrases: list[str], match: PhraseMatch = "word", words: TokenWords | None = None
) -> list[Phrase]:
    """Each phrase's forms in the target's tokens (the tokenizer's `text_target` side, without special tokens), for
    `match` "word" (whole words, as `holds` reads them; needs `words`, the tokenizer's `TokenWords`) or "subword".
    A phrase of no tokens (blank) raises ValueError naming it."""
    if match not in PHRASE_MATCHES:
        raise ValueError(f"match {match!r} must be one of {', '.join(PHRASE_MATCHES)}")
    if match == "word" and words is None:
        raise ValueError("matching whole words needs the tokenizer's TokenWords")
    stripped = [phrase.strip() for phrase in phrases]
    blank = next((phrase for phrase, text in zip(phrases, stripped, strict=True) if not text), None)
    if blank is not None:
        raise ValueError(f"phrase {blank!r} has no tokens")
    if not phrases:
        return []
    bare = tokenizer(text_target=stripped, add_special_tokens=False)["input_ids"]
    spaced = tokenizer(text_target=[" " + text for text in stripped], add_special_tokens=False)["input_ids"]
    decode = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
    encoded = []
    for bare_form, spaced_form in zip(bare, spaced, strict=True):
        text = tokenizer.decode(bare_form, **decode)
        if UNSPACED_CHARACTER.match(text):  # no space before a phrase of a script written without spaces
            forms = [tuple(bare_form)]
        elif match == "subword":  # inside a word there is no space: without the space where it is a token of its own
            first_is_space = len(spaced_form) > 1 and not tokenizer.decode(spaced_form[:1], **decode).strip()
            forms = list(dict.fromkeys([tuple(spaced_form[first_is_space:]), tuple(bare_form)]))
        else:
            forms = list(dict.fromkeys([tuple(spaced_form), tuple(bare_form)]))
        may_lead = not text[0].islower()
        if match == "subword":
            encoded.append(Phrase(text, tuple(forms), (False,) * len(forms), False, may_lead))
            continue
        opens = tuple(is_word_character(text[0]) and bool(words.joins[form[0]]) for form in forms)
        if all(opens):  # a tokenizer that cannot mark a word's start (no space of its own): any start will do
            opens = (False,) * len(forms)
        encoded.append(Phrase(text, tuple(forms), opens, is_word_character(text[-1]), may_lead))
    return encoded
