"""The command lines, one module a command: the console scripts (vanilla-translate, vanilla-attention,
vanilla-average-checkpoints, vanilla-export-ctranslate2, vanilla-export-marian, vanilla-push-to-hub), the top-level
scripts' bodies (run_translation.py, train_bpe.py), and what they share (flags.py). Each is also
`python -m hf_vanilla_transformer.cli.NAME`.
"""
