"""Training utilities for the paper's recipe (Section 5): its settings as `TrainingArguments` defaults, token-budget
batches, the learning-rate schedule, checkpoint averaging, a time budget, and a `Seq2SeqTrainer` that uses them.

- Settings (Sections 5.3, 5.4): `TranslationTrainingArguments` is `Seq2SeqTrainingArguments` with the paper's
  values as defaults, written once here; recipes, benchmarks and tests read them from it.
- Batching (Section 5.1): "Sentence pairs were batched together by approximate sequence length. Each training
  batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."
  transformers' samplers fix the number of *sentences* per batch (`group_by_length`, `batch_rebalance`), so we
  add `TokenBudgetBatchSampler`, which fixes the number of *tokens*.
- Schedule (Section 5.3, Equation 3): lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5). That is
  transformers' `inverse_sqrt` schedule, lr * min(step / warmup, sqrt(warmup / step)), with the peak
  lr = d_model^-0.5 * warmup^-0.5 (`paper_learning_rate`), so we use it as it is.
- Checkpoint averaging (Section 6.1): "we used a single model obtained by averaging the last 5 checkpoints", with
  the functions of `checkpoints.py` once training is over (`TranslationTrainer.save_final_model`).
- Label smoothing (Section 5.4) is the Trainer's own `label_smoothing_factor`.
- A time budget (ours, not the paper's): `max_train_minutes` ends training with a checkpoint, so that a recipe
  fits a machine's time; the progress bar then measures that budget.
- Decoding (Section 6.1): one generation config for evaluation and for the saved model
  (`fold_generation_settings`), so that a saved model translates as it was scored.
"""

import copy
import inspect
import logging
import math
import os
import random
import time
from collections.abc import Iterator, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass, field

import datasets
import torch
from torch.utils.data import DataLoader, Sampler
from tqdm.auto import tqdm
from transformers import (
    EvalPrediction,
    GenerationConfig,
    ProgressCallback,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState, TrainerState
from transformers.trainer_pt_utils import nested_truncate
from transformers.trainer_utils import EvalLoopOutput, SchedulerType, TrainOutput

from .checkpoints import last_checkpoints, load_averaged_checkpoints, rotate_checkpoints

logger = logging.getLogger(__name__)


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` whose defaults are the paper's recipe, plus the settings the recipe adds.

    Section 5.3: Adam with beta1 = 0.9 (transformers' default too), beta2 = 0.98, epsilon = 1e-9, and the learning
    rate of Equation 3 — transformers' `inverse_sqrt` schedule over 4,000 warmup steps, whose peak is
    `learning_rate_scale` * d_model^-0.5 * warmup_steps^-0.5 unless `learning_rate` is given. Section 5.4: label
    smoothing 0.1. The paper names no weight decay (transformers' default is none) and no gradient clipping.
    """

    adam_beta2: float = field(default=0.98, metadata={"help": "Adam's beta2 (Section 5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam's epsilon (Section 5.3: 1e-9)."})
    lr_scheduler_type: SchedulerType | str = field(
        default="inverse_sqrt", metadata={"help": "The schedule; inverse_sqrt is Equation 3's."}
    )
    warmup_steps: float = field(default=4000, metadata={"help": "Warmup steps of Equation 3 (Section 5.3: 4000)."})
    learning_rate: float | None = field(
        default=None,
        metadata={"help": "Peak learning rate (default: learning_rate_scale * d_model^-0.5 * warmup_steps^-0.5)."},
    )
    learning_rate_scale: float = field(
        default=1.0, metadata={"help": "Multiplies Equation 3 when learning_rate is not given (the paper: 1)."}
    )
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "Label smoothing (Section 5.4: 0.1)."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping norm; 0: none, as in the paper."})
    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={"help": "Token budget of a training batch, per process and accumulation step (Section 5.1)."},
    )
    average_last_checkpoints: int = field(
        default=1, metadata={"help": "Average the weights of the last K checkpoints into the final model (6.1)."}
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={"help": "Stop training (after saving a checkpoint) once this much training time has passed "
                  "(evaluation during training does not count)."},
    )  # fmt: skip
    keep_checkpoints: bool = field(
        default=False,
        metadata={"help": "Keep every checkpoint once the final model is saved (default: only the last, which a "
                  "resumed run or a longer budget starts from)."},
    )  # fmt: skip
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a non-empty output_dir (transformers 5 removed this setting)."}
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "Every parameter takes part in every step; transformers' default (True) would make DDP "
                  "walk the autograd graph once more each step."},
    )  # fmt: skip
    keep_newest_checkpoints: int | None = field(
        default=None, init=False, metadata={"help": "save_total_limit, for TranslationTrainer's rotation by step."}
    )

    def __post_init__(self):
        super().__post_init__()
        # transformers rotates checkpoints by modification time, which a stopped deletion upsets (`rotate_checkpoints`):
        # the limit goes to TranslationTrainer's rotation by step, and `save_total_limit` None keeps the Trainer's off
        self.keep_newest_checkpoints, self.save_total_limit = self.save_total_limit, None
        averaged, kept = self.average_last_checkpoints, self.keep_newest_checkpoints
        if averaged < 1:
            raise ValueError(f"average_last_checkpoints {averaged} must be at least 1")
        if averaged > 1 and self.save_strategy == "no":
            raise ValueError(f"average_last_checkpoints {averaged} needs checkpoints, and save_strategy is 'no'")
        if kept and averaged > kept:
            raise ValueError(f"average_last_checkpoints {averaged} is more than the save_total_limit {kept} "
                             "checkpoints kept")  # fmt: skip
        if self.max_tokens_per_batch is not None and self.train_sampling_strategy != "random":
            raise ValueError(f"train_sampling_strategy {self.train_sampling_strategy!r} has no effect with "
                             "max_tokens_per_batch, whose batches are grouped by length and shuffled")  # fmt: skip


# The settings that only one way of decoding reads: GenerationConfig.validate (transformers 5.24) refuses to save a
# config that holds them for another (the paper's length penalty with greedy decoding, a temperature without sampling).
BEAM_SEARCH_ONLY = ("length_penalty", "early_stopping")
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff")


def fold_generation_settings(model, args: Seq2SeqTrainingArguments, **settings) -> GenerationConfig:
    """Write a run's decoding settings into `model.generation_config`, which evaluation then uses and the model is
    saved with, and return it: the Trainer's `args.generation_config` (a generation config file or folder: the
    settings it holds; transformers would replace the model's whole config, its length limits included),
    `args.generation_num_beams` and `args.generation_max_length` (transformers passes those to each evaluation's
    `generate()` only, so a model saved by a run decoded unlike the run's scores), then `settings` (e.g.
    `num_beams`, `length_penalty`; `None` values are not given). The three are cleared from `args`.

    A setting that the resulting decoding ignores (see `BEAM_SEARCH_ONLY`, `SAMPLING_ONLY`) goes back to
    transformers' default when it came from the model, and is an error naming it when it was given.
    """
    config = copy.deepcopy(model.generation_config)
    given = {}
    if args.generation_config is not None:
        given.update(Seq2SeqTrainer.load_generation_config(args.generation_config).to_diff_dict())
        given.pop("transformers_version", None)
    for settings_in_order in (
        {"num_beams": args.generation_num_beams, "max_length": args.generation_max_length},
        settings,
    ):
        given.update({name: value for name, value in settings_in_order.items() if value is not None})
    config.update(**given)
    if config.num_beams is not None and config.num_beams < 1:
        raise ValueError(f"num_beams={config.num_beams} must be at least 1")
    greedy_or_sampling = (config.num_beams or 1) == 1
    ignored = (BEAM_SEARCH_ONLY if greedy_or_sampling else ()) + (() if config.do_sample else SAMPLING_ONLY)
    for name in ignored:
        if name in given:
            mode = "greedy decoding or sampling (num_beams=1)" if name in BEAM_SEARCH_ONLY else "do_sample=False"
            raise ValueError(f"{name}={given[name]!r} has no effect with {mode}: leave it out")
        setattr(config, name, None)
    config.validate(strict=True)
    model.generation_config = config
    args.generation_config = args.generation_num_beams = args.generation_max_length = None
    return config


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of sentence pairs of similar length, each padded to at most `max_tokens` source and target tokens.

    Pairs are sorted by (source length, target length), ties broken at random each epoch, and cut into batches
    that stay within the budget once padded: len(batch) * longest source <= max_tokens, and the same for targets.
    The batches are then shuffled (with the same seed on every process). An optimizer step takes
    `num_processes * accumulation_steps` batches; if the number of batches is not a multiple of that, the largest
    batches are halved until it is, as every process must run the same number of steps. A pair longer than the
    budget on its own forms a batch alone.

    On several processes, accelerate shares the batches out: `accelerator.prepare` wraps the sampler in its
    `BatchSamplerShard`, which deals them round-robin, process r taking batches r, r + N, r + 2N, ... So N processes
    and one process accumulating N batches take the same batches in the same steps. (The sampler has no
    `batch_size`: accelerate then deals its batches as they are, whatever their sizes.)
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        num_processes: int = 1,
        accumulation_steps: int = 1,
        shuffle: bool = True,
        seed: int = 0,
    ):
        if len(source_lengths) != len(target_lengths):
            raise ValueError("source_lengths and target_lengths differ in length")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if num_processes < 1:
            raise ValueError(f"num_processes must be positive, got {num_processes}")
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be positive, got {accumulation_steps}")
        self.source_lengths = list(source_lengths)
        self.target_lengths = list(target_lengths)
        self.max_tokens = max_tokens
        self.num_processes = num_processes
        self.accumulation_steps = accumulation_steps
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.batch_count = len(self.all_batches(epoch=0))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batch_count

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.all_batches(self.epoch))

    def all_batches(self, epoch: int) -> list[list[int]]:
        rng = random.Random(self.seed + epoch)
        order = list(range(len(self.source_lengths)))
        if self.shuffle:
            rng.shuffle(order)
        order.sort(key=lambda i: (self.source_lengths[i], self.target_lengths[i]))

        # The budget holds for both sides at once: len(batch) * max(longest source, longest target) <= max_tokens.
        batches, batch, longest = [], [], 0
        for index in order:
            length = max(self.source_lengths[index], self.target_lengths[index])
            if batch and (len(batch) + 1) * max(longest, length) > self.max_tokens:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(index)
            longest = max(longest, length)
        if batch:
            batches.append(batch)

        per_step = self.num_processes * self.accumulation_steps
        while len(batches) % per_step:
            largest = max(range(len(batches)), key=lambda b: len(batches[b]))
            if len(batches[largest]) < 2:
                raise ValueError(
                    f"{len(order)} examples cannot fill the {per_step} batches of a step "
                    f"({self.num_processes} processes x {self.accumulation_steps} accumulation steps)"
                )
            half = len(batches[largest]) // 2
            batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
        if self.shuffle:
            rng.shuffle(batches)
        return batches


def paper_learning_rate(d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """The peak of Equation 3, scale * d_model^-0.5 * warmup^-0.5, reached at step `warmup_steps`."""
    if warmup_steps < 1 or warmup_steps != int(warmup_steps):
        raise ValueError(f"warmup_steps {warmup_steps} must be a whole number of steps, at least 1, for Equation 3")
    return scale * d_model**-0.5 * int(warmup_steps) ** -0.5


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
    calls `set_epoch` on its training DataLoader, which accelerate (1.15) forwards to the batch sampler only where no
    `BatchSamplerShard` wraps it (one process), and not to the loader that `skip_first_batches` builds for the
    epoch a run resumes in; transformers 5.23 and 5.24 also reach into the shard, 5.16 does not."""

    def __init__(self):
        self.sampler = None

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.sampler is not None:
            self.sampler.set_epoch(int(state.epoch or 0))  # e + the fraction done: e for an epoch begun or resumed


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
            raise ValueError(f"resume_from_checkpoint {resume_from_checkpoint}: training is over there (max_steps "
                             "reached or the time budget spent); save_final_model(it) saves its model")  # fmt: skip
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def model_input_columns(self, dataset):
        """`dataset` with only the columns the model's `forward` takes, and the labels, as the Trainer keeps them
        with `remove_unused_columns` (its own method for that is private)."""
        if not self.args.remove_unused_columns or not isinstance(dataset, datasets.Dataset):
            return dataset
        taken = {*inspect.signature(self.model.forward).parameters, "label", "label_ids", *self.label_names}
        return dataset.select_columns([column for column in dataset.column_names if column in taken])

    def get_train_dataloader(self) -> DataLoader:
        max_tokens = getattr(self.args, "max_tokens_per_batch", None)
        if max_tokens is None:
            return super().get_train_dataloader()
        dataset = self.model_input_columns(self.train_dataset)
        sampler = TokenBudgetBatchSampler(
            [len(ids) for ids in dataset["input_ids"]],
            [len(ids) for ids in dataset["labels"]],
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

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval") -> EvalLoopOutput:  # fmt: skip
        """`Trainer.evaluation_loop` with one prediction per example on several processes. accelerate fills every
        process's last batch with examples from the dataset's start, and Seq2SeqTrainer.evaluate/predict gather
        with `accelerator.gather`, which keeps them (32 predictions for 24 references). Batched in dataset order
        (`dataloader_in_order`), the first `len(dataset)` gathered rows are the dataset's: what the loop returns is
        cut there, and so is what `compute_metrics` receives (`metrics_per_example`: transformers offers no hook
        between gathering and `compute_metrics`)."""
        self.examples_in_evaluation = len(dataloader.dataset) if isinstance(dataloader.dataset, Sized) else None
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                         metric_key_prefix)  # fmt: skip
        return EvalLoopOutput(self.first_examples(output.predictions), self.first_examples(output.label_ids),
                              output.metrics, output.num_samples)  # fmt: skip

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
        asks, with the trainer state; then delete the checkpoints but the last, unless `args.keep_checkpoints`.
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
            # Every process averages into its own model (each evaluates next), from checkpoints that only the main
            # process writes and deletes: all read the same complete folders, between two waits.
            self.accelerator.wait_for_everyone()
            if count > 1 or finished_checkpoint is not None:
                folders = last_checkpoints(output_dir, count)
                if len(folders) < count:
                    logger.warning("Only %d checkpoints to average (asked for %d)", len(folders), count)
                logger.info("Averaging %s", ", ".join(os.path.basename(folder) for folder in folders))
                load_averaged_checkpoints(self.model, folders)
            self.accelerator.wait_for_everyone()
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
