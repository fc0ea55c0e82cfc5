"""Tiny models, tokenizers and datasets made in the tests: small enough to run hundreds of times a second on a CPU."""

import random

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.modeling_vanilla_transformer import CACHE_NAME, paper_generation_config

PAD, BOS, EOS = 1, 0, 2


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


def cache_of(output):
    """The decoder cache of a model output, under the name of the installed transformers (`CACHE_NAME`)."""
    return getattr(output, CACHE_NAME)


def enable_checkpointing(model) -> None:
    """Gradient checkpointing on, by transformers' public name of this release (5.24 renamed it "activation")."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def tiny_model(seed: int = 0, attn_implementation: str = "eager", **overrides):
    torch.manual_seed(seed)
    model = VanillaTransformerForConditionalGeneration(tiny_config(**overrides))
    model.set_attn_implementation(attn_implementation)
    return model.eval()


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


def beam_search_example():
    """A tiny random model whose beam search (3 beams, 8 tokens at most) finishes three hypotheses at different
    steps, drops others and stops with some still running: seed 5 was picked for that, with the paper's length
    penalty, which a trained model's generation config holds."""
    model = tiny_model(5, vocab_size=14)
    model.generation_config = paper_generation_config(model.config)
    return model, letter_tokenizer(), "a b c d e", {"num_beams": 3, "max_new_tokens": 8}


def round_trip(tokenizer, text: str) -> str:
    return tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True)


def random_token_dataset(size: int, seed: int) -> Dataset:
    """Sources and targets of random ids between 4 and 98 (the tiny model's vocabulary), of varied lengths."""
    rng = random.Random(seed)

    def sentence(longest: int) -> list[int]:
        return [rng.randint(4, 98) for _ in range(rng.randint(1, longest))] + [EOS]

    rows = [(sentence(20), sentence(12)) for _ in range(size)]
    return Dataset.from_dict({"input_ids": [s for s, _ in rows], "labels": [t for _, t in rows]})


def reversal_dataset(tokenizer, size: int, seed: int, letters: tuple[int, int] = (3, 7)) -> Dataset:
    """Translate a letter string into its reverse: a task a tiny Transformer learns in a few hundred steps. Each
    source holds between `letters[0]` and `letters[1]` letters."""
    rng = random.Random(seed)
    sources = [" ".join(rng.choices(LETTERS, k=rng.randint(*letters))) for _ in range(size)]
    targets = [" ".join(reversed(s.split())) for s in sources]
    return Dataset.from_dict({"source": sources, "target": targets}).map(
        lambda batch: tokenizer(batch["source"], text_target=batch["target"]),
        batched=True,
        remove_columns=["source", "target"],
    )


SENTENCES = ["A man is sleeping.", "Two dogs play in the snow.", "A little girl climbs into a wooden playhouse."]


def generate_text(model, tokenizer, sentences, **kwargs) -> list[str]:
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        return tokenizer.batch_decode(model.generate(**batch, **kwargs), skip_special_tokens=True)


GERMAN = [
    "Ein Hund läuft im Schnee.",
    "Der Hund schläft im Haus.",
    "Zwei Hunde spielen im Park.",
    "Eine Frau liest ein Buch.",
    "Kinder spielen „Fußball“ im Garten.",
    "Der Einsatz der Feuerwehr.",
]


def german_tokenizer():
    """A byte-level BPE over a few German sentences, as `train_bpe.py` trains one, and its `TokenWords`: words at a
    sentence's start and after a space are spelled apart, and some are pieces of longer ones."""
    from hf_vanilla_transformer.decoding.words import TokenWords
    from hf_vanilla_transformer.training.tokenizer import train_shared_bpe

    tokenizer = train_shared_bpe(GERMAN * 30, 400)
    return tokenizer, TokenWords.of(tokenizer)
