"""A former import path, kept for one release: what the modules below now hold (tools/__init__.py)."""

from hf_vanilla_transformer.engines.ctranslate2 import ctranslate2_device, is_ctranslate2_folder
from hf_vanilla_transformer.engines.generate import *
from hf_vanilla_transformer.engines.registry import *
from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.hardware import check_device
from hf_vanilla_transformer.tools.translator import length_limit
from hf_vanilla_transformer.translation.lines import *
from hf_vanilla_transformer.translation.output import *
