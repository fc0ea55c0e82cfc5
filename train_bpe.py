#!/usr/bin/env python
"""Train the shared source/target BPE vocabulary and save it as a tokenizer that AutoTokenizer loads.

    python train_bpe.py --train_file ../shared/data/multi30k/train.jsonl --source_lang en --target_lang de \\
        --vocab_size 8000 --output_dir tokenizers/multi30k-bpe8k

The command lives in hf_vanilla_transformer/cli/train_bpe.py.
"""

from hf_vanilla_transformer.cli.train_bpe import main

if __name__ == "__main__":
    main()
