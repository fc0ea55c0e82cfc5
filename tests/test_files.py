"""hf_vanilla_transformer.files: output folders and files that appear whole or not at all."""

import os
import stat
from pathlib import Path

import pytest

from hf_vanilla_transformer.files import atomic_output_dir, check_output_dir, write_text_atomically


def test_check_output_dir_accepts_a_missing_or_empty_folder(tmp_path):
    check_output_dir(str(tmp_path / "missing"), overwrite_output_dir=False)
    (tmp_path / "empty").mkdir()
    check_output_dir(str(tmp_path / "empty"), overwrite_output_dir=False)
    assert not (tmp_path / "missing").exists() and os.listdir(tmp_path / "empty") == []


def test_check_output_dir_refuses_a_non_empty_folder_unless_told_to_overwrite(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").write_text("earlier")
    with pytest.raises(ValueError) as error:
        check_output_dir(str(tmp_path / "out"), overwrite_output_dir=False)
    assert str(error.value) == (
        f"output_dir {tmp_path / 'out'} exists and is not empty; add overwrite_output_dir to replace it"
    )
    check_output_dir(str(tmp_path / "out"), overwrite_output_dir=True)
    assert (tmp_path / "out" / "model.safetensors").read_text() == "earlier"


@pytest.mark.parametrize("overwrite_output_dir", [False, True])
def test_check_output_dir_refuses_a_file_in_the_folders_place(tmp_path, overwrite_output_dir):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(ValueError) as error:
        check_output_dir(str(tmp_path / "out"), overwrite_output_dir=overwrite_output_dir)
    assert str(error.value) == f"output_dir {tmp_path / 'out'} exists and is not a folder"


def test_write_text_atomically_writes_the_whole_text_and_leaves_no_partial_file(tmp_path):
    path = tmp_path / "predictions.txt"
    write_text_atomically(str(path), "Ein Mann schläft.\nZwei Hunde.\n")
    assert path.read_text(encoding="utf-8") == "Ein Mann schläft.\nZwei Hunde.\n"
    write_text_atomically(str(path), "kürzer\n")  # a shorter text replaces the longer one whole
    assert path.read_text(encoding="utf-8") == "kürzer\n"
    assert os.listdir(tmp_path) == ["predictions.txt"]


def test_atomic_output_dir_moves_the_finished_folder_into_place(tmp_path):
    output = tmp_path / "parent" / "model"
    with atomic_output_dir(str(output)) as staging:
        assert not output.exists() and os.path.dirname(staging) == str(tmp_path / "parent")
        (Path(staging) / "config.json").write_text("{}")
        (Path(staging) / "checkpoint-1").mkdir()
    assert sorted(os.listdir(output)) == ["checkpoint-1", "config.json"]
    assert (output / "config.json").read_text() == "{}"
    assert os.listdir(tmp_path / "parent") == ["model"]  # no staging folder left beside it
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(output.stat().st_mode) == 0o777 & ~umask  # not the private mode of a temporary folder


def test_an_error_inside_atomic_output_dir_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="training failed"), atomic_output_dir(str(tmp_path / "model")) as staging:
        (Path(staging) / "model.safetensors").write_text("half")
        raise RuntimeError("training failed")
    assert os.listdir(tmp_path) == []


def test_atomic_output_dir_replaces_a_non_empty_folder_only_when_told_to(tmp_path):
    output = tmp_path / "model"
    output.mkdir()
    (output / "old.bin").write_text("earlier")
    with pytest.raises(ValueError, match="exists and is not empty"), atomic_output_dir(str(output)):
        pytest.fail("the body must not run")
    assert os.listdir(output) == ["old.bin"] and os.listdir(tmp_path) == ["model"]

    with pytest.raises(RuntimeError), atomic_output_dir(str(output), overwrite_output_dir=True) as staging:
        (Path(staging) / "new.bin").write_text("unfinished")
        raise RuntimeError
    assert os.listdir(output) == ["old.bin"] and (output / "old.bin").read_text() == "earlier"
    assert os.listdir(tmp_path) == ["model"]

    with atomic_output_dir(str(output), overwrite_output_dir=True) as staging:
        (Path(staging) / "new.bin").write_text("finished")
    assert os.listdir(output) == ["new.bin"] and (output / "new.bin").read_text() == "finished"
    assert os.listdir(tmp_path) == ["model"]
