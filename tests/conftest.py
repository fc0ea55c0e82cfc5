"""Shared fixtures. Everything runs offline: the Hub is never contacted."""

import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

PAD, BOS, EOS = 1, 0, 2
REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"


def tiny_config(**overrides) -> VanillaTransformerConfig:
    """A model small enough to run hundreds of times a second on a CPU, with every dimension distinct."""
    values = dict(
        vocab_size=99,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=2,
        encoder_ffn_dim=48,
        decoder_ffn_dim=40,
        max_position_embeddings=128,
        dropout=0.0,
    )
    values.update(overrides)
    return VanillaTransformerConfig(**values)


def tiny_model(seed: int = 0, attn_implementation: str = "eager", **overrides):
    torch.manual_seed(seed)
    model = VanillaTransformerForConditionalGeneration(tiny_config(**overrides))
    model.set_attn_implementation(attn_implementation)
    return model.eval()


@pytest.fixture
def padded_batch():
    """Two sources of different lengths, right-padded, and teacher-forced targets."""
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, EOS], [11, 12, 13, EOS, PAD, PAD, PAD]])
    decoder_input_ids = torch.tensor([[BOS, 20, 21, 22, 23], [BOS, 24, 25, PAD, PAD]])
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD).long(),
        "decoder_input_ids": decoder_input_ids,
    }


LETTERS = list("abcdefghij")


def letter_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ten letters with the model's special-token layout; encoding appends </s>."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{letter: 4 + i for i, letter in enumerate(LETTERS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
