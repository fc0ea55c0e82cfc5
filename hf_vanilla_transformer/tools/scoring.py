"""A former import path, kept for one release: what the modules below now hold (tools/__init__.py)."""

from hf_vanilla_transformer.decoding.forced_decoding import *
from hf_vanilla_transformer.engines.ctranslate2 import *
from hf_vanilla_transformer.translation.scoring import *


def score_lines(translator, sources, targets, batch_size=32, names=("sources", "targets"), length_penalty=None):
    """Former name of `Translator.score`."""
    return translator.score(sources, targets, batch_size, names, length_penalty)
