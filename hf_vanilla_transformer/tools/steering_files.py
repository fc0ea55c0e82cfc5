"""A former import path, kept for one release: what the modules below now hold (tools/__init__.py)."""

from hf_vanilla_transformer.translation.steering_files import *
