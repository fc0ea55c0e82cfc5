"""Translating and scoring files of lines with any engine: the lines in, sorted into batches and checked (lines.py),
the per-line steering files (steering_files.py), given translations scored (scoring.py), and the one output module
for what the commands write (output.py).

May import model/, decoding/, engines/ and the base modules; never export/, inspection/ or sharing/.
"""
