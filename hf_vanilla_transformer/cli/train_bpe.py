"""Train the shared source/target BPE vocabulary and save it as a tokenizer that AutoTokenizer loads.

    python train_bpe.py --train_file ../shared/data/multi30k/train.jsonl --source_lang en --target_lang de \\
        --vocab_size 8000 --output_dir tokenizers/multi30k-bpe8k

The command line of `hf_vanilla_transformer.training.tokenizer.train_shared_bpe`.
"""

import sys
from dataclasses import dataclass, field
from itertools import chain, islice

from hf_vanilla_transformer.cli.flags import FlagParser
from hf_vanilla_transformer.errors import exit_refused
from hf_vanilla_transformer.files import OutputDirRefused, atomic_output_dir, check_output_dir
from hf_vanilla_transformer.training.data import file_sentences, read_dataset
from hf_vanilla_transformer.training.tokenizer import (
    DEFAULT_NORMALIZATION,
    DEFAULT_VOCAB_SIZE,
    Normalization,
    train_shared_bpe,
)


@dataclass
class BpeTrainingArguments:
    output_dir: str = field(metadata={"help": "Folder to write the tokenizer to."})
    train_file: list[str] | None = field(
        default=None,
        metadata={"help": "Translation JSON lines (.json/.jsonl) or plain text files, one sentence a line."},
    )
    dataset_name: str | None = field(default=None, metadata={"help": "A `datasets` dataset (name or local path)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "The dataset's configuration."})
    dataset_split: str = field(default="train", metadata={"help": "The dataset split to train on."})
    source_lang: str = field(default="en", metadata={"help": "Source language key of translation rows."})
    target_lang: str = field(default="de", metadata={"help": "Target language key of translation rows."})
    vocab_size: int = field(
        default=DEFAULT_VOCAB_SIZE, metadata={"help": "Size of the shared vocabulary, special tokens included."}
    )
    min_frequency: int = field(default=2, metadata={"help": "Merge only pairs seen at least this often."})
    normalization: Normalization = field(
        default=DEFAULT_NORMALIZATION,
        metadata={"help": "Unicode normal form: NFKC, or NFC to keep full-width punctuation (Chinese) as written."},
    )
    split_han: bool = field(
        default=False, metadata={"help": "Make each Han (Chinese) character a token of its own: BPE never joins two."}
    )
    max_sentences: int | None = field(default=None, metadata={"help": "Train on at most this many sentences."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Replace a non-empty --output_dir."})


def main(argv: list[str] | None = None) -> None:
    try:
        (args,) = FlagParser(BpeTrainingArguments).parse_args_into_dataclasses(argv)
        train(args)
    except OutputDirRefused as error:
        exit_refused("train_bpe.py", error)
    except (ValueError, OSError) as error:
        sys.exit(f"train_bpe.py: error: {error}")


def train(args: BpeTrainingArguments) -> None:
    if (args.train_file is None) == (args.dataset_name is None):
        raise ValueError("give either --train_file or --dataset_name")
    check_output_dir(args.output_dir, args.overwrite_output_dir, reads=args.train_file or ())
    if args.train_file:
        sentences = file_sentences(args.train_file, args.source_lang, args.target_lang)
    else:
        sentences = chain.from_iterable(
            read_dataset(
                args.dataset_name, args.dataset_config_name, args.dataset_split, args.source_lang, args.target_lang
            )
        )
    tokenizer = train_shared_bpe(
        islice(sentences, args.max_sentences),
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        normalization=args.normalization,
        split_han=args.split_han,
    )
    with atomic_output_dir(args.output_dir, overwrite_output_dir=args.overwrite_output_dir) as staging:
        tokenizer.save_pretrained(staging)
    print(f"Saved a {len(tokenizer)}-token shared BPE vocabulary to {args.output_dir}")


if __name__ == "__main__":
    main()
