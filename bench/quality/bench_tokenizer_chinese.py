"""What the shared byte-level BPE does with Chinese: tokens per sentence and per character, and byte pieces.

    python -m bench tokenizer_chinese [--vocab_sizes 8000 16000 ...] [--split_han 0 1]

Trains the shared vocabulary on both sides of Tatoeba English–Chinese train at each size (and each normalization)
and encodes the test set, without and with `split_han` (each Han character a word of its own). A Chinese character
that is not one token of the vocabulary is encoded as two or three byte pieces: the model has to spell it byte by
byte, and a wrong byte decodes to "�". Also counts the test references' full-width punctuation that survives the
round trip (NFKC turns "，？！" into ASCII).
"""

import argparse
import os
import re
import statistics
from collections import Counter
from itertools import chain, product

from bench.helpers.common import SHARED_DATA, machine, write_results
from hf_vanilla_transformer.training.data import read_translation_file
from hf_vanilla_transformer.training.tokenizer import NORMALIZERS, train_shared_bpe

TATOEBA = os.path.join(SHARED_DATA, "tatoeba-en-zh")
CHINESE_CHARACTER = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
FULL_WIDTH_PUNCTUATION = re.compile(r"[，？！：；（）]")


def measure(tokenizer, train_pairs, test_pairs) -> dict:
    rust = tokenizer.backend_tokenizer
    test_english, test_chinese = zip(*test_pairs, strict=True)
    characters = sorted({c for text in test_chinese for c in CHINESE_CHARACTER.findall(text)})
    byte_piece_characters = [c for c in characters if len(rust.encode(c, add_special_tokens=False).ids) > 1]
    train_counts = Counter(c for _, chinese in train_pairs for c in CHINESE_CHARACTER.findall(chinese))
    chinese_lengths = [len(e.ids) - 1 for e in rust.encode_batch(list(test_chinese))]  # without </s>
    english_lengths = [len(e.ids) - 1 for e in rust.encode_batch(list(test_english))]
    chinese_characters = sum(len(CHINESE_CHARACTER.findall(text)) for text in test_chinese)
    punctuation = sum(len(FULL_WIDTH_PUNCTUATION.findall(text)) for text in test_chinese)
    kept = sum(
        len(FULL_WIDTH_PUNCTUATION.findall(tokenizer.decode(e.ids, skip_special_tokens=True)))
        for e in rust.encode_batch(list(test_chinese))
    )
    return {
        "vocab_size": len(tokenizer),
        "chinese_tokens_per_sentence": round(statistics.mean(chinese_lengths), 2),
        "chinese_tokens_per_character": round(sum(chinese_lengths) / sum(len(t) for t in test_chinese), 3),
        "english_tokens_per_sentence": round(statistics.mean(english_lengths), 2),
        "test_chinese_characters": chinese_characters,
        "distinct_test_chinese_characters": len(characters),
        "distinct_characters_as_byte_pieces": len(byte_piece_characters),
        "of_which_unseen_or_once_in_train": sum(train_counts[c] <= 1 for c in byte_piece_characters),
        "test_character_occurrences_as_byte_pieces": sum(
            len(re.findall(re.escape(c), " ".join(test_chinese))) for c in byte_piece_characters
        ),
        "full_width_punctuation_in_references": punctuation,
        "full_width_punctuation_after_round_trip": kept,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab_sizes", type=int, nargs="+", default=[8000, 12000, 16000, 24000])
    parser.add_argument("--normalizations", nargs="+", default=list(NORMALIZERS), choices=list(NORMALIZERS))
    parser.add_argument("--split_han", nargs="+", type=int, default=[0, 1], choices=[0, 1], help="without, with")
    args = parser.parse_args()

    train_pairs = list(read_translation_file(os.path.join(TATOEBA, "train.jsonl"), "en", "zh"))
    test_pairs = list(read_translation_file(os.path.join(TATOEBA, "test.jsonl"), "en", "zh"))
    rows = []
    for split_han, normalization, vocab_size in product(args.split_han, args.normalizations, args.vocab_sizes):
        tokenizer = train_shared_bpe(
            chain.from_iterable(train_pairs), vocab_size=vocab_size, normalization=normalization, split_han=split_han
        )
        row = {"split_han": bool(split_han), "normalization": normalization}
        rows.append({**row, **measure(tokenizer, train_pairs, test_pairs)})
        print(rows[-1])
    print("wrote", write_results("tokenizer_chinese", {"machine": machine(), "rows": rows}))


if __name__ == "__main__":
    main()
