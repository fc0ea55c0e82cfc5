"""The training clock: --max_train_minutes stops training with a checkpoint, evaluation does not count, and the
time spent counts on across the starts of a resumed run."""

import json
import re
import time

import pytest
import torch
from transformers import DataCollatorForSeq2Seq, ProgressCallback, TrainerCallback, TrainerState

from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.callbacks import TimeLimitCallback
from hf_vanilla_transformer.training.trainer import TranslationTrainer, training_is_over
from support.models import letter_tokenizer, random_token_dataset, tiny_model


def test_a_time_limit_stops_training_with_a_checkpoint_and_a_progress_bar_of_the_budget(tmp_path, capfd):
    dataset = random_token_dataset(200, seed=1)
    model = tiny_model()
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=100_000,
        max_train_minutes=0.03,  # 1.8 seconds
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="steps",
        save_steps=100_000,
        report_to=[],
        use_cpu=True,
    )
    trainer = TranslationTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(letter_tokenizer(), model=model),
    )
    assert [type(c).__name__ for c in trainer.callback_handler.callbacks if isinstance(c, ProgressCallback)] == [
        "TimeBudgetProgressCallback"
    ]
    seconds = trainer.train().metrics["train_runtime"]
    steps = trainer.state.global_step
    assert 1.8 <= seconds < 60 and 0 < steps < 100_000
    assert (tmp_path / f"checkpoint-{steps}" / "model.safetensors").is_file()  # saved where it stopped
    bar = capfd.readouterr().err.replace("\r", "\n").splitlines()
    last = [line for line in bar if line.startswith("Training:")][-1]
    assert re.fullmatch(rf"Training: 100%\|█+\| 00:02 of 00:02, step={steps}, loss=\d+(\.\d+)?", last.strip()), last
    assert not any("/100000" in line for line in bar)  # nothing counts towards max_steps

    # the budget is the whole run's: the checkpoint records the time spent, and a resumed run counts on from it
    checkpoint = str(tmp_path / f"checkpoint-{steps}")
    spent = TimeLimitCallback.spent_in(TrainerState.load_from_json(f"{checkpoint}/trainer_state.json"))
    assert 1.8 <= spent < 60
    collator = trainer.data_collator
    assert training_is_over(checkpoint, args)  # the budget is spent: nothing more to train
    resumed = TranslationTrainer(model=tiny_model(), args=args, train_dataset=dataset, data_collator=collator)
    with pytest.raises(ValueError, match=r"checkpoint-\d+: training is over there \(max_steps reached or the time"):
        resumed.train(resume_from_checkpoint=checkpoint)  # transformers would train a step more
    assert resumed.save_final_model(finished_checkpoint=checkpoint).global_step == steps  # the model it ended with
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), model.parameters(), strict=True))
    args.max_train_minutes = 0.06  # 3.6 seconds in all: about as long again
    assert not training_is_over(checkpoint, args)
    longer = TranslationTrainer(model=tiny_model(), args=args, train_dataset=dataset, data_collator=collator)
    started = time.monotonic()
    longer.train(resume_from_checkpoint=checkpoint)
    assert longer.state.global_step > steps and time.monotonic() - started < 3.6 - spent + 10
    total = TimeLimitCallback.spent_in(longer.state)
    assert 3.6 <= total < 3.6 + 10
    # the resumed run's bar counts the whole budget (tqdm's own clock would start again at 00:00)
    bar = [line.strip() for line in capfd.readouterr().err.replace("\r", "\n").splitlines()]
    bar = [line for line in bar if line.startswith("Training:")]
    assert re.fullmatch(r"Training: +\d+%\|.*\| 00:0[2-3] of 00:04", bar[0]), bar[0]  # from the time spent
    assert re.fullmatch(r"Training: 100%\|█+\| 00:04 of 00:04, step=\d+, loss=\d+(\.\d+)?", bar[-1]), bar[-1]


class SlowSteps(TrainerCallback):
    """Makes each training step last at least `seconds`, so that a time budget holds a known most of steps."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_begin(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def test_evaluation_during_training_does_not_count_towards_the_time_limit(tmp_path):
    def slow_metrics(prediction):
        time.sleep(0.5)
        return {"answer": 42.0}

    dataset = random_token_dataset(200, seed=1)
    model = tiny_model()
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=100_000,
        max_train_minutes=0.03,
        per_device_train_batch_size=4,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = TranslationTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=random_token_dataset(8, seed=2),
        data_collator=DataCollatorForSeq2Seq(letter_tokenizer(), model=model),
        compute_metrics=slow_metrics,
        callbacks=[SlowSteps(0.3)],
    )
    started = time.monotonic()
    trainer.train()
    wall = time.monotonic() - started
    # an evaluation after every step, however fast the machine: the budget (1.8 s) holds 6 steps of 0.3 s at most,
    # and at least one
    evaluations = [entry["eval_runtime"] for entry in trainer.state.log_history if "eval_answer" in entry]
    assert 1 <= len(evaluations) <= 7 and all(runtime >= 0.5 for runtime in evaluations)  # each slept 0.5 s
    # the budget counts training alone: it trained until 1.8 s were spent, and the evaluations' seconds are not among
    # them (were they counted, training and evaluations would outlast the call)
    (clock,) = [callback for callback in trainer.callback_handler.callbacks if isinstance(callback, TimeLimitCallback)]
    trained = clock.elapsed()
    assert trained >= 1.8 and trained + sum(evaluations) <= wall
    # every log entry records the training time at its step
    times = [entry["training_seconds"] for entry in trainer.state.log_history]
    assert times == sorted(times) and times[-1] <= trained + 0.05  # 0.05: the log rounds to tenths


def test_without_a_time_limit_the_training_time_still_counts_every_start(tmp_path):
    """The card's training time is the last log entry's `training_seconds`: a resumed run's counts on from the time
    its checkpoint records (the Trainer's own `train_runtime` is the last start's alone). The checkpoint's record is
    set to 1000 s, so that the resumed run shows counting on from it whatever the machine's speed."""
    dataset = random_token_dataset(64, seed=2)
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_steps=6,
        report_to=[],
        use_cpu=True,
    )
    collator = DataCollatorForSeq2Seq(letter_tokenizer(), model=tiny_model())
    first = TranslationTrainer(model=tiny_model(), args=args, train_dataset=dataset, data_collator=collator)
    first.train()
    first_start = [entry["training_seconds"] for entry in first.state.log_history if "loss" in entry]
    state_file = tmp_path / "checkpoint-6" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    recorded = state["stateful_callbacks"]["TimeLimitCallback"]
    assert recorded["args"]["minutes"] is None and round(recorded["attributes"]["spent_seconds"], 1) >= first_start[-1]
    recorded["attributes"]["spent_seconds"] = 1000.0
    state_file.write_text(json.dumps(state))

    args.max_steps = 9
    resumed = TranslationTrainer(model=tiny_model(), args=args, train_dataset=dataset, data_collator=collator)
    started = time.monotonic()
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    wall_seconds = time.monotonic() - started
    times = [entry["training_seconds"] for entry in resumed.state.log_history if "loss" in entry]
    assert len(first_start) == 6 and times[:6] == first_start  # the first start's record, from the checkpoint
    assert len(times) == 9 and times[6:] == sorted(times[6:])
    assert all(1000 <= seconds <= 1000 + wall_seconds + 0.05 for seconds in times[6:]), times  # 0.05: rounding
    assert 1000 <= TimeLimitCallback.spent_in(resumed.state) <= 1000 + wall_seconds  # what checkpoint-9 records
