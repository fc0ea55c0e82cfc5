"""Decoding features, each apart from the search that uses it: what is asked and what comes back (request.py), words
and phrases in tokens (words.py), target prefixes (prefix.py), terminology constraints and the constrained beam search
(constraints.py), phrases to avoid (avoid.py), word alignments from attention (alignment.py), ensembles (ensemble.py),
and the score of given translations by forced decoding (forced_decoding.py).

May import model/ and the base modules only; the engines build on it.
"""
