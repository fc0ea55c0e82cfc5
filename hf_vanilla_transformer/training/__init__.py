"""Training with the paper's recipe (Section 5) on transformers' Trainer: the settings (arguments.py), token-budget
batches (batches.py), the label-smoothed loss (loss.py), the trainer (trainer.py) and its callbacks (callbacks.py), a
run's checkpoints and their average (checkpoints.py), translation data (data.py), the shared BPE (tokenizer.py),
sacreBLEU (metrics.py), and a whole run as run_translation.py drives it (run.py). Imports model/ and the base modules
only.
"""
