"""The engines that translate a folder, behind one interface: `Translator`, with what each declares it can do
(base.py); our model's `generate()` and ensembles (generate.py); CTranslate2 (ctranslate2.py); ONNX Runtime (onnx.py);
and the one table of engines that picks, checks and loads a folder's (registry.py).

May import model/, decoding/ and the base modules; export/ reads the engines' format names, never the reverse.
"""
