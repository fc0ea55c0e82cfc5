"""A fixed start of the translation, which the model continues: autocompletion and interactive translation, as
fairseq's `--prefix-size` and CTranslate2's `target_prefix` offer it, through `generate()`'s public
`logits_processor` argument, so that it works with greedy decoding, beam search and sampling alike."""

import math

import torch
from transformers.generation import LogitsProcessor


def prefix_token_ids(tokenizer, prefixes: list[str]) -> list[list[int]]:
    """Each prefix's tokens as they start a target sentence (no `</s>`: the model goes on from them); an empty
    prefix has none. Whitespace around a prefix is left out, as around a sentence: the model never saw a target
    that starts with a space."""
    return tokenizer(text_target=[prefix.strip() for prefix in prefixes], add_special_tokens=False)["input_ids"]


class PrefixLogitsProcessor(LogitsProcessor):
    """Makes each sentence's translation start with its prefix tokens.

    At the i-th generated position of a sentence whose prefix is longer than i, every token but the prefix's i-th
    gets -inf; the prefix token keeps the model's own score, so that a hypothesis is scored (and a beam ranked) as
    the model scores it. generate() repeats each sentence's row once per beam or returned sequence.
    """

    def __init__(self, prefixes: list[list[int]], decoder_prompt_length: int = 1):
        longest = max(map(len, prefixes), default=0)
        self.tokens = torch.full((len(prefixes), longest), -1, dtype=torch.long)  # -1: no prefix token there
        for row, prefix in enumerate(prefixes):
            self.tokens[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        self.decoder_prompt_length = decoder_prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.decoder_prompt_length
        if step >= self.tokens.shape[1]:
            return scores
        rows_per_sentence = input_ids.shape[0] // self.tokens.shape[0]
        forced = self.tokens[:, step].to(scores.device).repeat_interleave(rows_per_sentence)[:, None]
        token = forced.clamp(min=0)
        only_prefix = torch.full_like(scores, -math.inf).scatter(1, token, scores.gather(1, token))
        return torch.where(forced >= 0, only_prefix, scores)
