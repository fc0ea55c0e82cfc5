"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017) for Hugging Face.

Importing the package registers the model with transformers' auto classes, so `AutoConfig`, `AutoModel` and
`AutoModelForSeq2SeqLM` load folders whose config says `"model_type": "vanilla_transformer"`.

A folder a job, each importing only the folders listed before it (tests/contracts/test_layout.py has the exact rule):
- model/: what every saved folder carries (the configuration, the model, its pipeline);
- errors.py, files.py, formats.py, hardware.py, extras.py, loading.py: one concept each, for every folder below;
- training/: the paper's recipe on transformers' Trainer;
- decoding/: the decoding features (prefixes, constraints, phrases to avoid, alignments, ensembles, forced decoding);
- engines/: what translates a folder (our model's generate(), CTranslate2, ONNX Runtime), behind one interface;
- translation/: translating and scoring files of lines with any engine, and the one output module;
- inspection/: attention and decoding step by step, captured and drawn;
- sharing/: the model card and the Hub;
- export/: CTranslate2, Marian and ONNX exports;
- cli/: the command lines;
- tools/: former import paths, kept for one release.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from hf_vanilla_transformer.model.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
    paper_generation_config,
)
from hf_vanilla_transformer.model.pipeline_translation import TranslationPipeline

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)

# Saved folders carry the configuration and modeling code and an `auto_map`, so they also load with
# `trust_remote_code=True` where this package is not installed (on the Hub, for instance).
VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

__all__ = [
    "TranslationPipeline",
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "paper_generation_config",
]
