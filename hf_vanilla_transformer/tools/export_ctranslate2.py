"""A former import path, kept for one release: what the modules below now hold (tools/__init__.py)."""

from hf_vanilla_transformer.engines.ctranslate2 import *
from hf_vanilla_transformer.export.ctranslate2 import *
from hf_vanilla_transformer.formats import *
