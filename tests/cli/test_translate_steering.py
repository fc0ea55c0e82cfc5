"""vanilla-translate's steering: n-best lists with scores, prefixes, terminology constraints, alignments, ensembles
and sampling, on every route that has them (our model's generate(), CTranslate2, ONNX Runtime), and the refusals
of what a route or an input cannot give: one line naming the file and line, exit status 2, nothing written."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from hf_vanilla_transformer.cli.translate import main as translate_main
from hf_vanilla_transformer.decoding.alignment import align
from hf_vanilla_transformer.decoding.forced_decoding import score_translations
from hf_vanilla_transformer.decoding.prefix import PrefixLogitsProcessor
from hf_vanilla_transformer.decoding.request import Steering
from hf_vanilla_transformer.engines.ctranslate2 import is_ctranslate2_folder
from hf_vanilla_transformer.engines.onnx import is_onnx_folder
from hf_vanilla_transformer.engines.registry import load_translator, translator_kind
from hf_vanilla_transformer.export.ctranslate2 import export as export_ctranslate2
from hf_vanilla_transformer.formats import ONNX_FOLDER
from hf_vanilla_transformer.model.modeling_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.translation.lines import translate_lines_in_full
from support.models import german_tokenizer, letter_tokenizer, tiny_model
from support.tokenizing import LongestText

SOURCES = ["a b c d e f", "j i h", "", "b", "c c c c c c c"]


def save_tiny(folder, seed: int = 0, **overrides) -> str:
    """A tiny random model with the letter tokenizer and the paper's decoding (beam 4), saved in `folder`. One head
    count (CTranslate2 needs it). `<s>`, `<pad>` and `<unk>` are never generated, so that every translation's text
    tokenizes back into its tokens (a random model would write them)."""
    model = tiny_model(seed, **{"vocab_size": 14, "decoder_attention_heads": 4, **overrides})
    model.generation_config = paper_generation_config(model.config)
    model.generation_config.suppress_tokens = [0, 1, 3]
    model.save_pretrained(folder)
    letter_tokenizer().save_pretrained(folder)
    return str(folder)


def onnx_folder_in_name_only(folder) -> str:
    """A folder vanilla-translate takes for an ONNX export (tests/test_export_onnx.py translates a real one): what
    the route cannot give is refused before anything in it is read."""
    (folder / ONNX_FOLDER).mkdir(parents=True)
    (folder / ONNX_FOLDER / "decoder_model_merged.onnx").write_bytes(b"")
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Two tiny model folders of different seeds, the first's CTranslate2 export, a folder taken for an ONNX export,
    and an input file."""
    root = tmp_path_factory.mktemp("steering")
    first = save_tiny(root / "first")
    (root / "in.txt").write_text("\n".join(SOURCES) + "\n")
    return {
        "first": first,
        "second": save_tiny(root / "second", seed=1),
        "ctranslate2": export_ctranslate2(first, str(root / "ct2"), "float32"),
        "onnx": onnx_folder_in_name_only(root / "onnx"),
        "input": str(root / "in.txt"),
    }


def translate(capsys, *args: str) -> tuple[int, list[str], str]:
    """vanilla-translate in this process: exit status, lines written to standard output, standard error. A model
    folder is translated in float32 (the default is bfloat16 on a CPU with bf16 units), as the tests compare."""
    model = args[args.index("--model") + 1]
    exported = is_ctranslate2_folder(model) or is_onnx_folder(model)
    capsys.readouterr()
    try:
        translate_main([*args, *([] if exported else ["--dtype", "float32"])])
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def translate_input(capsys, folders, *flags: str, models: tuple[str, ...] = ("first",)):
    """`translate` of the fixture's input file with the fixture's `models` (names in `folders`) and `flags`."""
    return translate(capsys, "--model", *(folders[name] for name in models), "--input", folders["input"], *flags)


def nbest_rows(lines: list[str]) -> list[tuple[int, str, float, float]]:
    rows = []
    for line in lines:
        number, text, score, log_probability = line.split(" ||| ")
        rows.append((int(number), text, float(score), float(log_probability)))
    return rows


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


def test_the_prefix_processor_keeps_the_models_score_of_the_forced_token():
    scores = torch.log_softmax(torch.randn(4, 14), -1)
    processed = PrefixLogitsProcessor([[5, 6], []])(torch.zeros(4, 1, dtype=torch.long), scores.clone())
    # two rows a sentence (beams): the first sentence's rows keep token 5 alone, the second's are as they were
    assert torch.equal(processed[:2, 5], scores[:2, 5]) and torch.isinf(processed[:2, :5]).all()
    assert torch.equal(processed[2:], scores[2:])


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
    """`--alignments` adds `align`'s word pairs (tools/alignment.py) of each source and its translation, within the
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


def test_ctranslate2_scores_n_best_lists_prefixes_and_samples_as_our_model_does(folders):
    """The same requests on the CTranslate2 export: each hypothesis' tokens and log-probabilities are what our
    model gives the same pair, the prefixes start them, and a seed gives the same samples again."""
    ours, theirs = load_translator(folders["first"], "cpu", "float32"), load_translator(folders["ctranslate2"], "cpu")
    prefixes = ["a", "", "", "j", ""]
    found = translate_lines_in_full(theirs, SOURCES, 8, {}, False, Steering(n_best=2, scores=True, prefixes=prefixes))
    pairs = [(source, h) for source, hs in zip(SOURCES, found, strict=True) if source for h in hs]
    scored = score_translations(ours.model, ours.tokenizer, [s for s, _ in pairs], [h.text for _, h in pairs])
    assert [h.tokens for _, h in pairs] == [ours.tokenizer.convert_ids_to_tokens(s.token_ids) for s in scored]
    assert [h.log_probability for _, h in pairs] == pytest.approx([s.log_probability for s in scored], abs=1e-4)
    for source, prefix, hypotheses in zip(SOURCES, prefixes, found, strict=True):
        assert len(hypotheses) == (2 if source else 1) and all(h.text.startswith(prefix) for h in hypotheses)
    for name in ("first", "ctranslate2"):
        samples = []
        for _ in range(2):  # seeded before the translator starts, as vanilla-translate seeds
            translator_kind([folders[name]]).set_seed(7)
            translator = load_translator(folders[name], "cpu")
            sample = translate_lines_in_full(translator, SOURCES, 8, {"do_sample": True, "num_beams": 1}, False)
            samples.append([[h.text for h in hs] for hs in sample])
        assert samples[0] == samples[1]


@pytest.mark.parametrize(
    "route, flags, message",
    [
        ("ctranslate2", ["--constraints", "IN"], "is translated by CTranslate2, which cannot give constraints"),
        ("onnx", ["--n_best", "2"], "is translated by ONNX Runtime (greedy), which cannot give n_best"),
        ("onnx", ["--alignments"], "which cannot give alignments"),
        ("onnx", ["--do_sample"], "which cannot give do_sample"),
        ("ctranslate2", ["--model", "FIRST"], "is an export; only model folders decode together as an ensemble"),
        ("first", ["--n_best", "5", "--num_beams", "2"], "argument --n_best: 5 is more than --num_beams 2"),
        ("first", ["--top_k", "5"], "argument --top_k: only with --do_sample"),
        ("first", ["--top_p", "1.5"], "argument --top_p: 1.5 must be above 0 and at most 1"),
        ("first", ["--temperature", "0"], "argument --temperature: 0.0 must be above 0"),
    ],
)
def test_what_a_route_or_flag_cannot_give_is_one_line_and_exit_2(folders, tmp_path, capsys, route, flags, message):
    flags = [{"IN": folders["input"], "FIRST": folders["first"]}.get(flag, flag) for flag in flags]
    output = tmp_path / "out.txt"
    status, _, err = translate_input(capsys, folders, "--output", str(output), *flags, models=(route,))
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not output.exists()


@pytest.mark.parametrize(
    "flag, content, message",
    [
        ("--prefix", "a\nb\n", "{path}: 2 line(s) for the 5 of {input}"),
        ("--constraints", '["a"]\n', "{path}: 1 line(s) for the 5 of {input}"),
        ("--constraints", '[]\n["a"\n[]\n[]\n[]\n', "{path}:2: not valid JSON"),
        ("--constraints", '[]\n{"a": 1}\n[]\n[]\n[]\n', "{path}:2: {{'a': 1}} is not a JSON list of strings"),
        ("--constraints", '[]\n[" "]\n[]\n[]\n[]\n', "{path}:2: "),
        ("--constraints", '[]\n[]\n[]\n["' + "a " * 60 + '"]\n[]\n', "{path}:4: the constraints' 60 tokens"),
        ("--prefix", "\n\n\n" + "a " * 60 + "\n\n", "{path}:4: the prefix's 60 tokens"),
    ],
)
def test_a_bad_prefix_or_constraints_file_is_one_line_naming_file_and_line(
    folders, tmp_path, capsys, flag, content, message
):
    path, output = tmp_path / "steer.txt", tmp_path / "out.txt"
    path.write_text(content)
    status, _, err = translate_input(capsys, folders, "--output", str(output), flag, str(path))
    assert status == 2, err
    assert message.format(path=path, input=folders["input"]) in err and len(err.strip().splitlines()) == 1, err
    assert not output.exists()


def test_models_that_cannot_decode_together_are_one_line_naming_both_folders(folders, tmp_path, capsys):
    other = save_tiny(tmp_path / "other", vocab_size=15)
    output = tmp_path / "out.txt"
    status, _, err = translate(
        capsys, "--model", folders["first"], other, "--input", folders["input"], "--output", str(output)
    )
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{folders['first']} and {other} differ in vocab_size (14 vs 15)" in err
    assert not output.exists()


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


def test_a_10_mb_line_is_cut_before_it_is_tokenized_and_translated_from_its_start(folders, caplog):
    """Only its first max_positions tokens are translated: the line is cut to a start that holds them before the
    tokenizer sees it, and translates as that start does."""
    translator = load_translator(folders["first"], "cpu")
    translator.tokenizer = LongestText(translator.tokenizer)
    long_line = "a bc " * 2_000_000  # 10 MB, with words the cut could split
    start = " ".join(long_line.split()[:200])  # 300 tokens, more than the 128 positions
    found = translate_lines_in_full(translator, [SOURCES[0], long_line, start], 4, {"num_beams": 1}, False)
    assert found[1][0].text == found[2][0].text and found[0][0].text != found[1][0].text
    assert translator.tokenizer.longest <= 2 * 128 * len("<unk>")  # the positions times the longest token, doubled
    assert "2 line(s) have more tokens than the model's 128 positions" in caplog.text


def test_a_10_mb_word_is_cut_inside_before_it_is_tokenized_and_translated_from_its_start(tmp_path, caplog):
    """A word with no space near enough to cut at is cut inside: a byte-level BPE (the tokenizer this project
    trains) spells every character, so the cut holds the positions' tokens and the tokenizer never sees more than
    twice the positions times the longest token, whether the line is one word or a word after a short one."""
    tokenizer, _ = german_tokenizer()
    tiny_model(vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    translator = load_translator(str(tmp_path), "cpu")
    translator.tokenizer = LongestText(translator.tokenizer)
    word = "b" * 10_000_000
    starts = [word[:2000], "A " + word[:2000]]  # more than the 128 positions' tokens
    found = translate_lines_in_full(translator, [word, "A " + word, *starts, "Ein Hund"], 4, {"num_beams": 1}, False)
    texts = [hypotheses[0].text for hypotheses in found]
    assert texts[:2] == texts[2:4] and texts[0] != texts[1] != texts[4]
    assert translator.tokenizer.longest <= 2 * 128 * max(map(len, tokenizer.get_vocab()))
    assert "4 line(s) have more tokens than the model's 128 positions" in caplog.text


def read_line_within(stream, seconds: float) -> str:
    """The next line of a pipe, or a failure if none comes within `seconds`."""
    import select

    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, f"no line within {seconds} s"
    return stream.readline().rstrip("\n")


def strict_json(line: str):
    """A JSON line as a strict parser reads it: `Infinity` and `NaN` are no JSON."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


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


def test_every_route_scores_a_prefix_as_part_of_the_translation(folders):
    """One convention for n-best scores: the whole output's log-probability, a prefix's tokens and `</s>` included,
    over its length to the power of the length penalty; CTranslate2's agree with ours on the same hypotheses."""
    prefixes = ["a", "", "", "j", ""]
    steering = Steering(n_best=2, scores=True, prefixes=prefixes)
    for name in ("first", "ctranslate2"):
        translator = load_translator(folders[name], "cpu", "float32" if name == "first" else "auto")
        for hypotheses in translate_lines_in_full(translator, SOURCES, 8, {}, False, steering):
            for hypothesis in hypotheses:
                if hypothesis.tokens:
                    expected = math.fsum(hypothesis.token_log_probs) / len(hypothesis.tokens) ** 0.6
                    assert hypothesis.score == pytest.approx(expected, abs=1e-5)
            assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)


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


BAD_TERMS = [
    ('["</s>"]', "holds '</s>', which is markup, not text"),
    ('["<unk>"]', "holds '<unk>', which is markup, not text"),
    ('["a <s>"]', "holds '<s>', which is markup, not text"),
    ('["a", 3]', "int 3 is not a string"),
    ('"a"', "'a' is not a JSON list of strings"),
    ("[" * 100_000 + "]" * 100_000, "not a JSON list of strings (JSON nested too deeply to read)"),
    ('["\\ud800"]', "is not Unicode text (a lone surrogate '\\ud800' at character 1)"),
    ('["\\u200b\\u200b"]', "has no visible characters"),
    ('["a\\u0000b"]', "holds the control character '\\x00'"),
]


@pytest.mark.parametrize(
    "flag, line, message",
    [
        (flag, line, message)
        for flag in ("--constraints", "--avoid")
        for line, message in BAD_TERMS
        if not (flag == "--avoid" and line == '"a"')  # one string a line is an avoid file's own form
    ],
)
def test_a_bad_term_is_one_line_naming_file_and_line_before_any_model_loads(
    folders, tmp_path, capsys, flag, line, message
):
    """Refused before the weights are read: the folder's weights here are broken, and the error is the file's."""
    broken = tmp_path / "model"
    broken.mkdir()
    for file in os.listdir(folders["first"]):
        (broken / file).write_bytes((Path(folders["first"]) / file).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not weights")
    path, output = tmp_path / "terms.jsonl", tmp_path / "out.txt"
    path.write_text("[]\n" + line + "\n[]\n[]\n[]\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        translate_main(["--model", str(broken), "--input", folders["input"], "--output", str(output), flag, str(path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"{path}:2: " in err and message in err and len(err.strip().splitlines()) == 1, err
    assert not output.exists()


def test_special_tokens_or_markup_in_a_prefix_are_refused(folders, tmp_path, capsys):
    path = tmp_path / "prefix.txt"
    path.write_text("a\n\n\nj </s>\n\n")
    status, _, err = translate_input(capsys, folders, "--prefix", str(path))
    assert status == 2 and f"{path}:4: 'j </s>' holds '</s>', which is markup, not text" in err, err


def test_terms_for_a_blank_line_are_a_warning_and_a_healthy_run_has_none(folders, tmp_path, capsys, caplog):
    path = tmp_path / "terms.jsonl"
    path.write_text('["j"]\n[]\n[]\n[]\n[]\n')
    status, _, _ = translate_input(capsys, folders, "--constraints", str(path))
    assert status == 0 and not [record for record in caplog.records if record.levelname == "WARNING"]
    path.write_text('["j"]\n[]\n["a"]\n[]\n[]\n')
    status, _, _ = translate_input(capsys, folders, "--constraints", str(path))
    assert status == 0 and f"{path}:3: given for a blank line of input, which is not translated" in caplog.text


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


def test_a_term_or_prefix_that_holds_an_avoided_word_is_refused(folders, tmp_path, capsys):
    (tmp_path / "avoid.jsonl").write_text('"j"\n')
    (tmp_path / "terms.jsonl").write_text('["j i"]\n[]\n[]\n[]\n[]\n')
    (tmp_path / "prefix.txt").write_text("\n\n\nb j\n\n")
    avoid = ("--avoid", str(tmp_path / "avoid.jsonl"))
    status, _, err = translate_input(capsys, folders, *avoid, "--constraints", str(tmp_path / "terms.jsonl"))
    assert status == 2 and f"terms.jsonl:1: 'j i' holds 'j', which {tmp_path / 'avoid.jsonl'} bars" in err, err
    status, _, err = translate_input(capsys, folders, *avoid, "--prefix", str(tmp_path / "prefix.txt"))
    assert status == 2 and "prefix.txt:4: 'b j' holds 'j'" in err, err


def test_a_long_n_best_list_is_searched_a_few_sentences_at_a_time_and_one_that_cannot_fit_is_refused(
    folders, capsys, monkeypatch
):
    """The search's memory is bounded: with room for 4 sentences' hypotheses in `SEARCH_MEMORY`, 32 sentences go
    through 8 searches of 4 (the encoder sees those batches, and the forced decoding that scores their 40 hypotheses
    each), and every sentence gets its list; a request that cannot fit one sentence on this machine is refused,
    naming the memory it needs."""
    from hf_vanilla_transformer.engines import generate

    translator = load_translator(folders["first"], "cpu", "float32")
    lines = [source for source in SOURCES if source] * 8
    longest = max(len(ids) for ids in translator.tokenizer(lines)["input_ids"])
    monkeypatch.setattr(generate, "SEARCH_MEMORY", 4 * translator.search_bytes(1, longest, 40))
    batches = []
    hook = translator.model.get_encoder().register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        found = translate_lines_in_full(
            translator, lines, 32, {"num_beams": 40}, False, Steering(n_best=40, scores=True)
        )
    finally:
        hook.remove()
    assert batches == [4, 4 * 40] * 8
    assert [len(hypotheses) for hypotheses in found] == [40] * 32
    status, _, err = translate_input(capsys, folders, "--n_best", "100000000")
    assert status == 1 and "hypotheses (--n_best, --num_beams) needs about" in err and "GiB" in err, err


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
