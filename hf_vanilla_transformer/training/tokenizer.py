"""One shared byte-pair-encoding vocabulary for source and target (Section 5.1 of the paper), built with `tokenizers`.

The paper encodes English and German with one BPE vocabulary of about 37,000 tokens (Sennrich et al., 2016).
We train it with the `tokenizers` library's Rust trainer over both sides of the training data, and save it as a
`transformers` fast tokenizer, so that `AutoTokenizer.from_pretrained(folder)` loads it without any of our code.

Choices, all documented in the README:
- NFKC normalisation by default, no lowercasing, so decoding returns the (NFKC-normalised) input exactly. NFKC
  also turns the full-width punctuation of Chinese and Japanese ("，", "？", "！", "：") into ASCII, so a model
  trained on it writes "你好吗?" where the references write "你好吗？"; `normalization="NFC"` keeps text as written
  (canonical composition only) and is what the English→Chinese recipe uses.
- Byte-level BPE (as GPT-2, RoBERTa and BART): words are split by GPT-2's pre-tokenisation pattern and BPE runs
  over their UTF-8 bytes, with all 256 bytes in the base vocabulary. A character never seen in training is
  encoded as its bytes, never as `<unk>` and never dropped. The paper's BPE runs over characters instead.
- `split_han=True` makes every Han character (Chinese hanzi, Japanese kanji) a word of its own before BPE, so merges
  never join two of them: a character seen often enough in training becomes one token (no merge is spent on
  multi-character words), and the vocabulary's remaining room goes to the other language. Chinese is then
  written character by character, as BLEU's `zh` tokenization scores it; without it, a small vocabulary spells
  some of a test set's Chinese characters as byte pieces while it spends tokens on multi-character words
  (BENCHMARKS.md, "What the shared byte-level BPE does with Chinese").
- Special tokens `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, the ids `VanillaTransformerConfig` uses by default.
  Encoding appends `</s>`; the decoder's `<s>` comes from the model (`decoder_start_token_id`).
"""

import json
from collections.abc import Iterable
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = [BOS, PAD, EOS, UNK]  # ids 0, 1, 2, 3
BYTE_ALPHABET_SIZE = len(pre_tokenizers.ByteLevel.alphabet())
MIN_VOCAB_SIZE = BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS)
NORMALIZERS = {"NFKC": normalizers.NFKC, "NFC": normalizers.NFC}
Normalization = Literal["NFKC", "NFC"]
DEFAULT_VOCAB_SIZE = 8000
DEFAULT_NORMALIZATION: Normalization = "NFKC"


def train_shared_bpe(
    sentences: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    normalization: Normalization = DEFAULT_NORMALIZATION,
    split_han: bool = False,
) -> PreTrainedTokenizerFast:
    """Train one BPE vocabulary of (at most) `vocab_size` tokens over `sentences`, streamed into the Rust trainer.

    `sentences` is any iterable of strings, for example both sides of the training corpus
    (`hf_vanilla_transformer.training.data.file_sentences`); errors raised while iterating propagate unchanged.
    `model_max_length` is what `truncation=True` cuts to: the model's `max_position_embeddings`. `normalization` is
    the Unicode normal form text is put in before encoding (NFKC: compatibility characters such as full-width
    letters and punctuation become their plain forms; NFC: text stays as written). `split_han`: each Han
    character is a word of its own (see the module's docstring).
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size {vocab_size} is below the minimum {MIN_VOCAB_SIZE}: "
            f"the {BYTE_ALPHABET_SIZE}-byte alphabet plus {len(SPECIAL_TOKENS)} special tokens"
        )
    if normalization not in NORMALIZERS:
        raise ValueError(f"normalization {normalization!r} must be one of {', '.join(NORMALIZERS)}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency {min_frequency} must be at least 1")

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = NORMALIZERS[normalization]()
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{Han}"), behavior="isolated"), byte_level])
        if split_han
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    seen = 0

    def counted():
        nonlocal seen
        for seen, sentence in enumerate(sentences, 1):  # noqa: B007 (the count is read after the loop)
            yield sentence

    tokenizer.train_from_iterator(counted(), trainer=trainer)
    if seen == 0:
        raise ValueError("no sentences to train the vocabulary on")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, tokenizer.token_to_id(EOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,  # keeps decoding lossless
        model_max_length=model_max_length,
    )


def check_tokenizer_fits_model(tokenizer, config) -> None:
    """Raise a ValueError unless `tokenizer` numbers tokens as the model with `config` was trained to read them:
    the same vocabulary size and the same ids for `<pad>`, `<s>` and `</s>`.
    """
    if len(tokenizer) != config.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}: "
            "they are not the same vocabulary"
        )
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        ids = getattr(tokenizer, name), getattr(config, name)
        if ids[0] is not None and ids[1] is not None and ids[0] != ids[1]:
            raise ValueError(f"the tokenizer's {name} is {ids[0]} but the model config's is {ids[1]}")


class BPEDropoutCollator:
    """BPE-dropout (Provilkov et al., 2020) for training batches: examples that carry their `source` and `target`
    text are encoded again as they are batched, by a copy of the tokenizer whose BPE skips each merge with
    probability `dropout` (the `tokenizers` BPE model's own `dropout`), so that a word is seen in many
    segmentations over the epochs; examples without text (evaluation's) keep their ids. Then `collator` pads.

    The copy is built from the tokenizer's saved form, so the tokenizer itself is left as it was, and it truncates
    as the split's `input_ids` and `labels` were truncated. `tokenizers` draws the skips from its own unseeded
    generator: runs with the same seed differ.
    """

    text_columns = ("source", "target")

    def __init__(self, tokenizer, dropout: float, collator, max_source_length: int, max_target_length: int):
        state = json.loads(tokenizer.backend_tokenizer.to_str())
        if state["model"]["type"] != "BPE":
            raise ValueError(f"BPE-dropout needs a BPE tokenizer; this one's model is {state['model']['type']}")
        state["model"]["dropout"] = dropout
        self.sampling = {}
        for column, max_length in zip(self.text_columns, (max_source_length, max_target_length), strict=True):
            self.sampling[column] = Tokenizer.from_str(json.dumps(state))
            self.sampling[column].enable_truncation(max_length)
        self.collator = collator

    def __call__(self, examples: list[dict]) -> dict:
        if examples and all(column in examples[0] for column in self.text_columns):
            source, target = (
                [encoding.ids for encoding in self.sampling[column].encode_batch([row[column] for row in examples])]
                for column in self.text_columns
            )
            examples = [{"input_ids": ids, "labels": labels} for ids, labels in zip(source, target, strict=True)]
        return self.collator(examples)
