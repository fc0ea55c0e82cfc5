"""What the benchmarks share or call, none of them a benchmark (`python -m bench` does not list them); each script
runs as `python -m bench.helpers.NAME`.

- common: machine description, interleaved timing, the results files' paths, shared data, models and steps.
- make_big_corpus: a big synthetic corpus made from Multi30k, for bench_big_data.
- stock_data_path: transformers' stock example's data path, which bench_big_data runs beside ours.
- compare_translations: scores translation files against a test set, with and without the punctuation question.
"""
