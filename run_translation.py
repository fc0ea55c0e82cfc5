#!/usr/bin/env python
"""Train the Transformer of "Attention Is All You Need" from scratch (or fine-tune one) with Seq2SeqTrainer.

    python run_translation.py recipes/multi30k_small.yaml
    python run_translation.py recipes/multi30k_small.yaml --output_dir runs/mine --max_train_minutes 10
    python run_translation.py --train_file train.jsonl --validation_file dev.jsonl --source_lang en \\
        --target_lang de --preset small --output_dir runs/flags --do_train --do_eval --predict_with_generate

The flags of transformers' examples/pytorch/translation/run_translation.py, with the paper's recipe as their
defaults; `--help` lists them. The command lives in hf_vanilla_transformer/cli/run_translation.py.
"""

from hf_vanilla_transformer.cli.run_translation import main

if __name__ == "__main__":
    main()
