"""hf_vanilla_transformer.engines.registry: what a route (our model's generate(), CTranslate2, ONNX Runtime) or a
flag cannot give is refused in one line before any work, an option for the other kind of folder or a compute type
the device lacks too, and models that cannot decode together as an ensemble are named."""

import pytest

from support.commands import files_under, run, with_flags
from support.steering import save_tiny, translate, translate_input


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


def test_models_that_cannot_decode_together_are_one_line_naming_both_folders(folders, tmp_path, capsys):
    other = save_tiny(tmp_path / "other", vocab_size=15)
    output = tmp_path / "out.txt"
    status, _, err = translate(
        capsys, "--model", folders["first"], other, "--input", folders["input"], "--output", str(output)
    )
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{folders['first']} and {other} differ in vocab_size (14 vs 15)" in err
    assert not output.exists()


def test_an_option_for_the_other_kind_of_folder_or_that_the_device_lacks_is_one_line(work, tmp_path, capsys):
    import ctranslate2

    from hf_vanilla_transformer.engines.ctranslate2 import COMPUTE_TYPES

    supported = ctranslate2.get_supported_compute_types("cpu")
    unsupported = next(name for name in COMPUTE_TYPES if name not in ("default", "auto", *supported))
    before = files_under(tmp_path)
    for flags, message in [
        (["--compute_type", "int8"], "compute_type int8 is for CTranslate2 folders; model is a model folder (dtype)"),
        (["--intra_threads", "2"], "intra_threads 2 is for CTranslate2 folders; model is a model folder (dtype)"),
        (
            ["--model", "ct2", "--dtype", "float32"],
            "dtype float32 is for model folders; ct2 is a CTranslate2 folder (compute_type)",
        ),
        (
            ["--model", "ct2", "--device", "cpu", "--compute_type", unsupported],
            f"compute_type {unsupported}: CTranslate2 {ctranslate2.__version__} computes in "
            f"{', '.join(sorted(supported))} on this cpu",
        ),
    ]:
        code, stderr = run("vanilla-translate", with_flags(work["vanilla-translate"], flags), capsys)
        assert (code, stderr) == (1, [f"vanilla-translate: error: {message}"])
    assert files_under(tmp_path) == before
