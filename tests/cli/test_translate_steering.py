"""vanilla-translate's steering: n-best lists with scores, prefixes, terminology constraints, alignments, ensembles
and sampling, on every route that has them (our model's generate(), CTranslate2, ONNX Runtime), and the refusals
of what a route or an input cannot give: one line naming the file and line, exit status 2, nothing written.

The same tiny folders (`folders`, support/steering.py) serve the tests of the modules vanilla-translate runs: the
engines' (engines/test_registry.py, test_generate.py, test_ctranslate2.py), translation's (translation/test_lines.py,
test_output.py, test_scoring.py, test_steering_files.py) and the prefix processor's (decoding/test_prefix.py)."""

import json
import sys

import pytest

from hf_vanilla_transformer.cli.translate import main as translate_main
from hf_vanilla_transformer.decoding.alignment import align
from hf_vanilla_transformer.decoding.forced_decoding import score_translations
from hf_vanilla_transformer.engines.registry import load_translator
from support.steering import (
    SOURCES,
    nbest_rows,
    translate_input,
)


def test_n_best_lists_are_ranked_scored_and_scores_are_the_models_own(folders, capsys):
    """`--n_best 3`: three hypotheses a line, best first, each score the beam's (length penalty applied) and each
    log-probability what vanilla-score's function gives the same pair (forced decoding)."""
    status, lines, err = translate_input(capsys, folders, "--n_best", "3")
    assert status == 0, err
    rows = nbest_rows(lines)
    assert [number for number, *_ in rows] == [0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 4, 4, 4]  # the blank line: one empty
    model_folder = folders["first"]
    translator = load_translator(model_folder, "cpu", "float32")
    pairs = [(SOURCES[number], text) for number, text, *_ in rows if SOURCES[number]]
    scored = score_translations(translator.model, translator.tokenizer, *map(list, zip(*pairs, strict=True)))
    given = [log_probability for number, _, _, log_probability in rows if SOURCES[number]]
    assert [round(s.log_probability, 4) for s in scored] == pytest.approx(given, abs=2e-4)
    for number in {number for number, *_ in rows}:
        scores = [score for n, _, score, _ in rows if n == number]
        assert scores == sorted(scores, reverse=True)
    # the ranking score: log-probability over the generated length to the power of the length penalty (0.6)
    for (_, _, score, log_probability), result in zip([r for r in rows if SOURCES[r[0]]], scored, strict=True):
        assert score == pytest.approx(log_probability / len(result.token_log_probs) ** 0.6, abs=2e-4)


@pytest.mark.parametrize("decoding", [["--num_beams", "1"], [], ["--do_sample", "--seed", "3", "--top_k", "5"]])
def test_every_translation_starts_with_its_lines_prefix(folders, tmp_path, capsys, decoding):
    prefixes = ["a b", "", "", "j j j", "c"]
    (tmp_path / "prefix.txt").write_text("\n".join(prefixes) + "\n")
    status, lines, err = translate_input(capsys, folders, "--prefix", str(tmp_path / "prefix.txt"), *decoding)
    assert status == 0, err
    for source, prefix, line in zip(SOURCES, prefixes, lines, strict=True):
        if source:
            assert line.startswith(prefix), (prefix, line)
            assert len(line.split()) > len(prefix.split())  # the model goes on from the prefix (it never ends early)


def test_a_seeded_sample_is_the_same_twice_and_another_seed_differs(folders, capsys):
    runs = {}
    for seed in ("1", "1", "2"):
        status, lines, err = translate_input(capsys, folders, "--do_sample", "--seed", seed, "--n_best", "3")
        assert status == 0, err
        runs.setdefault(seed, []).append(lines)
    assert runs["1"][0] == runs["1"][1]
    assert runs["1"][0] != runs["2"][0]


def test_an_ensemble_of_a_model_with_itself_translates_as_the_model(folders, capsys):
    outputs = []
    for models in (("first",), ("first", "first")):
        status, lines, err = translate_input(capsys, folders, "--n_best", "2", models=models)
        assert status == 0, err
        outputs.append(nbest_rows(lines))
    assert [row[:2] for row in outputs[0]] == [row[:2] for row in outputs[1]]
    assert [row[2:] for row in outputs[0]] == pytest.approx([row[2:] for row in outputs[1]], abs=2e-4)
    status, lines, err = translate_input(capsys, folders, models=("first", "second"))
    assert status == 0 and len(lines) == len(SOURCES), err


@pytest.mark.parametrize("models", [("first",), ("first", "second")])
def test_constraints_appear_in_every_hypothesis_of_a_model_or_an_ensemble(folders, tmp_path, capsys, models):
    constraints = [["j j"], [], [], ["c", "d e"], ["a"]]
    (tmp_path / "terms.jsonl").write_text("\n".join(map(json.dumps, constraints)) + "\n")
    terms = str(tmp_path / "terms.jsonl")
    status, lines, err = translate_input(capsys, folders, "--constraints", terms, "--n_best", "2", models=models)
    assert status == 0, err
    for number, text, *_ in nbest_rows(lines):
        for phrase in constraints[number]:
            assert f" {phrase} " in f" {text} ", (phrase, text)


def test_alignments_are_those_of_the_models_attention_on_each_translation(folders, capsys):
    """`--alignments` adds `align`'s word pairs (decoding/alignment.py) of each source and its translation, within the
    two sentences' words; on CTranslate2, from its attention, the same pairs."""
    translator = load_translator(folders["first"], "cpu", "float32")
    for name in ("first", "ctranslate2"):
        status, lines, err = translate_input(capsys, folders, "--alignments", models=(name,))
        assert status == 0, err
        for source, line in zip(SOURCES, lines, strict=True):
            translation, alignment = line.split(" ||| ")
            pairs = [tuple(map(int, pair.split("-"))) for pair in alignment.split()]
            assert all(0 <= i < len(source.split()) and 0 <= j < len(translation.split()) for i, j in pairs)
            assert bool(pairs) == bool(source)
            (expected,) = align(translator.aligner, translator.tokenizer, [source], [translation])
            assert pairs == expected


def read_line_within(stream, seconds: float) -> str:
    """The next line of a pipe, or a failure if none comes within `seconds`."""
    import select

    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, f"no line within {seconds} s"
    return stream.readline().rstrip("\n")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_alignments_never_change_the_translation(folders, tmp_path, capsys, dtype):
    """The translations with --alignments are those without, in either dtype (the alignments are read from an eager
    copy of the model), a line longer than the model's positions included: aligned as it was translated."""
    lines = [*SOURCES, " ".join(["a", "b", "c"] * 60)]  # 180 tokens, more than the 128 positions
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    outputs = []
    for flags in ([], ["--alignments"]):
        capsys.readouterr()
        translate_main(["--model", folders["first"], "--input", str(source), "--dtype", dtype, *flags])
        outputs.append(capsys.readouterr().out.splitlines())
    plain, aligned = outputs
    assert [line.split(" ||| ")[0] for line in aligned] == plain
    last = [tuple(map(int, pair.split("-"))) for pair in aligned[-1].split(" ||| ")[1].split()]
    assert last and max(i for i, _ in last) < 128  # the words of the line's start that was translated


@pytest.mark.parametrize("route", ["first", "ctranslate2", "ensemble"])
@pytest.mark.parametrize("decoding", [[], ["--num_beams", "1"], ["--do_sample", "--seed", "1"]])
def test_avoided_words_appear_in_no_translation_on_any_route(folders, tmp_path, capsys, route, decoding):
    path = tmp_path / "avoid.jsonl"
    baseline = translate_input(capsys, folders, *decoding)[1]
    avoided = sorted({word for line in baseline for word in line.split()})[:3]
    path.write_text(json.dumps(avoided[:2]) + "\n" + json.dumps(avoided[2]) + "\n")
    models = ("first", "second") if route == "ensemble" else (route,)
    status, lines, err = translate_input(capsys, folders, "--avoid", str(path), *decoding, models=models)
    assert status == 0, err
    assert len(lines) == len(SOURCES) and lines != baseline
    for line in lines:
        assert not set(line.split()) & set(avoided), (avoided, line)


def test_constraints_match_inside_words_when_asked(folders, tmp_path, capsys):
    """A word-level tokenizer writes every token as a word: whole words and subwords agree there; the option is
    passed through and checked."""
    path = tmp_path / "terms.jsonl"
    path.write_text('["j"]\n[]\n[]\n["c"]\n[]\n')
    for match in ("word", "subword"):
        status, lines, err = translate_input(capsys, folders, "--constraints", str(path), "--constraint_match", match)
        assert status == 0, err
        assert "j" in lines[0].split() and "c" in lines[3].split()
    status, _, err = translate_input(capsys, folders, "--constraints", str(path), "--constraint_match", "letters")
    assert status == 2 and "argument --constraint_match: invalid choice" in err


def test_standard_input_is_translated_line_by_line_as_it_comes(folders):
    """A program writes a line, waits for its translation, then writes the next: with --buffer_size 1 each
    translation comes before the next line is written (a timeout otherwise)."""
    import subprocess

    command = [
        sys.executable,
        "-m",
        "hf_vanilla_transformer.cli.translate",
        "--model",
        folders["first"],
        "--buffer_size",
        "1",
        "--num_beams",
        "1",
        "--n_best",
        "1",
    ]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    try:
        answers = []
        for line in ("a b c", "", "j i h"):
            process.stdin.write(line + "\n")
            process.stdin.flush()
            answers.append(read_line_within(process.stdout, 60))
        process.stdin.close()
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()
    # each line's n-best list as it comes, numbered as in the whole input; a blank line's one empty hypothesis
    assert answers[0].startswith("0 ||| ") and answers[1] == "1 |||  ||| 0.0000 ||| 0.0000"
    assert answers[2].startswith("2 ||| ")
