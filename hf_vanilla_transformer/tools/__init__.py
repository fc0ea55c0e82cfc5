"""What one does with a trained model folder: translate files (translate.py, translator.py), steered
(steering_files.py, prefix.py, words.py, constraints.py, avoid.py, alignment.py, ensemble.py, scoring.py), export it
to CTranslate2, Marian or ONNX (export_ctranslate2.py, export_marian.py, export_onnx.py, with the engines
ctranslate2_runtime.py and onnx_runtime.py), look inside it (inspection.py, visualize.py), write its card (card.py,
markdown.py) and push it to the Hub (hub.py). Nothing here imports training or the command lines.
"""
