"""train_shared_bpe: one lossless shared BPE vocabulary that AutoTokenizer loads."""

import json
import random
import unicodedata

import pytest
import torch
from datasets import Dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, DataCollatorForSeq2Seq

from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.training.run import tokenize
from hf_vanilla_transformer.training.tokenizer import (
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS,
    BPEDropoutCollator,
    train_shared_bpe,
)
from support.models import round_trip, tiny_model

CAPTION_WORDS = (
    "a the man woman dog girl boy street snow water two young white men are outside near many bushes plays "
    "ein eine der die das Mann Frau Hund Mädchen Junge Straße Schnee Wasser zwei junge weiße Männer sind im Freien "
    "in der Nähe vieler Büsche spielt Öl Äpfel Übermut größer schön"
)


def captions(count: int) -> list[str]:
    """Caption-like English and German sentences made of CAPTION_WORDS, with umlauts and ß, as Multi30k's are."""
    rng, words = random.Random(0), CAPTION_WORDS.split()
    return [" ".join(rng.choices(words, k=rng.randint(4, 12))).capitalize() + "." for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer():
    """A vocabulary of at most 2,000 tokens trained on 4,000 made-up captions."""
    return train_shared_bpe(captions(4000), vocab_size=2000)


@pytest.mark.parametrize(
    "text",
    [
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        "Die Straße ist naß; Öl, Äpfel und Übermut kosten 3,50 € (ca. 4 $)!",
        "Un garçon français mange une crème brûlée à côté de l'hôpital.",
        "我们在公园里散步。",
        "A dog 🐕 runs 🏃‍♂️ after a ball ⚽ — quickly…",
        "\"Quotes\", 'single', „German“, «French» and `code` #42 @home 100% 1/2 x^2",
        "  leading and trailing spaces, and  double  spaces  ",
        "Tabs\tand\nnewlines",
    ],
)
def test_decoding_returns_the_nfkc_normalised_input(tokenizer, text):
    assert round_trip(tokenizer, text) == unicodedata.normalize("NFKC", text)


def test_unseen_characters_become_bytes_not_unknown(tokenizer):
    ids = tokenizer("我们 🐕")["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert len(ids) > 3  # several byte tokens per character
    assert round_trip(tokenizer, "我们 🐕") == "我们 🐕"


def test_nfkc_normalisation_without_lowercasing(tokenizer):
    assert round_trip(tokenizer, "Ｆｕｌｌｗｉｄｔｈ ﬁ ①") == "Fullwidth fi 1"
    assert round_trip(tokenizer, "CAPITALS Stay") == "CAPITALS Stay"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(min_size=0, max_size=80))
def test_round_trip_property_over_random_unicode(tokenizer, text):
    if any(token in text for token in SPECIAL_TOKENS):
        return  # the special tokens' own spellings are read as special tokens, as in every transformers tokenizer
    normalized = tokenizer.backend_tokenizer.normalizer.normalize_str(text)
    assert round_trip(tokenizer, normalized) == normalized
    python_nfkc = unicodedata.normalize("NFKC", text)
    if normalized == python_nfkc:  # the Rust and Python NFKC tables agree on all but the newest code points
        assert round_trip(tokenizer, python_nfkc) == python_nfkc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet=st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=12), min_size=1))
def test_single_spaced_words_round_trip(tokenizer, words):
    text = unicodedata.normalize("NFKC", " ".join(words))
    if any(token in text for token in SPECIAL_TOKENS) or text != " ".join(text.split()):
        return
    assert round_trip(tokenizer, text) == text


def test_special_token_ids_are_the_model_config_defaults(tokenizer):
    config = VanillaTransformerConfig()
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3]
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        config.bos_token_id,
        config.pad_token_id,
        config.eos_token_id,
        3,
    )


def test_encoding_appends_end_of_sentence_and_targets_become_labels(tokenizer):
    encoded = tokenizer(["A man sleeps.", "Two dogs play in the snow."], text_target=["Ein Mann schläft.", "Hunde."])
    assert all(
        ids[-1] == tokenizer.eos_token_id and ids.count(tokenizer.eos_token_id) == 1 for ids in encoded["input_ids"]
    )
    assert all(ids[-1] == tokenizer.eos_token_id for ids in encoded["labels"])
    assert tokenizer.bos_token_id not in encoded["input_ids"][0]

    model = tiny_model(vocab_size=len(tokenizer))
    features = [{key: encoded[key][i] for key in encoded} for i in range(2)]
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)(features)
    longer, shorter = batch["labels"]
    assert longer.tolist() == encoded["labels"][0] and shorter[len(encoded["labels"][1]) :].eq(-100).all()
    assert batch["decoder_input_ids"][:, 0].eq(0).all()
    assert batch["decoder_input_ids"][0, 1:].tolist() == encoded["labels"][0][:-1]
    assert batch["input_ids"][0][-1] == tokenizer.pad_token_id and batch["attention_mask"][0][-1] == 0
    assert torch.isfinite(model(**batch).loss)


def test_saved_tokenizer_reloads_with_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tmp_path.iterdir()}
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert {key: config[key] for key in ("bos_token", "pad_token", "eos_token", "unk_token")} == {
        "bos_token": "<s>",
        "pad_token": "<pad>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.is_fast and reloaded.get_vocab() == tokenizer.get_vocab()
    assert reloaded.all_special_ids == tokenizer.all_special_ids
    sentences = captions(500)
    assert reloaded(sentences)["input_ids"] == tokenizer(sentences)["input_ids"]
    assert reloaded.model_max_length == 1024


CHINESE = ["你好吗？我很好，谢谢！", "他说：“我们走吧。”", "请给我一杯水。"] * 30


def test_nfc_keeps_the_full_width_punctuation_that_nfkc_turns_into_ascii():
    nfkc, nfc = (train_shared_bpe(CHINESE, vocab_size=400, normalization=form) for form in ("NFKC", "NFC"))
    assert round_trip(nfkc, "你好吗？我很好，谢谢！") == "你好吗?我很好,谢谢!"
    assert round_trip(nfc, "你好吗？我很好，谢谢！") == "你好吗？我很好，谢谢！"
    assert round_trip(nfc, "Ｆｕｌｌ ﬁ") == "Ｆｕｌｌ ﬁ"  # compatibility characters stay as written
    assert round_trip(nfc, "e\u0301") == "\u00e9"  # canonical composition still applies
    assert "？" not in "".join(nfkc.get_vocab()) and nfc.tokenize("？") != nfkc.tokenize("？")
    with pytest.raises(ValueError, match="normalization 'NFD' must be one of NFKC, NFC"):
        train_shared_bpe(CHINESE, vocab_size=400, normalization="NFD")


def test_vocabulary_floor():
    assert MIN_VOCAB_SIZE == 260
    with pytest.raises(ValueError, match="no sentences"):
        train_shared_bpe([], vocab_size=300)


def test_split_han_makes_each_chinese_character_one_token_and_stays_lossless(tmp_path):
    merged, split = (train_shared_bpe(CHINESE, vocab_size=400, normalization="NFC", split_han=s) for s in (False, True))
    decoded = [split.convert_tokens_to_string([token]) for token in split.tokenize("你好吗？我很好，谢谢！")]
    assert decoded == ["你", "好", "吗", "？", "我", "很", "好", "，", "谢", "谢", "！"]
    assert any(len(merged.convert_tokens_to_string([t])) > 1 for t in merged.tokenize("你好吗？我很好，谢谢！"))
    for text in ["他说：“我们走吧。” OK, let's go!", "Mixed 中文 and English 字", "没见过的字：龘"]:
        assert round_trip(split, text) == text
    split.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)("我们走吧")["input_ids"] == split("我们走吧")["input_ids"]


def bpe_dropout_examples(tokenizer, sentences, max_source_length=64, max_target_length=64):
    """Rows of a training split tokenized with its text kept, as run_translation.py does under --bpe_dropout."""
    pairs = Dataset.from_dict({"source": sentences, "target": [sentence[::-1] for sentence in sentences]})
    return list(tokenize(pairs, tokenizer, max_source_length, max_target_length, keep_text=True))


def test_bpe_dropout_0_encodes_training_text_exactly_as_the_split_was_tokenized(tokenizer):
    examples = bpe_dropout_examples(tokenizer, [*captions(40), " ".join(captions(30))], 24, 16)
    padding = DataCollatorForSeq2Seq(tokenizer)
    batch = BPEDropoutCollator(tokenizer, 0.0, padding, 24, 16)(examples)
    stored = padding([{"input_ids": row["input_ids"], "labels": row["labels"]} for row in examples])
    assert torch.equal(batch["input_ids"], stored["input_ids"]) and torch.equal(batch["labels"], stored["labels"])
    assert batch["input_ids"].shape[1] == 24 and batch["labels"].shape[1] == 16  # the long pair, truncated alike


def test_bpe_dropout_varies_the_segmentation_of_training_text_and_keeps_it(tokenizer):
    examples = bpe_dropout_examples(tokenizer, captions(20))
    before = tokenizer.backend_tokenizer.to_str()
    collate = BPEDropoutCollator(tokenizer, 0.3, DataCollatorForSeq2Seq(tokenizer), 64, 64)
    batches = [collate(examples) for _ in range(3)]
    segmentations = {tuple(batch["input_ids"][0].tolist()) for batch in batches}
    assert len(segmentations) == 3  # a new draw each time the batch is made
    for batch in batches:
        for row, example in zip(batch["input_ids"].tolist(), examples, strict=True):
            assert tokenizer.decode(row, skip_special_tokens=True) == example["source"]  # the same text, resegmented
            assert row[len(row) - row[::-1].index(tokenizer.eos_token_id) - 1] == tokenizer.eos_token_id
        assert batch["input_ids"].shape[1] >= max(len(example["input_ids"]) for example in examples)
    # the tokenizer the run saves and evaluates with is untouched and still deterministic
    assert tokenizer.backend_tokenizer.to_str() == before
    assert tokenizer(examples[0]["source"])["input_ids"] == examples[0]["input_ids"]


def test_bpe_dropout_leaves_examples_without_text_as_they_are(tokenizer):
    examples = [{"input_ids": [5, 6, 2], "labels": [7, 2]}, {"input_ids": [8, 2], "labels": [9, 10, 2]}]
    padding = DataCollatorForSeq2Seq(tokenizer)
    batch = BPEDropoutCollator(tokenizer, 0.5, padding, 64, 64)(examples)
    assert batch["input_ids"].tolist() == padding(examples)["input_ids"].tolist()
    assert batch["labels"].tolist() == [[7, 2, -100], [9, 10, 2]]
