"""Exports of a trained folder, a module a format: CTranslate2 (ctranslate2.py), transformers' Marian (marian.py) and
ONNX (onnx.py).

May import model/, decoding/, engines/ (the formats' names), sharing/ (the export's card) and the base modules.
"""
