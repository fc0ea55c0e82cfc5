"""run_translation.py resumed: from a checkpoint, after a kill at any moment, from a half-written checkpoint."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from hf_vanilla_transformer.cli import run_translation
from hf_vanilla_transformer.training.checkpoints import checkpoint_to_resume
from support.hostile import assert_one_line_error
from support.paths import REPO_ROOT, TRAIN
from support.runs import QUIET_CPU


@pytest.mark.slow
def test_resume_from_checkpoint(tmp_path):
    tiny = [
        "--train_file",
        TRAIN,
        "--max_train_samples",
        "600",
        "--vocab_size",
        "400",
        "--config_overrides",
        "d_model=32,encoder_ffn_dim=64,decoder_ffn_dim=64,encoder_layers=1,decoder_layers=1",
        "--do_train",
        "--max_tokens_per_batch",
        "600",
        "--save_steps",
        "4",
        "--logging_steps",
        "2",
        *QUIET_CPU,
        "--output_dir",
        str(tmp_path / "run"),
        "--max_train_minutes",
        "60",  # a budget that never ends the run, and records the training time
    ]
    run_translation.main([*tiny, "--max_steps", "4"])
    checkpoint = tmp_path / "run" / "checkpoint-4"
    assert (checkpoint / "model.safetensors").exists()
    # the first start's training time as the checkpoint records it, set to 1000 s: the second start counts on from
    # it, which shows whatever the machine's speed
    checkpoint_state = json.loads((checkpoint / "trainer_state.json").read_text())
    recorded = checkpoint_state["stateful_callbacks"]["TimeLimitCallback"]["attributes"]
    assert recorded["spent_seconds"] > 0
    recorded["spent_seconds"] = 1000.0
    (checkpoint / "trainer_state.json").write_text(json.dumps(checkpoint_state))
    run_translation.main([*tiny, "--max_steps", "8", "--resume_from_checkpoint", str(checkpoint)])
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 8
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == [2, 4, 6, 8]
    # the card counts both starts' training, as the budget does (the Trainer's train_runtime is the last start's)
    total = state["log_history"][-1]["training_seconds"]
    train_runtime = json.loads((tmp_path / "run" / "train_results.json").read_text())["train_runtime"]
    assert 1000 <= total <= 1000 + train_runtime + 0.05  # 0.05: rounding
    assert f"- training time: {total / 60:.1f} minutes\n" in (tmp_path / "run" / "README.md").read_text()


# A 1+1-layer model with dropout and token budgets: a whole run takes a few seconds, most of them starting Python.
TINY_TRAINING = [
    "run_translation.py",
    "--preset",
    "small",
    "--config_overrides",
    "d_model=32,encoder_ffn_dim=64,decoder_ffn_dim=64,encoder_layers=1,decoder_layers=1,"
    "encoder_attention_heads=2,decoder_attention_heads=2",
    "--train_file",
    TRAIN,
    "--max_train_samples",
    "120",
    "--vocab_size",
    "500",
    "--do_train",
    "--max_tokens_per_batch",
    "600",
    "--warmup_steps",
    "10",
    "--seed",
    "3",
    *QUIET_CPU,
]
# 240 steps, a checkpoint every 24 and averaging of the last 3
KILLED_RUN = [
    *TINY_TRAINING,
    "--max_steps",
    "240",
    "--save_steps",
    "24",
    "--save_total_limit",
    "4",
    "--average_last_checkpoints",
    "3",
    "--logging_steps",
    "4",
]
KILL_TIMEOUT = 240


def kill_when(run: list[str], output_dir: Path, phase: str, rng) -> str:
    """Run `run` (KILLED_RUN in a precision; resuming) and SIGKILL it in `phase`: "step" (a random moment of
    training), "checkpoint" (as it opens one of its first checkpoint's files, drawn by `rng`: `KILL_POINTS`) or
    "averaging" (once the final averaging has begun). Returns what happened: "killed", "killed while writing
    checkpoint-N" (the checkpoint phase: the folder it left has no trainer state) or "finished" (it ended first)."""
    command = [sys.executable, *run, "--output_dir", str(output_dir), "--resume_from_checkpoint"]
    env = dict(os.environ)
    if phase == "checkpoint":
        # before the weights, after them (the optimizer state not yet), before the trainer state
        kill_point = rng.choice(["config.json", "tokenizer_config.json", "trainer_state.json"])
        env |= {"PYTHONPATH": str(kill_points(output_dir.parent)), "KILL_WHILE_WRITING": f"/{kill_point}"}
    log = output_dir.parent / f"{output_dir.name}.log"
    with open(log, "a") as stream:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + KILL_TIMEOUT
    seen = {p.name for p in output_dir.glob("checkpoint-*")} if output_dir.is_dir() else set()
    wait_until = None
    while process.poll() is None and time.monotonic() < deadline:
        new = [p for p in output_dir.glob("checkpoint-*") if p.name not in seen]
        if phase == "step" and wait_until is None and new:
            wait_until = time.monotonic() + rng.uniform(0.0, 0.5)  # training runs: at a random step among the next
        if phase == "step" and wait_until is not None and time.monotonic() >= wait_until:
            break
        if phase == "averaging" and "Averaging checkpoint-" in log.read_text():
            break
        time.sleep(0.001)
    if process.poll() is None:
        process.kill()
    if process.wait(timeout=30) != -signal.SIGKILL:
        return "finished"
    if phase == "checkpoint":
        (left,) = half_written(output_dir)
        return f"killed while writing {left}"
    return "killed"


def half_written(output_dir: Path) -> list[str]:
    """The checkpoint folders in `output_dir` without a trainer state (which the Trainer writes last)."""
    return sorted(p.name for p in output_dir.glob("checkpoint-*") if not (p / "trainer_state.json").exists())


@pytest.fixture(scope="module", params=["true", "false"], ids=["bf16", "float32"])
def uninterrupted_run(request, tmp_path_factory) -> tuple[list[str], Path]:
    """KILLED_RUN in each precision the default chooses from (bfloat16 autocast with eager attention where the
    CPU has bf16 units, float32 elsewhere), and its output folder."""
    run = [*KILLED_RUN, "--bf16", request.param]
    output = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = subprocess.run(
        [sys.executable, *run, "--output_dir", str(output)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=KILL_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return run, output


@contextmanager
def competing_cpu_load(processes: int = 1):
    """CPU-bound processes beside the test, so that kills land elsewhere than on an idle machine."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_a_run_killed_at_any_moment_resumes_to_the_same_weights(uninterrupted_run, tmp_path):
    """Killed 3 times (at a step, while writing a checkpoint, while averaging) beside a CPU-bound process, which
    moves where the timed kills land (a run under load is what found transformers' rotation by modification time; the
    deletion kill below pins it)."""
    import random

    run, uninterrupted = uninterrupted_run
    killed = tmp_path / "killed"
    rng = random.Random(3)
    with competing_cpu_load():
        phases = ("step", "checkpoint", "averaging")
        outcomes = [kill_when(run, killed, phase, rng) for phase in phases]
    assert outcomes[0] == outcomes[2] == "killed"
    assert re.fullmatch(r"killed while writing checkpoint-\d+", outcomes[1]), outcomes[1]
    restart = subprocess.run(
        [sys.executable, *run, "--output_dir", str(killed), "--resume_from_checkpoint"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=KILL_TIMEOUT,
    )
    assert restart.returncode == 0, restart.stderr[-2000:]
    assert (killed / "model.safetensors").read_bytes() == (uninterrupted / "model.safetensors").read_bytes()
    # every training loss logged on the way, the resumed run's read from its checkpoints, is the same
    ours, theirs = (json.loads((folder / "trainer_state.json").read_text()) for folder in (killed, uninterrupted))
    assert ours["global_step"] == theirs["global_step"] == 240 and ours["epoch"] == theirs["epoch"]
    losses = [[(e["step"], e["loss"]) for e in state["log_history"] if "loss" in e] for state in (ours, theirs)]
    assert losses[0] == losses[1] and len(losses[0]) == 240 // 4


# Python's audit hooks see each file Python opens (not those torch and safetensors write from C++ and Rust: the
# weights, training arguments, optimizer and RNG states), shutil.rmtree begin and each file it removes: `sitecustomize`
# kills the process (SIGKILL) as it opens for writing a file in a checkpoint folder whose path ends with PATH
# (KILL_WHILE_WRITING="PATH"), or at the M-th file it removes while deleting the folder whose path ends with NAME
# (KILL_WHILE_DELETING="NAME:M"): moments a timed kill rarely hits.
KILL_POINTS = """
import os, signal, sys

writing = os.environ.get("KILL_WHILE_WRITING")
deleting = os.environ.get("KILL_WHILE_DELETING")
if deleting:
    name, file_number = deleting.split(":")
seen = {"deleting": False, "files": 0}


def hook(event, args):
    if event == "open" and writing and isinstance(args[0], (str, bytes)) and "w" in (args[1] or ""):
        if os.fsdecode(args[0]).endswith(writing) and "/checkpoint-" in os.fsdecode(args[0]):
            os.kill(os.getpid(), signal.SIGKILL)
    elif event == "shutil.rmtree" and deleting:
        seen["deleting"] = os.fsdecode(args[0]).endswith(name)
    elif event == "os.remove" and seen["deleting"]:
        seen["files"] += 1
        if seen["files"] == int(file_number):
            os.kill(os.getpid(), signal.SIGKILL)


if writing or deleting:
    sys.addaudithook(hook)
"""


def kill_points(folder: Path) -> Path:
    """A folder holding `KILL_POINTS` as `sitecustomize.py`, for a run's PYTHONPATH."""
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(KILL_POINTS)
    return site


def test_a_run_killed_while_deleting_checkpoints_resumes_to_the_same_weights(uninterrupted_run, tmp_path):
    # transformers' rotation orders checkpoints by modification time, which a half-done deletion renews: the
    # half-deleted folder was then kept in place of a newer checkpoint, and averaging read it (other weights)
    site = kill_points(tmp_path)
    run, uninterrupted = uninterrupted_run
    killed = tmp_path / "killed"
    command = [sys.executable, *run, "--output_dir", str(killed), "--resume_from_checkpoint"]
    # a rotation of the first run (at step 168, of checkpoint-72), the resumed run's clearing of that folder, then
    # the deletion of the averaged checkpoints once the model is saved (checkpoint-168 first, then 192), then none
    for kill in ("checkpoint-72:2", "checkpoint-72:1", "checkpoint-192:2", None):
        env = {**os.environ, "PYTHONPATH": str(site)} | ({"KILL_WHILE_DELETING": kill} if kill else {})
        result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=KILL_TIMEOUT)
        assert result.returncode == (-9 if kill else 0), (kill, result.stderr[-2000:])
    assert "holds this run's final model already: loaded, not averaged again" in result.stderr
    assert (killed / "model.safetensors").read_bytes() == (uninterrupted / "model.safetensors").read_bytes()
    # the run folder is the model, and the last checkpoint, which a longer budget resumes from
    for folder in (killed, uninterrupted):
        assert sorted(p.name for p in folder.iterdir() if "checkpoint" in p.name) == ["checkpoint-240"]


# 12 steps, a checkpoint every 4, 3 kept and averaged; the finished folder keeps them, to be counted
ROTATED_RUN = [
    *TINY_TRAINING,
    "--max_steps",
    "12",
    "--save_steps",
    "4",
    "--save_total_limit",
    "3",
    "--average_last_checkpoints",
    "3",
    "--keep_checkpoints",
    "true",
    "--logging_steps",
    "4",
]


@pytest.mark.slow
def test_a_run_killed_while_writing_its_time_limit_checkpoint_ends_with_the_newest_complete_checkpoints(tmp_path):
    """Killed while writing a checkpoint, then while writing the checkpoint a time budget ends training with (at a
    step no other run saves at), then while deleting what those left: the resumed run ends with the newest 3
    complete checkpoints, nothing half-written, and the mean of all 3 (transformers' rotation, which counts every
    checkpoint-N folder, deleted a complete checkpoint in place of a half-written one, and averaging read 2)."""
    site = kill_points(tmp_path)

    def start(output_dir: Path, *flags: str, **kill_point: str) -> subprocess.CompletedProcess:
        command = [sys.executable, *ROTATED_RUN, "--output_dir", str(output_dir), *flags]
        # CI=true: transformers' log goes through the run's own handler, so each of its warnings says WARNING (it
        # prints them as bare "[transformers] …" lines otherwise)
        env = {**os.environ, "PYTHONPATH": str(site), "CI": "true", **kill_point}
        return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=KILL_TIMEOUT)

    uninterrupted = tmp_path / "uninterrupted"
    healthy = start(uninterrupted)
    assert healthy.returncode == 0, healthy.stderr[-2000:]
    # nothing went wrong, and nothing says so: neither our rotation nor transformers' (whose "mtime may not be
    # reliable" line came for every checkpoint written within a second of the oldest kept)
    assert [line for line in healthy.stderr.splitlines() if "WARNING" in line] == []

    killed = tmp_path / "killed"
    first = start(killed, KILL_WHILE_WRITING="checkpoint-12/tokenizer_config.json")  # its weights written
    assert first.returncode == -signal.SIGKILL and half_written(killed) == ["checkpoint-12"], first.stderr[-2000:]
    # resumed from checkpoint-8 with a time budget that a single step more spends: training stops after step 9 with
    # a checkpoint, and the run is killed before its trainer state; the rotation there deleted checkpoint-12
    recorded = json.loads((killed / "checkpoint-8" / "trainer_state.json").read_text())["stateful_callbacks"]
    budget = recorded["TimeLimitCallback"]["attributes"]["spent_seconds"] / 60 + 1e-6
    second = start(
        killed,
        "--resume_from_checkpoint",
        "--max_train_minutes",
        repr(budget),
        KILL_WHILE_WRITING="checkpoint-9/trainer_state.json",
    )
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert half_written(killed) == ["checkpoint-9"] and (killed / "checkpoint-9" / "optimizer.pt").is_file()
    # resumed from checkpoint-8 again, to the end: killed while checkpoint-12's rotation deletes checkpoint-9
    third = start(killed, "--resume_from_checkpoint", KILL_WHILE_DELETING=".deleting-checkpoint-9:1")
    assert third.returncode == -signal.SIGKILL, third.stderr[-2000:]
    assert (killed / ".deleting-checkpoint-9").is_dir() and half_written(killed) == ["checkpoint-12"]
    last = start(killed, "--resume_from_checkpoint")
    assert last.returncode == 0, last.stderr[-2000:]

    for folder, log in ((uninterrupted, healthy.stderr), (killed, last.stderr)):
        assert sorted(p.name for p in folder.iterdir() if "checkpoint" in p.name) == [
            "checkpoint-12",
            "checkpoint-4",
            "checkpoint-8",
        ]
        assert half_written(folder) == []
        assert "Averaging checkpoint-4, checkpoint-8, checkpoint-12\n" in log
        assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folder.rglob("training_args.bin")} == {"0o600"}
    assert (killed / "model.safetensors").read_bytes() == (uninterrupted / "model.safetensors").read_bytes()


def write_checkpoints(output_dir: Path, steps: dict[int, bool]) -> None:
    """`checkpoint-STEP` folders, complete (a trainer state naming the step, weights) or cut short before them."""
    for step, complete in steps.items():
        folder = output_dir / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "optimizer.pt").write_bytes(b"")
        if complete:
            (folder / "model.safetensors").write_bytes(b"")
            (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def test_resuming_by_path_from_a_half_written_checkpoint_takes_the_newest_complete_one(tmp_path, caplog):
    write_checkpoints(tmp_path, {10: True, 20: True, 30: False})
    assert checkpoint_to_resume(str(tmp_path / "checkpoint-30")) == str(tmp_path / "checkpoint-20")
    assert "checkpoint-30 is incomplete (its run stopped while writing it): resuming from" in caplog.text
    assert checkpoint_to_resume(str(tmp_path / "checkpoint-20")) == str(tmp_path / "checkpoint-20")


@pytest.mark.parametrize(
    "steps, checkpoint, message",
    [
        ({30: False}, "checkpoint-30", "incomplete (its run stopped while writing it), and there is no complete"),
        ({10: True, 20: True}, "checkpoint-10", "checkpoint-20 is newer; resume from the newest checkpoint"),
        ({10: True}, "checkpoint-99", "not a checkpoint-STEP folder the Trainer wrote"),
    ],
)
def test_resuming_by_path_from_no_usable_checkpoint_stops_in_one_line_naming_it(tmp_path, steps, checkpoint, message):
    write_checkpoints(tmp_path, steps)
    with pytest.raises(SystemExit) as exit_info:
        run_translation.main(
            [
                "--output_dir",
                str(tmp_path),
                "--do_train",
                "--train_file",
                TRAIN,
                "--resume_from_checkpoint",
                str(tmp_path / checkpoint),
            ]
        )
    assert_one_line_error(exit_info.value.code, message)
    assert str(tmp_path / checkpoint) in exit_info.value.code


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--resume_from_checkpoint"], "latest"),
        (["--resume_from_checkpoint", "--seed", "3"], "latest"),
        (["--resume_from_checkpoint", "latest"], "latest"),
        (["--resume_from_checkpoint", "runs/x/checkpoint-75"], "runs/x/checkpoint-75"),
        ([], None),
    ],
)
def test_a_bare_resume_flag_means_the_newest_checkpoint(flags, expected):
    *_, training_args = run_translation.parse_arguments(["--output_dir", "runs/x", "--do_train", *flags])
    assert training_args.resume_from_checkpoint == expected
