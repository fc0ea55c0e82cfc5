"""hf_vanilla_transformer.translation.scoring, through vanilla-score: the n-best lists vanilla-translate writes as
jsonl, scored and aligned again on their own tokens, and the refusals of what cannot pair or be given."""

import json

import pytest

from hf_vanilla_transformer.cli.translate import main as translate_main
from support.steering import (
    strict_json,
)


@pytest.mark.parametrize("models", [("first",), ("first", "second")])
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("bfloat16", 0.0)])
def test_vanilla_score_of_the_tokens_jsonl_gives_is_the_n_best_lists_own(
    folders, tmp_path, capsys, models, dtype, tolerance
):
    """vanilla-translate --format jsonl, then vanilla-score on the tokens it wrote: every hypothesis' log-probability,
    score and alignment again, for a model or an ensemble; in bfloat16 the same kernels give the same figure."""
    from hf_vanilla_transformer.cli.score import main as score_main

    paths = [folders[name] for name in models]
    translated, scored = tmp_path / "out.jsonl", tmp_path / "scored.jsonl"
    model_and_input = ["--model", *paths, "--dtype", dtype]
    asked = ["--n_best", "3", "--format", "jsonl", "--alignments"]
    translate_main([*model_and_input, "--input", folders["input"], *asked])
    translated.write_text(capsys.readouterr().out)
    given = ["--source", folders["input"], "--target", str(translated), "--target_format", "jsonl", "--format", "jsonl"]
    score_main([*model_and_input, *given, "--alignments", "--output", str(scored)])
    for line, again in zip(translated.read_text().splitlines(), scored.read_text().splitlines(), strict=True):
        hypotheses, rescored = strict_json(line)["translations"], strict_json(again)["translations"]
        assert [h["tokens"] for h in rescored] == [h["tokens"] for h in hypotheses]
        assert [h["alignment"] for h in rescored] == [h["alignment"] for h in hypotheses]
        for field in ("log_probability", "score"):
            assert [h[field] for h in rescored] == pytest.approx([h[field] for h in hypotheses], abs=tolerance)
    # a length penalty of one's own, as marian-scorer and sockeye-score take it
    score_main([*model_and_input, *given, "--length_penalty", "1.0", "--output", str(scored)])
    for again in scored.read_text().splitlines():
        for hypothesis in strict_json(again)["translations"]:
            if hypothesis["tokens"]:
                assert hypothesis["score"] == pytest.approx(hypothesis["log_probability"] / len(hypothesis["tokens"]))


def test_vanilla_score_names_the_target_files_line_of_a_hypothesis_that_cannot_pair(folders, tmp_path, capsys):
    """A hypothesis with tokens for a blank source, or one without tokens for a sentence: an error naming the line
    of vanilla-translate's jsonl it is on, whatever hypotheses come before it."""
    from hf_vanilla_transformer.cli.score import main as score_main

    translated = tmp_path / "out.jsonl"
    translate_main(["--model", folders["first"], "--input", folders["input"], "--n_best", "2", "--format", "jsonl"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    rows[2] = rows[0]  # line 3's source is blank
    translated.write_text("".join(json.dumps(row) + "\n" for row in rows))
    given = ["--source", folders["input"], "--target", str(translated), "--target_format", "jsonl"]
    with pytest.raises(SystemExit) as stop:
        score_main(["--model", folders["first"], *given])
    assert stop.value.code != 0 and f"{translated}:3: the source is blank" in f"{stop.value.code}"


def test_vanilla_score_refuses_alignments_on_a_ctranslate2_folder(folders, tmp_path, capsys):
    from hf_vanilla_transformer.cli.score import main as score_main

    output = tmp_path / "out.txt"
    with pytest.raises(SystemExit) as stop:
        score_main(
            [
                "--model",
                folders["ctranslate2"],
                "--source",
                folders["input"],
                "--target",
                folders["input"],
                "--alignments",
                "--output",
                str(output),
            ]
        )
    assert stop.value.code == 2 and "argument --alignments: for model folders" in capsys.readouterr().err
    assert not output.exists()
