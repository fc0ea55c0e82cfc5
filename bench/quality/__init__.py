"""What a feature does to the translations (BLEU, terms met, alignment error), beside its cost.

- bench_constraints: terminology constraints against plain beam search.
- bench_alignments: word alignments from the attention against eflomal's.
- bench_ensemble: an ensemble of trained models against each model alone.
- bench_marian_export: the Marian export translates as our model does.
- bench_tokenizer_chinese: what the shared byte-level BPE does with Chinese.
"""
