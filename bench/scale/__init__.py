"""Memory and time as the inputs and the load grow.

- bench_memory: a training step's peak memory at two presets, with and without gradient checkpointing.
- bench_nbest_memory: vanilla-translate's peak memory as --n_best grows.
- bench_big_data: run_translation.py's data path on a big corpus against the stock example's.
- bench_under_load: vanilla-translate on many lines, and the demo answering many requests at once.
- bench_demo: the demo's memory and time under its longest request, once and queued.
"""
