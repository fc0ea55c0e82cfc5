"""What a transformers user gets without this project, on the same data, machine and time.

- bench_stock_marian_translation: MarianMTModel of our small size trained by the stock Seq2SeqTrainer recipe.
"""
