"""Words or phrases no translation may hold: sockeye's `avoid`, CTranslate2's `suppress_sequences`, transformers'
`bad_words_ids`, matched as whole words like the terms (decoding/words.py) or, with `match="subword"`, anywhere.

transformers' `NoBadWordsLogitsProcessor` bars token sequences, and that is not enough for words: barring "Hund" as
`ĠHund` also bars "Hunde" where the tokenizer spells it `ĠHund` `e`, misses "Hund" at a sentence's start (`Hund`,
no space), and lets the search write the word in other tokens (`ĠHu` `nd`), which it does when the usual ones are
barred. `AvoidLogitsProcessor` reads the text instead: at each step it decodes the end of each hypothesis and bars
every token that would complete a phrase there, whichever tokens spell it, where it stands as whole words; a phrase
that ends in a word character is barred once written by barring every token that would end the word there (the
hypothesis must go on with the word: "Hund" may become "Hundes"). It reads each row's own tokens only, so it serves
`generate()` (greedy, beam search, sampling), an ensemble's and constrained beam search alike.

CTranslate2 takes no processor of ours, only `suppress_sequences` of tokens: `ctranslate2_suppress_sequences` bars
each phrase's forms (`encode_phrases`) followed by any token that ends the word, which holds for the spellings the
tokenizer gives; a form that starts a word is barred inside words too there.
"""

import bisect

import torch
from transformers.generation import LogitsProcessor

from hf_vanilla_transformer.decoding.words import PhraseMatch, TokenWords, encode_phrases, is_word_character, joined

DECODE = dict(skip_special_tokens=True, clean_up_tokenization_spaces=False)
# the most bytes one character takes in UTF-8: tokens a character may be spelled in, at most
BYTES_PER_CHARACTER = 4


class AvoidLogitsProcessor(LogitsProcessor):
    """Bars the tokens that would write any of `phrases` (normalised as the tokenizer normalises them) as whole
    words (`match="word"`) or anywhere (`"subword"`). `words` is the tokenizer's `TokenWords`, for the tokens that
    go on with a word. Where barring would leave a row no token at all (the length limit allows only `</s>` right
    after a phrase), the row is left as it was: the limit wins."""

    def __init__(self, tokenizer, phrases: list[str], match: PhraseMatch, words: TokenWords):
        self.tokenizer, self.match, self.words = tokenizer, match, words
        # a tokenizer that writes a space between any two tokens (word-level) ends a word with every token
        self.every_token_a_word = not bool(words.joins.any())
        self.phrases = {phrase.text for phrase in encode_phrases(tokenizer, phrases, "subword")}
        self.longest = max(map(len, self.phrases), default=0)
        texts = tokenizer.batch_decode([[index] for index in range(len(tokenizer))], **DECODE)
        by_text = sorted((text, token) for token, text in enumerate(texts) if text)
        sorted_texts = [text for text, _ in by_text]
        # per phrase: the tokens that write all of it on their own wherever they stand (a word starts inside them,
        # or it starts with no word character) or only where a word may start; and, by the start of it a
        # hypothesis has written, the tokens that finish it
        self.anywhere = torch.zeros(len(words.joins), dtype=torch.bool)
        self.at_word_start = torch.zeros(len(words.joins), dtype=torch.bool)
        finishing: dict[str, list[int]] = {}
        for phrase in self.phrases:
            for text, token in by_text:
                if len(text) >= len(phrase):
                    self.mark_whole(token, text, phrase)
            for written in range(1, len(phrase)):
                rest = phrase[written:]
                first = bisect.bisect_left(sorted_texts, rest)
                last = bisect.bisect_left(sorted_texts, rest + "\U0010ffff")
                finishing.setdefault(phrase[:written], []).extend(
                    token for text, token in by_text[first:last] if self.ends_closed(text, len(rest))
                )
        self.finishing = {start: torch.tensor(ids, dtype=torch.long) for start, ids in finishing.items() if ids}

    def mark_whole(self, token: int, text: str, phrase: str) -> None:
        """Records whether `token`, whose text is `text`, writes all of `phrase` whole."""
        start = text.find(phrase)
        while start >= 0:
            if self.ends_closed(text, start + len(phrase)):
                if start > 0 and not joined(text[start - 1], phrase[0], self.match):
                    self.anywhere[token] = True
                elif start == 0:
                    needs_a_word_start = joined("a", phrase[0], self.match)
                    (self.at_word_start if needs_a_word_start else self.anywhere)[token] = True
            start = text.find(phrase, start + 1)

    def ends_closed(self, text: str, end: int) -> bool:
        """Whether a phrase ending at `end` of `text` is written whole there: the text goes on with a character
        that is not of its word, or (for a phrase the next token cannot join) ends."""
        if end < len(text):
            return not joined(text[end - 1], text[end], self.match)
        return self.every_token_a_word or not (self.match == "word" and is_word_character(text[-1]))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.phrases:
            return scores
        window = input_ids[:, -BYTES_PER_CHARACTER * (self.longest + 1) :].tolist()
        barred = torch.zeros(scores.shape, dtype=torch.bool)
        barred[:, : len(self.anywhere)] = self.anywhere
        for row, written in enumerate(self.tokenizer.batch_decode(window, **DECODE)):
            if self.every_token_a_word or self.word_may_start(written, len(written), "a"):
                barred[row, : len(self.at_word_start)] |= self.at_word_start
            for length in range(1, min(self.longest, len(written)) + 1):
                start = len(written) - length
                end = written[start:]
                if not self.word_may_start(written, start, end[0]):
                    continue
                if end in self.finishing:
                    barred[row, self.finishing[end]] = True
                if end in self.phrases and self.match == "word" and is_word_character(end[-1]):
                    # written whole: whatever would end the word here is barred, `</s>` too
                    barred[row, : len(self.words.joins)] |= ~self.words.joins
        barred = barred.to(scores.device)
        barred &= ~barred.all(-1, keepdim=True)  # a row with nothing left keeps what the length limit gives it
        return scores.masked_fill(barred, -float("inf"))

    def word_may_start(self, text: str, position: int, first: str) -> bool:
        """Whether a phrase whose first character is `first` stands as whole words from `position` of `text` on."""
        return position == 0 or not joined(text[position - 1], first, self.match)


def ctranslate2_suppress_sequences(
    tokenizer, phrases: list[str], match: PhraseMatch, words: TokenWords
) -> list[list[str]]:
    """CTranslate2's `suppress_sequences` (token strings) that bar `phrases` as the tokenizer spells them: each form
    (`encode_phrases`), followed, where the phrase ends in a word character, by each token that would end the word
    there (`</s>` included)."""
    sequences = []
    ending = [index for index in range(len(words.joins)) if not words.joins[index] and index < len(tokenizer)]
    for phrase in encode_phrases(tokenizer, phrases, match, words):
        for form in phrase.forms:
            if phrase.closes and words.joins.any():
                sequences += [[*form, token] for token in ending]
            else:
                sequences.append(list(form))
    return [tokenizer.convert_ids_to_tokens(sequence) for sequence in sequences]
