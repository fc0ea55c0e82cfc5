"""The callbacks `TranslationTrainer` adds to the Trainer's loop, each one job through transformers' public hooks: the
time budget and its progress bar, the last step's checkpoint, the token-budget sampler's epoch, a moving average of
the weights; and `autocast_off`, which evaluates a mixed-precision run in its saved precision.
"""

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import safetensors.torch
import torch
from tqdm.auto import tqdm
from transformers import ProgressCallback, TrainerCallback
from transformers.trainer_callback import ExportableState

from hf_vanilla_transformer.training.checkpoints import MOVING_AVERAGE_NAME, moving_average


class TimeLimitCallback(TrainerCallback, ExportableState):
    """Ends training, with a final checkpoint, once `minutes` of training have passed. Evaluation during training
    does not count, so that evaluating more often does not train less. The budget is the whole run's: each
    checkpoint records the training time spent so far (in its `trainer_state.json`), and a run resumed from it
    counts on from there. Every log entry records the training time at its step, `training_seconds` (with
    `minutes=None` that is all it does: the model card's training time is then still the whole run's)."""

    def __init__(self, minutes: float | None):
        self.seconds = math.inf if minutes is None else minutes * 60
        self.spent_before = 0.0  # training seconds of the runs this one resumed
        self.start = time.monotonic()
        self.evaluating = 0.0  # seconds of this run's evaluations

    def elapsed(self) -> float:
        return self.spent_before + time.monotonic() - self.start - self.evaluating

    def state(self) -> dict:
        minutes = None if math.isinf(self.seconds) else self.seconds / 60
        return {"args": {"minutes": minutes}, "attributes": {"spent_seconds": self.elapsed()}}

    @classmethod
    def spent_in(cls, state) -> float:
        """The training seconds a checkpoint's `TrainerState` records (0 before the first step)."""
        saved = state.stateful_callbacks.get(cls.__name__) if state.global_step else None
        return saved["attributes"]["spent_seconds"] if isinstance(saved, dict) else 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.spent_before = self.spent_in(state)
        self.start = time.monotonic()
        self.evaluating = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        if self.elapsed() >= self.seconds:
            control.should_training_stop = True
            control.should_save = args.save_strategy != "no"
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        # the Trainer logs an evaluation's metrics before `on_evaluate`: its runtime is not yet subtracted
        evaluation = sum(value for key, value in (logs or {}).items() if is_evaluation_runtime(key))
        if state.log_history:  # the entry the Trainer just appended for these logs
            state.log_history[-1]["training_seconds"] = round(self.elapsed() - evaluation, 1)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.evaluating += sum(value for key, value in (metrics or {}).items() if is_evaluation_runtime(key))


def is_evaluation_runtime(key: str) -> bool:
    """`Trainer.evaluate`'s runtime metric: `eval_runtime`, or `eval_NAME_runtime` for one of several datasets."""
    return key.startswith("eval_") and key.endswith("_runtime")


class TimeBudgetProgressCallback(ProgressCallback):
    """transformers' progress bars, with the training bar measured against the time limit instead of `max_steps`:
    the time spent of the time budget, the step and the latest training loss.
    """

    def __init__(self, time_limit: TimeLimitCallback):
        super().__init__()
        self.time_limit = time_limit
        self.postfix = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            # the bar's text is the budget's time, not tqdm's own clock: that one also counts evaluation, and
            # starts again at 0 in a resumed run
            spent = self.spent_seconds()
            self.training_bar = tqdm(
                total=round(self.time_limit.seconds),
                initial=spent,
                desc=self.spent_text(spent),
                bar_format="Training: {percentage:3.0f}%|{bar}| {desc}{postfix}",
                dynamic_ncols=True,
            )

    def spent_seconds(self) -> int:
        return min(round(self.time_limit.elapsed()), round(self.time_limit.seconds))

    def spent_text(self, spent: int) -> str:
        return f"{tqdm.format_interval(spent)} of {tqdm.format_interval(round(self.time_limit.seconds))}"

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar.n = self.spent_seconds()
            self.training_bar.set_description_str(self.spent_text(self.training_bar.n), refresh=False)
            self.postfix["step"] = state.global_step
            self.training_bar.set_postfix(self.postfix)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and "loss" in (logs or {}):
            self.postfix["loss"] = f"{logs['loss']:.4g}"
            self.training_bar.set_postfix(self.postfix)  # now: the last step's loss comes after its step end
        super().on_log(args, state, control, logs=logs, **kwargs)


class LastStepCheckpointCallback(TrainerCallback):
    """The last step is a checkpoint whatever `save_strategy` (but "no"), so that averaging includes it and a run
    resumed from it sees that training is over (transformers saves it for "steps" and "epoch", not "best")."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps and args.save_strategy == "best":
            control.should_save = True
        return control


class BatchSamplerEpoch(TrainerCallback):
    """Gives the token-budget sampler its epoch at the start of every epoch, a resumed one included. The Trainer
    calls `set_epoch` on its training DataLoader, which accelerate forwards to the batch sampler only where no
    `BatchSamplerShard` wraps it (one process), and not to the loader that `skip_first_batches` builds for the
    epoch a run resumes in; some transformers releases of our window reach into the shard and some do not, so the
    callback does it on all of them."""

    def __init__(self):
        self.sampler = None

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.sampler is not None:
            self.sampler.set_epoch(int(state.epoch or 0))  # e + the fraction done: e for an epoch begun or resumed


class MovingAverageCallback(TrainerCallback):
    """An exponential moving average of the weights (`moving_average`), updated after every optimizer step: an
    alternative to Section 6.1's average of the last checkpoints. `TranslationTrainer` saves it in each checkpoint
    (`MOVING_AVERAGE_NAME`, before the checkpoint's trainer state, so a complete checkpoint holds it), continues it
    from the checkpoint a run resumes from (`resume_from`), and makes the last checkpoint's the final model."""

    def __init__(self, decay: float):
        self.decay = decay
        self.average = None
        self.resume_from = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.average = moving_average(model, self.decay)
        if self.resume_from is not None:
            safetensors.torch.load_model(self.average, os.path.join(self.resume_from, MOVING_AVERAGE_NAME))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.average.update_parameters(model)

    def save(self, folder: str) -> None:
        safetensors.torch.save_model(self.average, os.path.join(folder, MOVING_AVERAGE_NAME))


@contextmanager
def autocast_off(model: torch.nn.Module, device_type: str) -> Iterator[None]:
    """Run `model`'s submodules with autocast off, also inside the autocast that accelerate wraps the model's own
    `forward` in under --bf16 / --fp16 (the innermost autocast context wins, and the submodules are called inside
    that forward). torch's module hooks enter and leave the context around each submodule call, an exception
    included (`always_call`)."""
    entered = []

    def enter(module, args):
        entered.append(torch.autocast(device_type, enabled=False))
        entered[-1].__enter__()

    def leave(module, args, output):
        entered.pop().__exit__(None, None, None)

    handles = []
    for child in model.children():
        handles += [child.register_forward_pre_hook(enter), child.register_forward_hook(leave, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
