"""Former import paths, kept for one release: each module re-exports what moved to its new home (CHANGELOG.md).

alignment.py, avoid.py, constraints.py, ensemble.py, prefix.py, words.py (now decoding/); translator.py
(decoding/request.py, engines/base.py); ctranslate2_runtime.py, onnx_runtime.py (engines/); translate.py (engines/,
translation/); scoring.py (decoding/forced_decoding.py, translation/scoring.py); steering_files.py (translation/);
export_ctranslate2.py, export_marian.py, export_onnx.py (export/); inspection.py, visualize.py (inspection/);
card.py, markdown.py, hub.py (sharing/). Nothing in the package imports them.
"""
