"""The benchmarks, grouped by what they measure: speed/, scale/ (memory and load), quality/, recipe/ and baselines/,
each module bench_NAME.py run as `python -m bench NAME`; helpers/ holds what they share and the scripts they call;
results/NAME/DATE[_LABEL].json their raw results."""
