"""The command lines, one module a command: the console scripts (vanilla-translate: translate.py, vanilla-score:
score.py, vanilla-attention: attention.py, vanilla-average-checkpoints: average_checkpoints.py,
vanilla-export-ctranslate2: export_ctranslate2.py, vanilla-export-marian: export_marian.py, vanilla-export-onnx:
export_onnx.py, vanilla-push-to-hub: push_to_hub.py), the top-level scripts' bodies (run_translation.py,
train_bpe.py), and what they share (flags.py). Each is also `python -m hf_vanilla_transformer.cli.NAME`.
May import every folder but tools/; nothing imports it.
"""
