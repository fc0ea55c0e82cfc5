"""hf_vanilla_transformer.training.checkpoints: which checkpoints are complete, rotation by step, averaging (Section
6.1) and the command vanilla-average-checkpoints, which writes the mean of a run's newest checkpoints as a model
folder."""

import json
import logging
import os
import runpy
import stat
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)

from hf_vanilla_transformer.cli.average_checkpoints import main as average_checkpoints_main
from hf_vanilla_transformer.model.pipeline_translation import TranslationPipeline
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.checkpoints import (
    average_checkpoints,
    checkpoint_folders,
    latest_checkpoint,
    load_averaged_checkpoints,
    rotate_checkpoints,
)
from hf_vanilla_transformer.training.trainer import TranslationTrainer
from support.models import letter_tokenizer, reversal_dataset, tiny_model


def test_checkpoint_averaging_is_the_mean_of_known_weights(tmp_path, caplog):
    model = tiny_model()
    # a distinct value in every entry of every tensor, so that a tensor read under another's name would show
    offset, distinct = 0, {}
    for name, parameter in model.named_parameters():
        distinct[name] = torch.arange(offset, offset + parameter.numel(), dtype=torch.float32).view_as(parameter) / 1e4
        offset += parameter.numel()
    for step, factor in ((10, 1.0), (20, 2.0), (30, 6.0), (5, 100.0)):
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.copy_(factor * distinct[name])
        model.save_pretrained(tmp_path / f"checkpoint-{step}")
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-40").mkdir()  # unfinished checkpoints: no weights, no trainer state ...
    model.save_pretrained(tmp_path / "checkpoint-50")  # ... weights, no trainer state ...
    model.save_pretrained(tmp_path / "checkpoint-60")  # ... a trainer state cut short by a kill
    (tmp_path / "checkpoint-60" / "trainer_state.json").write_text('{"global_step": 6')
    with caplog.at_level("WARNING"):
        folders = checkpoint_folders(str(tmp_path))
    assert [f.rsplit("-", 1)[1] for f in folders] == ["5", "10", "20", "30"]
    incomplete = [r.getMessage() for r in caplog.records if "incomplete" in r.getMessage()]
    assert sorted(incomplete) == [
        f"checkpoint-{step} is incomplete (its run stopped while writing it): not used" for step in (40, 50, 60)
    ]
    assert latest_checkpoint(str(tmp_path)) == folders[-1]

    averaged = average_checkpoints(folders[-3:])  # factors 1, 2 and 6: the mean is 3 times each value
    assert averaged.keys() == distinct.keys()  # every parameter, the tied matrix once
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, 3 * distinct[name], msg=name)
    load_averaged_checkpoints(model, folders[-3:])
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.detach(), 3 * distinct[name], msg=name)
    assert model.lm_head.weight is model.model.shared.weight
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([])


def train_with_checkpoints(output_dir, trainer_class=TranslationTrainer, callbacks=(), **settings):
    """A tiny model trained 8 steps with a checkpoint every 2 (its tokenizer saved beside each); returns the trainer."""
    arguments = dict(
        output_dir=str(output_dir),
        max_steps=8,
        save_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        **settings,
    )
    args_class = TranslationTrainingArguments if trainer_class is TranslationTrainer else Seq2SeqTrainingArguments
    tokenizer = letter_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer))
    trainer = trainer_class(
        model=model,
        args=args_class(**arguments),
        train_dataset=reversal_dataset(tokenizer, 64, seed=4),
        data_collator=DataCollatorForSeq2Seq(letter_tokenizer(), model=model),
        processing_class=letter_tokenizer(),
        callbacks=list(callbacks),
    )
    trainer.train()
    return trainer


class MakeTheFirstCheckpointLookNewest(TrainerCallback):
    """After the second save, gives checkpoint-2 a modification time in the future: what a deletion stopped halfway
    does to a folder's time, in the order of a rotation by modification time."""

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 4:
            first = os.path.join(args.output_dir, "checkpoint-2")
            os.utime(first, (os.stat(first).st_atime, os.stat(first).st_mtime + 1000))


def test_checkpoints_are_rotated_by_step_before_transformers_rotation_by_time(tmp_path):
    ours = train_with_checkpoints(tmp_path / "ours", callbacks=[MakeTheFirstCheckpointLookNewest()], save_total_limit=2)
    assert ours.args.save_total_limit == 2  # as given: transformers' rotation runs after ours and finds none to delete
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["checkpoint-6", "checkpoint-8"]
    # transformers' rotation by modification time keeps the folder that looks newest in place of a newer one
    theirs = train_with_checkpoints(
        tmp_path / "theirs",
        trainer_class=Seq2SeqTrainer,
        save_total_limit=2,
        callbacks=[MakeTheFirstCheckpointLookNewest()],
    )
    assert theirs.args.save_total_limit == 2
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["checkpoint-2", "checkpoint-8"]


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory):
    """A run with a checkpoint every 2 steps, rotated down to 2 and averaged into the final model, under the usual
    umask (022: files readable by all unless made private), and the log records of WARNING and above it left."""
    output = tmp_path_factory.mktemp("healthy") / "run"
    warnings = RecordsAtOrAbove(logging.WARNING)
    # transformers' records stop at its own logger unless the environment says CI: the handler goes on both
    listened = [logging.getLogger(), logging.getLogger("transformers")]
    for logger in listened:
        logger.addHandler(warnings)
    umask = os.umask(0o022)
    try:
        trainer = train_with_checkpoints(
            output, save_total_limit=2, average_last_checkpoints=2, callbacks=[SayWhatTransformersRotationSays()]
        )
        trainer.save_final_model()
    finally:
        os.umask(umask)
        for logger in listened:
            logger.removeHandler(warnings)
    return output, warnings.records


class SayWhatTransformersRotationSays(TrainerCallback):
    """At each save, logs what transformers' rotation logs (`warning_once`, so once a process: a test cannot count
    on being the first to make it) for checkpoints written less than a second after the oldest kept one."""

    def on_save(self, args, state, control, **kwargs):
        logging.getLogger("transformers.trainer_utils").warning(
            "mtime may not be reliable on this filesystem, falling back to numerical ordering"
        )


class RecordsAtOrAbove(logging.Handler):
    def __init__(self, level):
        super().__init__(level)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_healthy_run_with_frequent_checkpoints_logs_no_warning(healthy_run):
    output, warnings = healthy_run
    assert [f"{r.levelname} {r.name}: {r.getMessage()}" for r in warnings] == []
    assert sorted(p.name for p in output.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-8"]


def test_transformers_lines_are_left_out_only_while_training(tmp_path):
    said = RecordsAtOrAbove(logging.WARNING)
    rotation_logger = logging.getLogger("transformers.trainer_utils")
    rotation_logger.addHandler(said)
    try:
        train_with_checkpoints(tmp_path / "run", callbacks=[SayWhatTransformersRotationSays()])
        rotation_logger.warning("mtime may not be reliable on this filesystem, falling back to numerical ordering")
        rotation_logger.warning("another line")
    finally:
        rotation_logger.removeHandler(said)
    assert [record.getMessage() for record in said.records] == [
        "mtime may not be reliable on this filesystem, falling back to numerical ordering",
        "another line",
    ]


def test_training_args_which_may_hold_a_hub_token_are_private_to_their_owner(healthy_run):
    output, _ = healthy_run
    written = [output / "training_args.bin", output / "checkpoint-8" / "training_args.bin"]
    assert {str(path): oct(stat.S_IMODE(path.stat().st_mode)) for path in written} == {
        str(path): "0o600" for path in written
    }


def complete_checkpoints(folder, steps):
    for step in steps:
        checkpoint = folder / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "model.safetensors").write_bytes(b"")
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))


@pytest.mark.parametrize(
    "best, kept",
    [(None, ["checkpoint-10", "checkpoint-12"]), ("checkpoint-4", ["checkpoint-10", "checkpoint-12", "checkpoint-4"])],
)
def test_rotation_counts_the_checkpoint_being_written_and_the_best_as_transformers_does(tmp_path, best, kept):
    complete_checkpoints(tmp_path, [2, 4, 6, 8, 10])
    (tmp_path / "checkpoint-12").mkdir()  # being written: no trainer state yet
    limit = 3 if best else 2  # the best one counts among the limit, as in save_total_limit
    rotate_checkpoints(
        str(tmp_path), limit, best=best and str(tmp_path / best), writing=str(tmp_path / "checkpoint-12")
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == kept


def test_rotation_deletes_what_stopped_runs_left_half_written_and_says_so_without_a_warning(tmp_path, caplog):
    complete_checkpoints(tmp_path, [2, 4, 6])
    for step in (5, 12, 14):  # a stopped run's: no trainer state; 12 is being written now
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"")
    with caplog.at_level("INFO", logger="hf_vanilla_transformer"):
        rotate_checkpoints(str(tmp_path), 3, writing=str(tmp_path / "checkpoint-12"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-12", "checkpoint-4", "checkpoint-6"]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "Deleting checkpoint-5, which a stopped run left half-written"),
        ("INFO", "Deleting checkpoint-14, which a stopped run left half-written"),
        ("INFO", "Deleting checkpoint-2 (keeping the newest 3)"),
    ]
    # without a limit too: a half-written folder is never kept
    (tmp_path / "checkpoint-3").mkdir()
    rotate_checkpoints(str(tmp_path), None)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-6"]


def test_the_command_writes_the_mean_of_the_newest_checkpoints_as_a_model_folder(tmp_path, capsys):
    run = tmp_path / "run"
    train_with_checkpoints(run)
    capsys.readouterr()  # the training's log
    average_checkpoints_main(["--model_dir", str(run), "--last", "3", "--output_dir", str(tmp_path / "averaged")])
    assert (
        capsys.readouterr().out
        == f"Wrote the mean of checkpoint-4, checkpoint-6, checkpoint-8 to {tmp_path / 'averaged'}\n"
    )

    # the mean, computed here in float64 from the checkpoints' own files
    checkpoints = [load_file(run / f"checkpoint-{step}" / "model.safetensors") for step in (4, 6, 8)]
    averaged = load_file(tmp_path / "averaged" / "model.safetensors")
    assert averaged.keys() == checkpoints[0].keys()
    for name, tensor in averaged.items():
        mean = torch.stack([checkpoint[name].double() for checkpoint in checkpoints]).mean(0).float()
        torch.testing.assert_close(tensor, mean, rtol=0, atol=1e-7, msg=name)
    assert not torch.equal(averaged["model.shared.weight"], checkpoints[-1]["model.shared.weight"])

    # a model folder, without the training state: it loads and translates as any of ours
    names = {path.name for path in (tmp_path / "averaged").iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not names & {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"}
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "averaged")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in averaged.items())
    translator = TranslationPipeline(model=model, tokenizer=AutoTokenizer.from_pretrained(tmp_path / "averaged"))
    assert len(translator(["a b c", "d e"], max_new_tokens=5)) == 2
    assert {p.name for p in run.iterdir()} == {f"checkpoint-{step}" for step in (2, 4, 6, 8)}  # the run untouched


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--last", "5"], "model_dir {run} holds 4 complete checkpoints; averaging the last 5 needs 5"),
        (["--last", "0"], "the number of checkpoints to average must be at least 1, got 0"),
        (["--model_dir", "{tmp}/nothing"], "model_dir {tmp}/nothing: no such folder"),
        (["--output_dir", "{tmp}/taken"], "output_dir {tmp}/taken exists and is not empty; add overwrite_output_dir"),
    ],
)
def test_the_command_refuses_in_one_line_and_writes_nothing(tmp_path, flags, message):
    run = tmp_path / "run"
    train_with_checkpoints(run)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("mine")
    before = sorted(str(path) for path in tmp_path.rglob("*"))
    given = {"--model_dir": str(run), "--last": "3", "--output_dir": str(tmp_path / "out")}
    given.update(zip(flags[::2], (flag.format(run=run, tmp=tmp_path) for flag in flags[1::2]), strict=True))
    with pytest.raises(SystemExit) as exit_info:
        average_checkpoints_main([item for pair in given.items() for item in pair])
    assert str(exit_info.value.code).startswith("vanilla-average-checkpoints: error: ")
    assert message.format(run=run, tmp=tmp_path) in str(exit_info.value.code)
    assert "\n" not in str(exit_info.value.code)
    assert sorted(str(path) for path in tmp_path.rglob("*")) == before  # nothing written, nothing deleted


def test_a_mistyped_flag_is_one_line_as_in_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        average_checkpoints_main(["--model_dir", "run", "--output_dir", "out", "--lats", "3"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "vanilla-average-checkpoints: error: unrecognized arguments: --lats 3 (see --help)\n"
    )


def test_the_command_runs_as_python_m(tmp_path):
    run = tmp_path / "run"
    train_with_checkpoints(run)
    argv = ["checkpoints", "--model_dir", str(run), "--last", "2", "--output_dir", str(tmp_path / "averaged")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        patch.delitem(sys.modules, "hf_vanilla_transformer.cli.average_checkpoints", raising=False)  # a new Python
        runpy.run_module("hf_vanilla_transformer.cli.average_checkpoints", run_name="__main__")
    assert json.loads((tmp_path / "averaged" / "config.json").read_text())["model_type"] == "vanilla_transformer"
