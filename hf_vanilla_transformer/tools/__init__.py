"""What one does with a trained model folder: translate files (translate.py), export it to CTranslate2 or Marian
(export_ctranslate2.py, export_marian.py), look inside it (inspection.py, visualize.py), write its card (card.py) and
push it to the Hub (hub.py). Nothing here imports training or the command lines.
"""
