"""Output folders a command does not own: every command that writes a folder refuses, whatever its flags, an empty
name, a name with a control character, the working folder or one above it, the home folder, and a folder that is or
holds what it reads, in one line with exit status 2 and nothing touched. A link to a folder is written through (the
folder it leads to is replaced, the link kept); a killed export leaves the old folder or the new one whole, and the
next run removes every hidden folder the killed one left, links among them."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import matplotlib  # noqa: F401  (the first imports of these two write under ~: here, not in a test's home)
import onnxruntime  # noqa: F401
import pytest

from hf_vanilla_transformer.cli.attention import main as attention_main
from hf_vanilla_transformer.cli.average_checkpoints import main as average_checkpoints_main
from hf_vanilla_transformer.cli.export_ctranslate2 import main as export_ctranslate2_main
from hf_vanilla_transformer.cli.export_marian import main as export_marian_main
from hf_vanilla_transformer.cli.export_onnx import main as export_onnx_main
from hf_vanilla_transformer.cli.run_translation import main as run_translation_main
from hf_vanilla_transformer.cli.train_bpe import main as train_bpe_main
from hf_vanilla_transformer.files import OutputDirRefused, atomic_output_dir, check_output_dir
from support.models import letter_tokenizer, tiny_model
from support.paths import REPO_ROOT

# each command that writes a folder, by its name in its messages: its main, its flags but --output_dir, and what it
# reads (a folder, or train_bpe.py's file), which an output folder must neither be nor hold; all in the working folder
COMMANDS = {
    "vanilla-export-marian": (export_marian_main, ["--model", "inputs/model"], "inputs/model"),
    "vanilla-export-ctranslate2": (export_ctranslate2_main, ["--model", "inputs/model"], "inputs/model"),
    "vanilla-export-onnx": (export_onnx_main, ["--model", "inputs/model"], "inputs/model"),
    "vanilla-attention": (attention_main, ["--model", "inputs/model", "--source", "a b"], "inputs/model"),
    "vanilla-average-checkpoints": (
        average_checkpoints_main,
        ["--model_dir", "inputs/run", "--last", "1"],
        "inputs/run",
    ),
    "train_bpe.py": (train_bpe_main, ["--train_file", "inputs/data/train.jsonl"], "inputs/data/train.jsonl"),
    "run_translation.py": (
        run_translation_main,
        ["--model_name_or_path", "inputs/model", "--train_file", "inputs/data/train.jsonl", "--do_train"],
        "inputs/model",
    ),
}


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A working folder (the current one) with the inputs the commands read (a model folder, broken: a command that
    loaded it would fail with another message; a run folder; a training file), beside a home folder (HOME)."""
    project = tmp_path / "project"
    (project / "inputs" / "model").mkdir(parents=True)
    (project / "inputs" / "model" / "config.json").write_text("{")
    (project / "inputs" / "run" / "checkpoint-1").mkdir(parents=True)
    (project / "inputs" / "data").mkdir()
    (project / "inputs" / "data" / "train.jsonl").write_text('{"translation": {"en": "a b", "de": "b a"}}\n')
    (project / "work.txt").write_text("the user's work")
    (tmp_path / "users" / "me").mkdir(parents=True)
    (tmp_path / "users" / "me" / "notes.txt").write_text("the user's notes")
    monkeypatch.chdir(project)
    monkeypatch.setenv("HOME", str(tmp_path / "users" / "me"))
    return project


def everything_under(folder: Path) -> dict[str, bytes | str | None]:
    """Every file, folder and link under `folder`, hidden ones included: what a file holds, where a link leads."""
    return {str(path): what_is_at(path) for path in sorted(folder.rglob("*"))}


def what_is_at(path: Path) -> bytes | str | None:
    if path.is_symlink():
        return os.readlink(path)
    return None if path.is_dir() else path.read_bytes()


def run_command(command: str, argv: list[str], capsys) -> tuple[int | str, list[str]]:
    """The exit status and the lines of standard error of `command` run on `argv`; a `sys.exit(message)` (status 1)
    as its message."""
    main, _, _ = COMMANDS[command]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err.splitlines()


# (output_dir as given, the refusal after "COMMAND: error: ") for each kind of folder a command does not own
WORKING = "output_dir {given} is or holds the working folder {project}; writing there would destroy it"
HOME = "output_dir {given} is or holds the home folder {home}; writing there would destroy it"
READ = "output_dir {given} is or holds {input}, which this command reads; writing there would destroy it"


def control(character: str, at: int) -> str:
    return (
        f"output_dir {{given!r}} holds the unprintable character {character!r} (character {at}); give a name without it"
    )


NOT_OURS = {
    "empty": ("", "output_dir is empty; give the name of the folder to write"),
    "dot": (".", WORKING),
    "working-folder": ("{project}", WORKING),
    "parent": ("..", WORKING),
    "above": ("../..", WORKING),
    "root": ("/", WORKING),
    "home": ("{home}", HOME),
    "above-home": ("{home}/..", HOME),
    "home-by-link": ("home-link", HOME),
    "input": ("{input}", READ),
    "holds-input": ("inputs", READ),
    "newline": ("runs/a\n# injected", control("\n", 7)),
    "tab": ("runs/a\tb", control("\t", 7)),
    "escape": ("runs/\x1b[31mred", control("\x1b", 6)),
    "zero-width": ("runs/a\u200bb", control("\u200b", 7)),
    "right-to-left": ("runs/\u202eab", control("\u202e", 6)),
    "line-separator": ("runs/a\u2028b", control("\u2028", 7)),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", NOT_OURS)
def test_a_folder_the_command_does_not_own_is_refused_in_one_line_with_exit_2_and_nothing_touched(
    project, tmp_path, capsys, command, case
):
    """With --overwrite_output_dir, so that only this rule stands between the command and the folder."""
    (project / "home-link").symlink_to(tmp_path / "users" / "me")
    given, message = NOT_OURS[case]
    _, flags, read = COMMANDS[command]
    names = {"project": project, "home": tmp_path / "users" / "me", "input": read}
    output_dir = given.format(**names)
    before = everything_under(tmp_path)
    code, stderr = run_command(command, [*flags, "--output_dir", output_dir, "--overwrite_output_dir"], capsys)
    assert (code, stderr) == (2, [f"{command}: error: {message.format(given=output_dir, **names)}"]), stderr
    assert everything_under(tmp_path) == before


def test_a_refused_folder_is_refused_before_anything_beside_it_is_cleaned_up(tmp_path, monkeypatch):
    """What a killed writer left beside the working folder stays where it is when the working folder is refused."""
    left = tmp_path / f".project.deleting-{dead_process_id()}"
    left.mkdir()
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    with pytest.raises(OutputDirRefused), atomic_output_dir("", overwrite_output_dir=True):
        pytest.fail("the body must not run")
    assert left.is_dir()


def test_check_output_dir_refusals_are_value_errors_naming_the_folder(tmp_path):
    """Library callers that catch ValueError (as every command did) still catch them."""
    with pytest.raises(ValueError, match=r"^output_dir 'a\\nb' holds the unprintable character"):
        check_output_dir("a\nb", overwrite_output_dir=True)


def dead_process_id() -> int:
    """The id of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def write_tiny_model(folder: Path) -> None:
    model = tiny_model(vocab_size=14, max_position_embeddings=24)
    model.save_pretrained(folder)
    letter_tokenizer().save_pretrained(folder)


def test_a_link_to_a_folder_is_written_through_and_kept(tmp_path):
    """atomic_output_dir given a link replaces the folder it leads to, whole, and leaves the link a link; a link to
    a file is refused, as a file is."""
    (tmp_path / "disk" / "model").mkdir(parents=True)
    (tmp_path / "disk" / "model" / "old.bin").write_text("earlier")
    (tmp_path / "runs").mkdir()
    link = tmp_path / "runs" / "model"
    link.symlink_to(tmp_path / "disk" / "model")
    with pytest.raises(ValueError, match="exists and is not empty"), atomic_output_dir(str(link)):
        pytest.fail("the body must not run")
    with atomic_output_dir(str(link), overwrite_output_dir=True) as staging:
        assert os.path.dirname(staging) == str(tmp_path / "disk")  # beside the folder it replaces: one file system
        (Path(staging) / "new.bin").write_text("finished")
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "disk" / "model")
    assert os.listdir(link) == ["new.bin"] and (link / "new.bin").read_text() == "finished"
    assert os.listdir(tmp_path / "runs") == ["model"] and os.listdir(tmp_path / "disk") == ["model"]

    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "notes").symlink_to(tmp_path / "notes.txt")
    with (
        pytest.raises(ValueError, match="exists and is not a folder"),
        atomic_output_dir(str(tmp_path / "notes"), True),
    ):
        pytest.fail("the body must not run")
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "notes").is_symlink()


def test_a_link_to_nothing_is_written_through(tmp_path):
    link = tmp_path / "model"
    link.symlink_to(tmp_path / "elsewhere" / "model")
    with atomic_output_dir(str(link)) as staging:
        (Path(staging) / "config.json").write_text("{}")
    assert link.is_symlink() and os.listdir(tmp_path / "elsewhere" / "model") == ["config.json"]


def test_the_clean_up_removes_links_and_files_a_killed_writer_left_and_never_what_a_link_leads_to(tmp_path):
    """A writer that set a linked output folder aside by renaming the link, and then failed to delete it, left a
    `.NAME.deleting-PID` link: it goes, as does any file of a dead writer's name; the folder it led to stays."""
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "model.safetensors").write_text("the user's model")
    dead = dead_process_id()
    (tmp_path / f".model.deleting-{dead}").symlink_to(tmp_path / "kept")
    (tmp_path / f".model.partial-{dead}-x1y2").symlink_to(tmp_path / "kept")
    (tmp_path / f".model.replaced-{dead}").write_text("not a folder")
    (tmp_path / "model").mkdir()
    with atomic_output_dir(str(tmp_path / "model"), overwrite_output_dir=True) as staging:
        (Path(staging) / "config.json").write_text("{}")
    assert sorted(os.listdir(tmp_path)) == ["kept", "model"]
    assert (tmp_path / "kept" / "model.safetensors").read_text() == "the user's model"


def test_what_a_writer_of_the_link_itself_left_beside_it_goes_too(tmp_path):
    """A writer that replaced the link itself left its hidden links beside the link, named for it, not beside the
    folder it leads to: they go too."""
    (tmp_path / "disk" / "kept").mkdir(parents=True)
    (tmp_path / "disk" / "exports" / "marian-2").mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "marian").symlink_to(tmp_path / "disk" / "exports" / "marian-2")
    dead = dead_process_id()
    (tmp_path / "runs" / f".marian.deleting-{dead}").symlink_to(tmp_path / "disk" / "kept")
    (tmp_path / "runs" / f".marian.replaced-{dead}").symlink_to(tmp_path / "disk" / "kept")
    with atomic_output_dir(str(tmp_path / "runs" / "marian"), overwrite_output_dir=True) as staging:
        (Path(staging) / "config.json").write_text("{}")
    assert os.listdir(tmp_path / "runs") == ["marian"] and (tmp_path / "runs" / "marian").is_symlink()
    assert os.listdir(tmp_path / "runs" / "marian") == ["config.json"]
    assert sorted(os.listdir(tmp_path / "disk")) == ["exports", "kept"] and os.listdir(tmp_path / "disk" / "kept") == []


def test_an_export_through_a_link_replaces_the_folder_it_leads_to(tmp_path, capsys):
    """The reported case: a linked output folder was replaced by a folder, the command then failed and left a
    `.NAME.deleting-PID` link that no later run removed."""
    write_tiny_model(tmp_path / "ours")
    (tmp_path / "disk" / "marian").mkdir(parents=True)
    (tmp_path / "disk" / "marian" / "old.txt").write_text("earlier")
    (tmp_path / "marian").symlink_to(tmp_path / "disk" / "marian")
    export_marian_main(
        ["--model", str(tmp_path / "ours"), "--output_dir", str(tmp_path / "marian"), "--overwrite_output_dir"]
    )
    assert capsys.readouterr().out == f"Wrote a MarianMTModel to {tmp_path / 'marian'}\n"
    assert (tmp_path / "marian").is_symlink()
    assert json.loads((tmp_path / "marian" / "config.json").read_text())["model_type"] == "marian"
    assert not (tmp_path / "marian" / "old.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["disk", "marian", "ours"] and os.listdir(tmp_path / "disk") == ["marian"]


# vanilla-export-marian in a new Python that kills itself (SIGKILL) at its Nth change to the file system once the new
# folder has been started: a file opened for writing (transformers' JSON files, the card), a rename, a removal.
KILLED_EXPORT = """
import os, signal, sys

model, output, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
staging = f".{os.path.basename(output)}.partial-"
changes = None

def writes(event, args):
    return event == "open" and (any(c in args[1] for c in "wax+") if args[1] else args[2] & (os.O_WRONLY | os.O_RDWR))

def hook(event, args):
    global changes
    if changes is None and event == "os.mkdir" and os.path.basename(os.fsdecode(args[0])).startswith(staging):
        changes = []  # the new folder started (save_pretrained's own makedirs of it come later)
    elif changes is not None and (writes(event, args) or event in ("os.rename", "os.remove", "os.rmdir")):
        changes.append(event)
        if len(changes) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
from hf_vanilla_transformer.cli.export_marian import main

main(["--model", model, "--output_dir", output, "--overwrite_output_dir"])
print(len(changes))
"""


def folder_files(folder: Path) -> dict[str, bytes] | None:
    return (
        {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        if folder.is_dir()
        else None
    )


@pytest.mark.slow
def test_a_real_export_through_a_link_killed_at_any_step_leaves_a_whole_folder_and_the_next_run_cleans_up(tmp_path):
    """SIGKILL vanilla-export-marian at each step of writing its folder and moving it in over an earlier one, the
    output folder given as a link to it (runs/ on another disk): the folder the link leads to is then the old one
    or the new one, whole, or (between two renames) absent; the next export leaves the new one whole behind the
    link, and no hidden folder beside either."""
    write_tiny_model(tmp_path / "ours")
    runs, disk = tmp_path / "runs", tmp_path / "disk"
    output, target = runs / "marian", disk / "marian"
    runs.mkdir()
    output.symlink_to(target)
    export = ["--model", str(tmp_path / "ours"), "--output_dir", str(output), "--overwrite_output_dir"]
    export_marian_main(export)  # what a finished export holds (its card names the folder as given)
    new, old = folder_files(target), {"old.txt": b"an earlier export"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    kill_at, seen = 1, set()
    while True:
        shutil.rmtree(disk)
        target.mkdir(parents=True)
        (target / "old.txt").write_bytes(old["old.txt"])
        killed = subprocess.run(
            [sys.executable, "-c", KILLED_EXPORT, str(tmp_path / "ours"), str(output), str(kill_at)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        if killed.returncode == 0:  # it finished: every step had its kill
            assert int(killed.stdout.splitlines()[-1]) == kill_at - 1 and folder_files(target) == new
            break
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        after_kill = folder_files(target)
        assert after_kill in (old, new, None), (kill_at, sorted(after_kill))
        seen.add("old" if after_kill == old else "new" if after_kill == new else "absent")

        export_marian_main(export)
        assert os.listdir(runs) == ["marian"] and output.is_symlink()
        assert os.listdir(disk) == ["marian"], (kill_at, os.listdir(disk))  # every hidden folder gone
        assert folder_files(target) == new
        kill_at += 1
    assert seen == {"old", "new", "absent"} and kill_at > 8  # 4 files written, 3 renames, 1 file and 1 folder removed
