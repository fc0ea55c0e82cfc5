"""A former import path, kept for one release: what the modules below now hold (tools/__init__.py)."""

from hf_vanilla_transformer.inspection.capture import PartialTranslation as Hypothesis
from hf_vanilla_transformer.inspection.pictures import *
