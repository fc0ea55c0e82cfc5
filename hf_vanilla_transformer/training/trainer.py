"""The Trainer of the paper's recipe: `TranslationTrainer`, a `Seq2SeqTrainer` driven by `TranslationTrainingArguments`
(arguments.py), with token-budget batches (batches.py), a time budget and its progress bar, checkpoint rotation and
averaging (checkpoints.py: Section 6.1, "we used a single model obtained by averaging the last 5 checkpoints").

A time budget (ours, not the paper's): `max_train_minutes` ends training with a checkpoint, so that a recipe fits a
machine's time; the progress bar then measures that budget.
"""

import inspect
import logging
import math
import os
import time
from collections.abc import Iterator, Sized
from contextlib import contextmanager

import datasets
import safetensors.torch
import torch
from accelerate.utils import broadcast
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import (
    EvalPrediction,
    ProgressCallback,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState, TrainerState
from transformers.trainer_pt_utils import nested_truncate
from transformers.trainer_utils import EvalLoopOutput, TrainOutput, get_last_checkpoint

from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments, paper_learning_rate
from hf_vanilla_transformer.training.batches import TokenBudgetBatchSampler, token_counts
from hf_vanilla_transformer.training.checkpoints import (
    CHECKPOINT,
    MOVING_AVERAGE_NAME,
    last_checkpoints,
    load_averaged_checkpoints,
    load_moving_average,
    moving_average,
    rotate_checkpoints,
)
from hf_vanilla_transformer.training.tokenizer import BPEDropoutCollator

logger = logging.getLogger(__name__)


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


def training_is_over(checkpoint: str, args: Seq2SeqTrainingArguments) -> bool:
    """Whether a run given `args` has nothing more to train from `checkpoint`: `max_steps` reached (or, training by
    epochs, the step count the checkpoint's run ended at, for the same `num_train_epochs`), or the time budget
    `max_train_minutes` spent. Read from the checkpoint's `trainer_state.json`."""
    state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
    if 0 < args.max_steps <= state.global_step:
        return True
    by_epochs = args.max_steps <= 0 and state.num_train_epochs == args.num_train_epochs
    if by_epochs and 0 < state.max_steps <= state.global_step:
        return True
    minutes = getattr(args, "max_train_minutes", None)
    return minutes is not None and TimeLimitCallback.spent_in(state) >= minutes * 60


class CheckpointCallback(TrainerCallback):
    """The recipe's checkpoints, kept through the Trainer's public hooks:

    - the last step is a checkpoint whatever `save_strategy` (but "no"), so that averaging includes it and a run
      resumed from it sees that training is over (transformers saves it for "steps" and "epoch", not "best");
    - after each save, the newest `args.keep_newest_checkpoints` stay, by step, and older folders are renamed away
      before their files are deleted (`rotate_checkpoints`). `TranslationTrainingArguments` takes the stock
      `save_total_limit` for this and leaves transformers' own rotation, by modification time, off.
    """

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps and args.save_strategy == "best":
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:
            rotate_checkpoints(args.output_dir, args.keep_newest_checkpoints, keep=state.best_model_checkpoint)


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


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` for the paper's recipe, driven by `TranslationTrainingArguments`:

    - training batches of about `max_tokens_per_batch` tokens (per process and step of gradient accumulation)
      instead of a fixed number of sentences (`None`: the Trainer's own batches);
    - the learning rate of Equation 3 for the model's d_model when `learning_rate` is not given;
    - a time limit, `max_train_minutes`, with a progress bar against it;
    - checkpoints rotated by step, the last step always saved (`CheckpointCallback`);
    - `save_final_model()`: the mean of the last `average_last_checkpoints` checkpoints saved as the model, and
      then the checkpoints deleted but the last (`keep_checkpoints` keeps them): the run folder is the model;
    - resuming that ends where an uninterrupted run does: half-written checkpoints are passed over
      (`checkpoint_folders`), and `train()` refuses a checkpoint at which training is over (`training_is_over`:
      transformers would train a step more), whose run goes straight to `save_final_model(checkpoint)`.

    With any training arguments it evaluates and predicts
    - in dataset order (transformers 5 also applies `train_sampling_strategy="group_by_length"` to evaluation,
      whose predictions then come back in another order than the references they are scored against);
    - with one prediction per example on several processes (see `evaluation_loop`; `compute_metrics` given to the
      constructor, by keyword, receives one too);
    - in the saved model's precision under --bf16 / --fp16 (see `prediction_step`).

    The train dataset needs `input_ids` and `labels` columns for token budgets.
    """

    def __init__(self, model=None, args=None, *other, compute_metrics=None, **kwargs):
        if args is not None and getattr(args, "learning_rate", 0) is None:
            args.learning_rate = paper_learning_rate(model.config.d_model, args.warmup_steps, args.learning_rate_scale)
        self.examples_in_evaluation = None
        if compute_metrics is not None:
            compute_metrics = self.metrics_per_example(compute_metrics)
        super().__init__(model, args, *other, compute_metrics=compute_metrics, **kwargs)
        self.batch_sampler_epoch = BatchSamplerEpoch()
        self.add_callback(self.batch_sampler_epoch)
        if isinstance(self.args, TranslationTrainingArguments):
            self.add_callback(CheckpointCallback())
            minutes = self.args.max_train_minutes  # the training clock runs with or without a limit
            time_limit = TimeLimitCallback(minutes)
            self.add_callback(time_limit)
            if minutes is not None and self.pop_callback(ProgressCallback) is not None:
                self.add_callback(TimeBudgetProgressCallback(time_limit))
        self.moving_average = None
        if isinstance(self.args, TranslationTrainingArguments) and self.args.ema_decay is not None:
            self.moving_average = MovingAverageCallback(self.args.ema_decay)
            self.add_callback(self.moving_average)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs) -> TrainOutput:
        """`Trainer.train`, refusing a checkpoint at which training is over (`training_is_over`): transformers would
        train one step more from it, and a run stopped after its training would not end where an uninterrupted run
        does. `save_final_model(checkpoint)` saves the final model from it."""
        checkpoint = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        if (
            checkpoint
            and os.path.isfile(os.path.join(checkpoint, TRAINER_STATE_NAME))
            and training_is_over(checkpoint, self.args)
        ):
            raise ValueError(
                f"resume_from_checkpoint {resume_from_checkpoint}: training is over there (max_steps "
                "reached or the time budget spent); save_final_model(it) saves its model"
            )
        if self.moving_average is not None:  # the checkpoint transformers resumes from, where the average goes on
            resumed = get_last_checkpoint(self.args.output_dir) if resume_from_checkpoint is True else checkpoint
            if resumed is not None and not os.path.isfile(os.path.join(resumed, MOVING_AVERAGE_NAME)):
                missing = f"{MOVING_AVERAGE_NAME}: its run had no --ema_decay"
                raise ValueError(
                    f"resume_from_checkpoint {resumed}: no moving average of the weights to go on from, {missing}"
                )
            self.moving_average.resume_from = resumed
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def save_model(self, output_dir: str | None = None, *args, **kwargs) -> None:
        """`Trainer.save_model`, which the Trainer also calls first when it writes a checkpoint: there, the moving
        average of the weights goes in beside the model, before the trainer state that completes the checkpoint."""
        super().save_model(output_dir, *args, **kwargs)
        checkpoint = output_dir is not None and CHECKPOINT.fullmatch(os.path.basename(os.path.normpath(output_dir)))
        if self.moving_average is not None and checkpoint and self.args.should_save:
            self.moving_average.save(output_dir)

    def model_input_columns(self, dataset):
        """`dataset` with only the columns the model's `forward` takes, and the labels, as the Trainer keeps them
        with `remove_unused_columns` (its own method for that is private), and the text BPE-dropout encodes."""
        if not self.args.remove_unused_columns or not isinstance(dataset, datasets.Dataset):
            return dataset
        taken = {*inspect.signature(self.model.forward).parameters, "label", "label_ids", *self.label_names}
        if isinstance(self.data_collator, BPEDropoutCollator):
            taken.update(self.data_collator.text_columns)
        return dataset.select_columns([column for column in dataset.column_names if column in taken])

    def get_train_dataloader(self) -> DataLoader:
        max_tokens = getattr(self.args, "max_tokens_per_batch", None)
        if max_tokens is None:
            return super().get_train_dataloader()
        dataset = self.model_input_columns(self.train_dataset)
        sampler = TokenBudgetBatchSampler(
            token_counts(dataset, "input_ids"),
            token_counts(dataset, "labels"),
            max_tokens=max_tokens,
            num_processes=self.args.world_size,
            accumulation_steps=self.args.gradient_accumulation_steps,
            seed=self.args.seed,
        )
        self.batch_sampler_epoch.sampler = sampler
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)  # on several processes, accelerate deals the batches out

    def get_eval_dataloader(self, eval_dataset: str | datasets.Dataset | None = None) -> DataLoader:
        """The Trainer's evaluation batches, always in dataset order (see `dataloader_in_order`)."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        return self.dataloader_in_order(self.eval_dataset if eval_dataset is None else eval_dataset)

    def get_test_dataloader(self, test_dataset: datasets.Dataset) -> DataLoader:
        return self.dataloader_in_order(test_dataset)

    def dataloader_in_order(self, dataset) -> DataLoader:
        """Batches of `args.eval_batch_size` examples in dataset order. transformers 5 chooses evaluation's sampler
        as training's with `train_sampling_strategy="group_by_length"` (a LengthGroupedSampler); here evaluation
        takes none, so it goes in order, and on several processes accelerate shares the batches out and fills the
        last ones with examples from the start, which come after the dataset's own (`evaluation_loop`)."""
        loader = DataLoader(
            self.model_input_columns(dataset),
            batch_size=self.args.eval_batch_size,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ) -> EvalLoopOutput:
        """`Trainer.evaluation_loop` with one prediction per example on several processes. accelerate fills every
        process's last batch with examples from the dataset's start, and Seq2SeqTrainer.evaluate/predict gather
        with `accelerator.gather`, which keeps them (32 predictions for 24 references). Batched in dataset order
        (`dataloader_in_order`), the first `len(dataset)` gathered rows are the dataset's: what the loop returns is
        cut there, and so is what `compute_metrics` receives (`metrics_per_example`: transformers offers no hook
        between gathering and `compute_metrics`)."""
        self.examples_in_evaluation = len(dataloader.dataset) if isinstance(dataloader.dataset, Sized) else None
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        return EvalLoopOutput(
            self.first_examples(output.predictions),
            self.first_examples(output.label_ids),
            output.metrics,
            output.num_samples,
        )

    def first_examples(self, arrays):
        """The rows of gathered `arrays` that are the evaluated dataset's, in its order (see `evaluation_loop`)."""
        if arrays is None or self.examples_in_evaluation is None:  # an iterable dataset: its count is not known
            return arrays
        return nested_truncate(arrays, self.examples_in_evaluation)

    def metrics_per_example(self, compute_metrics):
        """`compute_metrics` on one prediction (label, input, loss) per example (see `evaluation_loop`)."""

        def compute(prediction: EvalPrediction, **options):
            parts = (prediction.predictions, prediction.label_ids, prediction.inputs, prediction.losses)
            return compute_metrics(EvalPrediction(*map(self.first_examples, parts)), **options)

        return compute

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """`Seq2SeqTrainer.prediction_step` in the model's own precision. Under --bf16 / --fp16 accelerate wraps the
        model's `forward` in autocast for evaluation too, and transformers has no setting for evaluating a
        mixed-precision run in full precision (`--bf16_full_eval` casts the model to bfloat16): the scores would
        describe another model than the one saved. Autocast is turned off inside it (`autocast_off`)."""
        with autocast_off(self.model, self.accelerator.device.type):
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)

    def save_final_model(self, finished_checkpoint: str | None = None) -> TrainerState:
        """Save the trained model in `args.output_dir`, averaged (Section 6.1) when `args.average_last_checkpoints`
        asks, or the moving average of the weights under `args.ema_decay`, with the trainer state; then delete the
        checkpoints but the last, unless `args.keep_checkpoints`.
        Returns the trainer state saved.

        `finished_checkpoint`: a checkpoint at which training was already over (`training_is_over`), for a run
        that trained nothing; its trainer state and weights stand for the training's end. A run ended at the step
        its saved model records (a rerun of a finished run, or one stopped while deleting) loads the saved model
        instead of averaging again: the checkpoints it averaged are gone.
        """
        args, output_dir = self.args, self.args.output_dir
        if finished_checkpoint is None:
            state, count = self.state, args.average_last_checkpoints
        else:
            state = TrainerState.load_from_json(os.path.join(finished_checkpoint, TRAINER_STATE_NAME))
            count = max(args.average_last_checkpoints, 1)  # the checkpoint's own weights at the least
        if saved_model_is_of(output_dir, state):
            logger.info("%s holds this run's final model already: loaded, not averaged again", output_dir)
            load_averaged_checkpoints(self.model, [output_dir])  # the mean of one folder: its weights
        else:
            # Only the main process reads the checkpoints, which only it writes and deletes: on several machines
            # without a shared disk only its machine has them. Every process evaluates next, with the averaged
            # weights the main process sends it. The wait: on a shared disk, every process has looked for a saved
            # model (above) before the main process saves one.
            self.accelerator.wait_for_everyone()
            if self.moving_average is not None or count > 1 or finished_checkpoint is not None:
                if self.is_world_process_zero() and self.moving_average is not None:
                    newest = finished_checkpoint or last_checkpoints(output_dir, 1)[0]
                    logger.info("The moving average of the weights in %s", os.path.basename(newest))
                    load_moving_average(self.model, newest)
                elif self.is_world_process_zero():
                    folders = last_checkpoints(output_dir, count)
                    if len(folders) < count:
                        logger.warning("Only %d checkpoints to average (asked for %d)", len(folders), count)
                    logger.info("Averaging %s", ", ".join(os.path.basename(folder) for folder in folders))
                    load_averaged_checkpoints(self.model, folders)
                broadcast(list(self.model.state_dict().values()), from_process=0)  # in place
            self.save_model()
            if self.is_world_process_zero():  # last: the saved trainer state says that the model beside it is complete
                state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))
        self.accelerator.wait_for_everyone()
        if not args.keep_checkpoints and self.is_world_process_zero():
            rotate_checkpoints(output_dir, limit=1)
        return state


def saved_model_is_of(output_dir: str, state: TrainerState) -> bool:
    """Whether `output_dir` holds the final model saved at the end of the run `state` describes: its trainer state
    names the step and continues the log of `state`."""
    try:
        saved = TrainerState.load_from_json(os.path.join(output_dir, TRAINER_STATE_NAME))
    except (OSError, ValueError):
        return False
    return saved.global_step == state.global_step and saved.log_history[: len(state.log_history)] == state.log_history
