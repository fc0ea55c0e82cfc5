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
- Checkpoint averaging (Section 6.1): "we used a single model obtained by averaging the last 5 checkpoints".
- Label smoothing (Section 5.4) is the Trainer's own `label_smoothing_factor`.
- A time budget (ours, not the paper's): `max_train_minutes` ends training with a checkpoint, so that a recipe
  fits a machine's time; the progress bar then measures that budget.
- Decoding (Section 6.1): one generation config for evaluation and for the saved model
  (`fold_generation_settings`), so that a saved model translates as it was scored.
"""

import copy
import json
import logging
import math
import os
import random
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, Sampler, SequentialSampler
from tqdm.auto import tqdm
from transformers import (
    GenerationConfig,
    ProgressCallback,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState, TrainerState
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import SchedulerType, TrainOutput

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
    The batches are then shuffled (same seed on every process) and dealt out round-robin, so each of the
    `num_replicas` processes gets a disjoint share and every pair is seen exactly once per epoch. An optimizer step
    takes `num_replicas * accumulation_steps` batches; if the number of batches is not a multiple of that, the
    largest batches are halved until it is, as every process must run the same number of steps. So N processes and
    one process accumulating N batches get the same batches in the same order. A pair longer than the budget on its
    own forms a batch alone.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        accumulation_steps: int = 1,
    ):
        if len(source_lengths) != len(target_lengths):
            raise ValueError("source_lengths and target_lengths differ in length")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be positive, got {accumulation_steps}")
        self.source_lengths = list(source_lengths)
        self.target_lengths = list(target_lengths)
        self.max_tokens = max_tokens
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.accumulation_steps = accumulation_steps
        self.epoch = 0
        self._length = len(self._all_batches(epoch=0)) // num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._all_batches(self.epoch)[self.rank :: self.num_replicas])

    def _all_batches(self, epoch: int) -> list[list[int]]:
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

        per_step = self.num_replicas * self.accumulation_steps
        while len(batches) % per_step:
            largest = max(range(len(batches)), key=lambda b: len(batches[b]))
            if len(batches[largest]) < 2:
                raise ValueError(
                    f"{len(order)} examples cannot fill the {per_step} batches of a step "
                    f"({self.num_replicas} processes x {self.accumulation_steps} accumulation steps)"
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


CHECKPOINT = re.compile(r"checkpoint-(\d+)")
BEING_DELETED = ".deleting-"  # the prefix a checkpoint folder is renamed to before its files are deleted


def checkpoint_folders(output_dir: str) -> list[str]:
    """The Trainer's complete `checkpoint-STEP` folders in `output_dir`, oldest first. A folder that a stopped run
    left half-written is passed over, with a log line: the Trainer writes a checkpoint's `trainer_state.json` last,
    so a checkpoint is complete when that file reads as JSON and names the folder's step. (A folder is renamed
    away before it is deleted, `rotate_checkpoints`, so a half-deleted one is never mistaken for a checkpoint.)"""
    steps = []
    for name in os.listdir(output_dir) if os.path.isdir(output_dir) else []:
        match = CHECKPOINT.fullmatch(name)
        if not match:
            continue
        if is_complete_checkpoint(os.path.join(output_dir, name), int(match.group(1))):
            steps.append(int(match.group(1)))
        else:
            logger.warning("%s is incomplete (its run stopped while writing it): not used", name)
    return [os.path.join(output_dir, f"checkpoint-{step}") for step in sorted(steps)]


def rotate_checkpoints(output_dir: str, limit: int | None, keep: str | None = None) -> None:
    """Keep the newest `limit` complete checkpoints by step (and `keep`, the best one), and delete the folders of
    older steps, complete or not.

    transformers' own rotation orders the folders by modification time, which deleting files changes: a run
    stopped while deleting a folder leaves it half-deleted and, to the next rotation, the newest, so a newer
    checkpoint is deleted in its place and checkpoint averaging reads the half-deleted one. Here the order is the
    step's, and each folder is renamed away (atomically) before its files are deleted.
    """
    if not os.path.isdir(output_dir):
        return
    for name in os.listdir(output_dir):  # what a stopped deletion left
        if name.startswith(BEING_DELETED):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
    complete = checkpoint_folders(output_dir)
    if not limit or len(complete) <= limit:
        return
    oldest_kept = int(CHECKPOINT.fullmatch(os.path.basename(complete[-limit])).group(1))
    steps = sorted(int(match.group(1)) for match in map(CHECKPOINT.fullmatch, os.listdir(output_dir)) if match)
    for step in steps:
        name = f"checkpoint-{step}"
        folder = os.path.join(output_dir, name)
        if step < oldest_kept and not (keep and os.path.samefile(folder, keep)):
            logger.info("Deleting %s (keeping the newest %d)", name, limit)
            os.replace(folder, os.path.join(output_dir, BEING_DELETED + name))
            shutil.rmtree(os.path.join(output_dir, BEING_DELETED + name))


def is_complete_checkpoint(folder: str, step: int) -> bool:
    try:
        with open(os.path.join(folder, TRAINER_STATE_NAME), encoding="utf-8") as file:
            state = json.load(file)
    except (OSError, ValueError):
        return False
    return state.get("global_step") == step and os.path.isfile(os.path.join(folder, "model.safetensors"))


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint in `output_dir`, or None."""
    folders = checkpoint_folders(output_dir)
    return folders[-1] if folders else None


def checkpoint_to_resume(folder: str) -> str:
    """The checkpoint a run given `folder` resumes from: `folder` itself when it is complete, else (a run stopped
    while writing it) the newest complete checkpoint beside it, with a log line. A checkpoint older than the newest
    beside it is refused: the run would go on from there while averaging and rotation read the newer ones."""
    match = CHECKPOINT.fullmatch(os.path.basename(os.path.normpath(folder)))
    if not os.path.isdir(folder) or match is None:
        raise ValueError(f"resume_from_checkpoint {folder}: not a checkpoint-STEP folder the Trainer wrote")
    newest = latest_checkpoint(os.path.dirname(os.path.normpath(folder)))
    if not is_complete_checkpoint(folder, int(match.group(1))):
        if newest is None:
            raise ValueError(f"resume_from_checkpoint {folder}: incomplete (its run stopped while writing it), and "
                             "there is no complete checkpoint beside it")  # fmt: skip
        logger.warning("%s is incomplete (its run stopped while writing it): resuming from %s instead", folder, newest)
        return newest
    if not os.path.samefile(folder, newest):
        raise ValueError(f"resume_from_checkpoint {folder}: {newest} is newer; resume from the newest checkpoint, or "
                         "move the newer ones away")  # fmt: skip
    return folder


def average_checkpoints(folders: Sequence[str]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the `model.safetensors` weights of `folders`, computed in float64."""
    if not folders:
        raise ValueError("no checkpoints to average")
    total = None
    for folder in folders:
        weights = load_file(os.path.join(folder, "model.safetensors"))
        if total is None:
            total = {name: tensor.to(torch.float64) for name, tensor in weights.items()}
        elif weights.keys() != total.keys():
            raise ValueError(f"{folder} holds different tensors from {folders[0]}")
        else:
            for name, tensor in weights.items():
                total[name] += tensor
    # back to the checkpoints' own dtypes (`weights` is the last one read)
    return {name: (tensor / len(folders)).to(weights[name].dtype) for name, tensor in total.items()}


def load_averaged_checkpoints(model: torch.nn.Module, folders: Sequence[str]) -> None:
    """Replace `model`'s weights with the average of `folders`' (tied weights are stored once and stay tied)."""
    missing, unexpected = model.load_state_dict(average_checkpoints(folders), strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", {}))
    if unexpected or set(missing) - tied:
        missing = sorted(set(missing) - tied)
        raise ValueError(f"checkpoints do not fit the model: missing {missing}, unexpected {unexpected}")


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


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` for the paper's recipe, driven by `TranslationTrainingArguments`:

    - training batches of about `max_tokens_per_batch` tokens (per process and step of gradient accumulation)
      instead of a fixed number of sentences (`None`: the Trainer's own batches);
    - the learning rate of Equation 3 for the model's d_model when `learning_rate` is not given;
    - a time limit, `max_train_minutes`, with a progress bar against it;
    - `save_final_model()`: the mean of the last `average_last_checkpoints` checkpoints saved as the model, and
      then the checkpoints deleted but the last (`keep_checkpoints` keeps them): the run folder is the model;
    - resuming that ends where an uninterrupted run does: half-written checkpoints are passed over
      (`checkpoint_folders`), and a checkpoint at which training is over trains no further (`train`);
    - evaluation and prediction in dataset order, always: transformers 5 also applies
      `train_sampling_strategy="group_by_length"` to evaluation, whose predictions then come back shuffled, out of
      line with the references they are scored against;
    - and one prediction per example on several processes (Seq2SeqTrainer keeps the repeated padding examples).

    With plain `Seq2SeqTrainingArguments` it is the plain `Seq2SeqTrainer`. The train dataset needs `input_ids` and
    `labels` columns for token budgets.
    """

    def __init__(self, model=None, args=None, *other, **kwargs):
        if args is not None and getattr(args, "learning_rate", 0) is None:
            args.learning_rate = paper_learning_rate(model.config.d_model, args.warmup_steps, args.learning_rate_scale)
        super().__init__(model, args, *other, **kwargs)
        if hasattr(self.args, "max_train_minutes"):  # the training clock runs with or without a limit
            minutes = self.args.max_train_minutes
            time_limit = TimeLimitCallback(minutes)
            self.add_callback(time_limit)
            if minutes is not None and self.pop_callback(ProgressCallback) is not None:
                self.add_callback(TimeBudgetProgressCallback(time_limit))

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs) -> TrainOutput:
        """`Trainer.train`, except from a checkpoint at which training is over (`max_steps` reached, or the time
        budget spent): transformers would train one step more from it, so a run stopped after its training, during
        averaging or saving, would not end where an uninterrupted run does. That checkpoint is loaded as it is
        instead, and nothing more is trained."""
        if isinstance(resume_from_checkpoint, str):
            state = TrainerState.load_from_json(os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME))
            if self._training_is_over(state):
                logger.info("Training is over at %s: loaded, nothing more to train", resume_from_checkpoint)
                self._load_from_checkpoint(resume_from_checkpoint)
                self.state = state
                losses = [entry["loss"] for entry in state.log_history if "loss" in entry]
                loss = sum(losses) / len(losses) if losses else float("nan")  # of the logged windows: no step ran
                return TrainOutput(state.global_step, loss, {"epoch": state.epoch, "train_loss": loss})
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _training_is_over(self, state: TrainerState) -> bool:
        if 0 < self.args.max_steps <= state.global_step:
            return True
        time_limit = next((c for c in self.callback_handler.callbacks if isinstance(c, TimeLimitCallback)), None)
        return time_limit is not None and TimeLimitCallback.spent_in(state) >= time_limit.seconds

    def _save_checkpoint(self, model, trial) -> None:
        """`Trainer._save_checkpoint`, with old checkpoints deleted by `rotate_checkpoints` (by step, each renamed
        away first) instead of transformers' rotation by modification time."""
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        if self.args.should_save:
            rotate_checkpoints(self._get_output_dir(trial=trial), limit, keep=self.state.best_model_checkpoint)

    def get_train_dataloader(self) -> DataLoader:
        max_tokens = getattr(self.args, "max_tokens_per_batch", None)
        if max_tokens is None:
            return super().get_train_dataloader()
        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        sampler = TokenBudgetBatchSampler(
            [len(ids) for ids in dataset["input_ids"]],
            [len(ids) for ids in dataset["labels"]],
            max_tokens=max_tokens,
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
            seed=self.args.seed,
            accumulation_steps=self.args.gradient_accumulation_steps,
        )
        dataloader = self.accelerator.prepare(
            DataLoader(
                dataset,
                batch_sampler=sampler,
                collate_fn=self.data_collator,
                num_workers=self.args.dataloader_num_workers,
                pin_memory=self.args.dataloader_pin_memory,
            )
        )
        # Our sampler already gives each process its share; stop accelerate from sharding the shares again.
        shard = getattr(dataloader, "batch_sampler", None)
        if getattr(shard, "batch_sampler", None) is sampler:
            shard.num_processes, shard.process_index = 1, 0
        return dataloader

    def _get_eval_sampler(self, eval_dataset) -> Sampler | None:
        sampler = super()._get_eval_sampler(eval_dataset)
        if isinstance(sampler, LengthGroupedSampler):
            # what the Trainer gives without length grouping: on several processes, none, so that accelerate shards
            # the batches and drops the padding batches when it gathers (a sampler of ours would keep them)
            return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None
        return sampler

    def evaluation_loop(self, *args, **kwargs):
        # Seq2SeqTrainer.evaluate/predict (transformers 5.24) gather with `accelerator.gather`, which on several
        # processes keeps the samples accelerate repeats to fill the last batch: 32 predictions for 24 references.
        # `gather_for_metrics` drops them.
        self.gather_function = self.accelerator.gather_for_metrics
        # Mixed precision (--bf16, --fp16) is for training: accelerate wraps the model's forward in autocast, for
        # evaluation too, and the scores would then describe another model than the one saved (in full precision).
        native_amp, self.accelerator.native_amp = self.accelerator.native_amp, False
        autocast_forward = (
            self.model.__dict__.pop("forward", None) if hasattr(self.model, "_original_forward") else None
        )
        try:
            return super().evaluation_loop(*args, **kwargs)
        finally:
            self.accelerator.native_amp = native_amp
            if autocast_forward is not None:
                self.model.forward = autocast_forward

    def save_final_model(self) -> None:
        """Save the trained model in `args.output_dir`, averaged (Section 6.1) when `args.average_last_checkpoints`
        asks, with the trainer state; then delete the checkpoints but the last, unless `args.keep_checkpoints`.

        A run resumed after that, at the step its saved model records (a rerun of a finished run, or one stopped
        while deleting), loads the saved model instead of averaging again: the checkpoints it averaged are gone.
        """
        output_dir = self.args.output_dir
        if self._saved_model_is_this_runs():
            logger.info("%s holds this run's final model already: loaded, not averaged again", output_dir)
            load_averaged_checkpoints(self.model, [output_dir])  # the mean of one folder: its weights
        else:
            if self.args.average_last_checkpoints > 1:
                self.average_checkpoints_into_model()
            self.save_model()
            self.save_state()  # last: the saved trainer state says that the model beside it is complete
        self.accelerator.wait_for_everyone()
        if not self.args.keep_checkpoints and self.is_world_process_zero():
            rotate_checkpoints(output_dir, limit=1)

    def _saved_model_is_this_runs(self) -> bool:
        """Whether `output_dir` holds the model `save_final_model` saved at this step of this run: its trainer
        state names the step and continues the log of the checkpoint this run ended at."""
        try:
            saved = TrainerState.load_from_json(os.path.join(self.args.output_dir, TRAINER_STATE_NAME))
        except (OSError, ValueError):
            return False
        logged = self.state.log_history
        return saved.global_step == self.state.global_step and saved.log_history[: len(logged)] == logged

    def average_checkpoints_into_model(self) -> list[str]:
        """Section 6.1: load into the model the average of the last `args.average_last_checkpoints` checkpoints in
        `args.output_dir`, the final step's included (saved first if it was not a save step). Returns their folders.
        """
        count = self.args.average_last_checkpoints
        # Every process averages into its own model (each evaluates next), from checkpoints that only the main
        # process writes: all must see the same complete folders, so wait for its writing before and after.
        self.accelerator.wait_for_everyone()
        folders = checkpoint_folders(self.args.output_dir)
        final = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        if final not in folders:  # a whole checkpoint, so that a run stopped from here on resumes from it
            self._save_checkpoint(self.model, trial=None)
            folders.append(final)
        self.accelerator.wait_for_everyone()
        chosen = folders[-count:]
        if len(chosen) < count:
            logger.warning("Only %d checkpoints to average (asked for %d)", len(chosen), count)
        logger.info("Averaging %s", ", ".join(os.path.basename(folder) for folder in chosen))
        load_averaged_checkpoints(self.model, chosen)
        return chosen
