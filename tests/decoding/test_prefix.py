"""hf_vanilla_transformer.decoding.prefix: the prefix processor forces a line's prefix and keeps the model's score of
each forced token (the prefixes through vanilla-translate: cli/test_translate_steering.py)."""

import torch

from hf_vanilla_transformer.decoding.prefix import PrefixLogitsProcessor


def test_the_prefix_processor_keeps_the_models_score_of_the_forced_token():
    scores = torch.log_softmax(torch.randn(4, 14), -1)
    processed = PrefixLogitsProcessor([[5, 6], []])(torch.zeros(4, 1, dtype=torch.long), scores.clone())
    # two rows a sentence (beams): the first sentence's rows keep token 5 alone, the second's are as they were
    assert torch.equal(processed[:2, 5], scores[:2, 5]) and torch.isinf(processed[:2, :5]).all()
    assert torch.equal(processed[2:], scores[2:])
