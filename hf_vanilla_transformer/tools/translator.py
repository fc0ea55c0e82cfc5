"""A former import path, kept for one release: what the modules below now hold (tools/__init__.py)."""

import torch

from hf_vanilla_transformer.decoding.request import *
from hf_vanilla_transformer.engines.base import *
from hf_vanilla_transformer.model.modeling_vanilla_transformer import length_limits


def length_limit(source_length, positions, max_new_tokens_over_source, max_new_tokens=None):
    """Former one-sentence form of `length_limits`."""
    lengths = torch.tensor([source_length])
    return int(length_limits(lengths, positions, max_new_tokens_over_source, max_new_tokens)[0])
