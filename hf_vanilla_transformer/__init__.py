"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017) for Hugging Face.

Importing the package registers the model with transformers' auto classes, so `AutoConfig`, `AutoModel` and
`AutoModelForSeq2SeqLM` load folders whose config says `"model_type": "vanilla_transformer"`.

- model/: what every saved folder carries (the configuration, the model, its pipeline);
- errors.py, files.py, hardware.py, extras.py, loading.py: one concept each, for every layer above;
- training/: the paper's recipe on transformers' Trainer;
- tools/: what one does with a trained folder (translate, steer, export, look inside, share);
- cli/: the command lines.
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
