"""hf_vanilla_transformer.files: output folders and files that appear whole or not at all."""

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hf_vanilla_transformer.files import (
    atomic_output_dir,
    check_output_dir,
    replace_atomically,
    write_text_atomically,
)
from support.paths import REPO_ROOT


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


# A process that replaces OUTPUT through atomic_output_dir and kills itself (SIGKILL) at its Nth change to the file
# system after the new folder starts: a file opened for writing, a rename, a removal. It imports files.py alone,
# without the package (which imports torch: seconds a start), since that module needs only the standard library.
KILLED_REPLACEMENT = """
import importlib.util, os, signal, sys

spec = importlib.util.spec_from_file_location("files", sys.argv[1])
files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files)
output, kill_at, overwrite = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "overwrite"
changes = []

def hook(event, args):
    writes = event == "open" and args[1] is not None and any(c in args[1] for c in "wax+")
    if changes is not None and (writes or event in ("os.rename", "os.remove", "os.rmdir")):
        changes.append(event)
        if len(changes) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
changes = None
try:
    with files.atomic_output_dir(output, overwrite) as staging:
        changes = []
        for name in ("model.safetensors", "config.json"):
            with open(os.path.join(staging, name), "w") as file:
                file.write("new")
except ValueError as error:
    sys.exit(str(error))
print(len(changes))
"""


def replace_in_a_process(output: Path, kill_at: int, overwrite: bool = True) -> subprocess.CompletedProcess:
    files_py = REPO_ROOT / "hf_vanilla_transformer" / "files.py"
    command = [sys.executable, "-c", KILLED_REPLACEMENT, str(files_py), str(output), str(kill_at)]
    return subprocess.run([*command, "overwrite" if overwrite else "keep"], capture_output=True, text=True, timeout=60)


def folder_contents(folder: Path) -> dict[str, str] | None:
    return {path.name: path.read_text() for path in folder.iterdir()} if folder.is_dir() else None


def test_a_replacement_killed_at_any_step_leaves_a_whole_folder_and_the_next_run_cleans_up(tmp_path):
    """SIGKILL at each step of replacing a folder (writing the new one, setting the old aside, moving the new one
    in, deleting the old): OUTPUT is the old folder or the new one, whole, or briefly absent with the old one set
    aside; the next command for OUTPUT puts such an old folder back, and removes every hidden folder the killed one
    left, whether or not it then goes on to replace OUTPUT."""
    old, new = {"model.safetensors": "old", "config.json": "old"}, {"model.safetensors": "new", "config.json": "new"}
    output = tmp_path / "model"
    kill_at, seen = 1, set()
    while True:
        shutil.rmtree(tmp_path)
        output.mkdir(parents=True)
        for name, text in old.items():
            (output / name).write_text(text)
        killed = replace_in_a_process(output, kill_at)
        if killed.returncode == 0:  # it finished: every step had its kill
            assert int(killed.stdout) == kill_at - 1 and folder_contents(output) == new
            break
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        after_kill = folder_contents(output)
        assert after_kill in (old, new, None), (kill_at, after_kill)
        seen.add("old" if after_kill == old else "new" if after_kill == new else "absent")

        refused = replace_in_a_process(output, 0, overwrite=False)  # the next command, told not to replace
        assert refused.returncode == 1 and "exists and is not empty" in refused.stderr, refused.stderr
        assert os.listdir(tmp_path) == ["model"], (kill_at, os.listdir(tmp_path))  # its hidden folders are gone
        assert folder_contents(output) == (after_kill or old)  # the old folder back where none replaced it
        kill_at += 1
    assert seen == {"old", "new", "absent"} and kill_at > 8  # 2 files written, 3 renames, 2 files and 1 folder removed


def test_a_killed_writers_folders_are_left_alone_while_it_runs(tmp_path):
    """Two commands writing beside each other: the second does not take the first's unfinished folder for a dead
    one's."""
    output = tmp_path / "model"
    with atomic_output_dir(str(output)) as first:
        (Path(first) / "config.json").write_text("first")
        assert replace_in_a_process(tmp_path / "model", 0).returncode == 0
        assert os.path.isdir(first)
    assert folder_contents(output) == {"config.json": "first"}


def test_two_writers_of_one_path_never_write_into_one_file(tmp_path):
    """A second write of the same path while the first is under way (another process, a callback): each has its own
    temporary file, and the last to finish wins whole."""
    path = tmp_path / "predictions.txt"

    def write_first(temporary: str) -> None:
        Path(temporary).write_text("first\n")
        write_text_atomically(str(path), "second\n")  # starts and finishes while the first is being written

    replace_atomically(str(path), write_first)
    assert path.read_text() == "first\n" and os.listdir(tmp_path) == ["predictions.txt"]


def test_the_data_is_on_disk_before_the_rename_makes_it_the_file(tmp_path, monkeypatch):
    synced, real_fsync = [], os.fsync

    def fsync(descriptor):
        name = os.readlink(f"/proc/self/fd/{descriptor}")
        synced.append((os.path.basename(name), Path(name).read_text(), (tmp_path / "results.json").exists()))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    write_text_atomically(str(tmp_path / "results.json"), "{}")
    [(name, text, renamed)] = synced
    assert name.startswith(".results.json.") and name.endswith(".partial") and text == "{}" and not renamed


FULL_DISK = """
import importlib.util, resource, sys

spec = importlib.util.spec_from_file_location("files", sys.argv[1])
files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # Python ignores SIGXFSZ: a write past it is an OSError
try:
    files.write_text_atomically(sys.argv[2], "Ein Mann schläft.\\n" * 1000)
except OSError as error:
    sys.exit(str(error))
"""


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_the_old_one_whole(tmp_path):
    """A file size limit (RLIMIT_FSIZE) stands in for a full disk: the write fails part way."""
    path = tmp_path / "predictions.txt"
    path.write_text("earlier\n")
    files_py = REPO_ROOT / "hf_vanilla_transformer" / "files.py"
    result = subprocess.run([sys.executable, "-c", FULL_DISK, str(files_py), str(path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == f"[Errno 27] cannot write {path} (File too large)\n"
    assert path.read_text() == "earlier\n" and os.listdir(tmp_path) == ["predictions.txt"]
