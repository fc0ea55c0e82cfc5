"""hf_vanilla_transformer.translation.output, through vanilla-translate: the jsonl format holds every hypothesis with
its tokens and their log-probabilities, n-best lists come best first, and every figure written is a number."""

import json
import math

import pytest

from support.steering import (
    SOURCES,
    nbest_rows,
    strict_json,
    translate_input,
)


def test_jsonl_holds_every_hypothesis_with_tokens_and_their_log_probabilities(folders, capsys):
    status, lines, err = translate_input(capsys, folders, "--n_best", "2", "--format", "jsonl")
    assert status == 0, err
    objects = [json.loads(line) for line in lines]
    assert len(objects) == len(SOURCES)
    assert objects[2] == {
        "translations": [{"translation": "", "score": 0.0, "log_probability": 0.0, "tokens": [], "token_log_probs": []}]
    }
    for found in objects[:2] + objects[3:]:
        assert len(found["translations"]) == 2
        for hypothesis in found["translations"]:
            assert hypothesis["tokens"][-1] == "</s>"
            assert len(hypothesis["tokens"]) == len(hypothesis["token_log_probs"])
            assert math.fsum(hypothesis["token_log_probs"]) == pytest.approx(hypothesis["log_probability"])
            assert " ".join(t for t in hypothesis["tokens"] if t != "</s>") == hypothesis["translation"]


def test_sampled_n_best_lists_are_best_first_and_every_figure_is_a_number(folders, capsys):
    status, lines, err = translate_input(capsys, folders, "--do_sample", "--seed", "4", "--n_best", "4")
    assert status == 0, err
    rows = nbest_rows(lines)
    for number in {number for number, *_ in rows}:
        scores = [score for n, _, score, _ in rows if n == number]
        assert scores == sorted(scores, reverse=True) and all(map(math.isfinite, scores))
    status, lines, err = translate_input(
        capsys, folders, "--do_sample", "--seed", "4", "--n_best", "4", "--format", "jsonl"
    )
    for line in lines:
        hypotheses = strict_json(line)["translations"]
        assert [h["score"] for h in hypotheses] == sorted((h["score"] for h in hypotheses), reverse=True)


def test_constrained_n_best_rows_are_only_hypotheses_that_hold_the_terms(folders, tmp_path, capsys):
    """A row the search could not fill with a hypothesis that holds the terms is left out, never printed as -inf."""
    constraints = [["j"], [], [], ["a b c d"], ["b"]]
    (tmp_path / "terms.jsonl").write_text("\n".join(map(json.dumps, constraints)) + "\n")
    flags = ("--constraints", str(tmp_path / "terms.jsonl"), "--n_best", "4")
    status, lines, err = translate_input(capsys, folders, *flags, "--format", "jsonl")
    assert status == 0, err
    for line, terms in zip(lines, constraints, strict=True):
        for hypothesis in strict_json(line)["translations"]:
            assert all(f" {term} " in f" {hypothesis['translation']} " for term in terms)
            assert math.isfinite(hypothesis["score"]) and "<pad>" not in hypothesis["tokens"]
