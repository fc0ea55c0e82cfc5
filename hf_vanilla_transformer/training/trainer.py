"""The Trainer of the paper's recipe: `TranslationTrainer`, a `Seq2SeqTrainer` driven by `TranslationTrainingArguments`
(arguments.py), with token-budget batches (batches.py), a time budget and its progress bar (callbacks.py), checkpoint
rotation and averaging (checkpoints.py: Section 6.1, "we used a single model obtained by averaging the last 5
checkpoints").

A time budget (ours, not the paper's): `max_train_minutes` ends training with a checkpoint, so that a recipe fits a
machine's time; the progress bar then measures that budget.
"""

import copy
import inspect
import logging
import os
from collections.abc import Sized

import datasets
from accelerate.utils import broadcast
from torch.utils.data import DataLoader
from transformers import EvalPrediction, ProgressCallback, Seq2SeqTrainer
from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_pt_utils import nested_truncate
from transformers.trainer_utils import EvalLoopOutput, TrainOutput, get_last_checkpoint

from hf_vanilla_transformer.errors import transformers_lines_left_out
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments, paper_learning_rate
from hf_vanilla_transformer.training.batches import TokenBudgetBatchSampler, row_lengths
from hf_vanilla_transformer.training.callbacks import (
    BatchSamplerEpoch,
    LastStepCheckpointCallback,
    MovingAverageCallback,
    TimeBudgetProgressCallback,
    TimeLimitCallback,
    autocast_off,
)
from hf_vanilla_transformer.training.checkpoints import (
    CHECKPOINT,
    MOVING_AVERAGE_NAME,
    last_checkpoints,
    load_averaged_checkpoints,
    load_moving_average,
    rotate_checkpoints,
)
from hf_vanilla_transformer.training.loss import LabelSmoothedLoss
from hf_vanilla_transformer.training.tokenizer import BPEDropoutCollator

logger = logging.getLogger(__name__)


def training_is_over(checkpoint: str, args: TranslationTrainingArguments) -> bool:
    """Whether a run given `args` has nothing more to train from `checkpoint`: `max_steps` reached (or, training by
    epochs, the step count the checkpoint's run ended at, for the same `num_train_epochs`), or the time budget
    `max_train_minutes` spent. Read from the checkpoint's `trainer_state.json`."""
    state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
    if 0 < args.max_steps <= state.global_step:
        return True
    by_epochs = args.max_steps <= 0 and state.num_train_epochs == args.num_train_epochs
    if by_epochs and 0 < state.max_steps <= state.global_step:
        return True
    minutes = args.max_train_minutes
    return minutes is not None and TimeLimitCallback.spent_in(state) >= minutes * 60


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` for the paper's recipe, driven by `TranslationTrainingArguments`:

    - training batches of about `max_tokens_per_batch` tokens (per process and step of gradient accumulation)
      instead of a fixed number of sentences (`None`: the Trainer's own batches);
    - label smoothing (`label_smoothing_factor`) in one pass over the logits (`LabelSmoothedLoss`, the Trainer's
      `compute_loss_func` unless one is given): transformers' `LabelSmoother`'s loss without its log-softmax tensors;
    - the learning rate of Equation 3 for the model's d_model when `learning_rate` is not given (set in the
      trainer's own copy of the arguments: the caller's stay as given);
    - a time limit, `max_train_minutes`, with a progress bar against it;
    - checkpoints rotated by step and half-written ones deleted (`save_model`), the last step always saved
      (`LastStepCheckpointCallback`); `training_args.bin` readable by its owner alone (`private_file`);
    - `save_final_model()`: the mean of the last `average_last_checkpoints` checkpoints saved as the model, and
      then the checkpoints deleted but the last (`keep_checkpoints` keeps them): the run folder is the model;
    - resuming that ends where an uninterrupted run does: half-written checkpoints are passed over
      (`checkpoint_folders`), and `train()` refuses a checkpoint at which training is over (`training_is_over`:
      transformers would train a step more), whose run goes straight to `save_final_model(checkpoint)`.

    It evaluates and predicts
    - in dataset order (transformers 5 also applies `train_sampling_strategy="group_by_length"` to evaluation,
      whose predictions then come back in another order than the references they are scored against);
    - with one prediction per example on several processes (see `evaluation_loop`; `compute_metrics` given to the
      constructor, by keyword, receives one too);
    - in the saved model's precision under --bf16 / --fp16 (see `prediction_step`).

    The train dataset needs `input_ids` and `labels` columns for token budgets.
    """

    def __init__(self, model=None, args=None, *other, compute_metrics=None, compute_loss_func=None, **kwargs):
        if args is None:
            args = TranslationTrainingArguments()
        if not isinstance(args, TranslationTrainingArguments):
            raise TypeError(
                f"TranslationTrainer takes TranslationTrainingArguments, not {type(args).__name__}: the recipe's "
                "settings (token budgets, time limit, averaging) live there"
            )
        if args.learning_rate is None:
            args = copy.copy(args)
            args.learning_rate = paper_learning_rate(model.config.d_model, args.warmup_steps, args.learning_rate_scale)
        self.examples_in_evaluation = None
        if compute_metrics is not None:
            compute_metrics = self.metrics_per_example(compute_metrics)
        if compute_loss_func is None and args.label_smoothing_factor > 0:
            compute_loss_func = LabelSmoothedLoss(args.label_smoothing_factor)
        super().__init__(
            model, args, *other, compute_metrics=compute_metrics, compute_loss_func=compute_loss_func, **kwargs
        )
        self.batch_sampler_epoch = BatchSamplerEpoch()
        self.add_callback(self.batch_sampler_epoch)
        self.add_callback(LastStepCheckpointCallback())
        minutes = self.args.max_train_minutes  # the training clock runs with or without a limit
        time_limit = TimeLimitCallback(minutes)
        self.add_callback(time_limit)
        if minutes is not None and self.pop_callback(ProgressCallback) is not None:
            self.add_callback(TimeBudgetProgressCallback(time_limit))
        self.moving_average = None
        if self.args.ema_decay is not None:
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
        # transformers' rotation orders checkpoints by modification time and, where the oldest and newest are less
        # than a second apart, says mtime "may not be reliable on this filesystem": false of any filesystem for
        # checkpoints written quickly, and beside the point here, where `save_model` rotates by step first
        with transformers_lines_left_out("transformers.trainer_utils", "mtime may not be reliable"):
            return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def save_model(self, output_dir: str | None = None, *args, **kwargs) -> None:
        """`Trainer.save_model`, which the Trainer also calls first when it writes a checkpoint. `training_args.bin`
        (a pickle of the arguments, `hub_token` among them) is created readable by its owner alone before the
        Trainer writes into it (`private_file`). In a checkpoint, the moving average of the weights goes in beside
        the model, before the trainer state that completes the checkpoint, and the folders a stopped run left
        half-written and the older checkpoints are deleted by step (`rotate_checkpoints`), down to
        `save_total_limit` with the one being written: transformers' own rotation, which comes after, counts every
        `checkpoint-*` folder and orders them by modification time, then finds none to delete."""
        folder = self.args.output_dir if output_dir is None else output_dir
        if self.args.should_save:
            private_file(os.path.join(folder, TRAINING_ARGS_NAME))
        super().save_model(output_dir, *args, **kwargs)
        checkpoint = output_dir is not None and CHECKPOINT.fullmatch(os.path.basename(os.path.normpath(output_dir)))
        if checkpoint and self.args.should_save:
            if self.moving_average is not None:
                self.moving_average.save(output_dir)
            rotate_checkpoints(
                os.path.dirname(os.path.normpath(output_dir)),
                self.args.save_total_limit,
                best=self.state.best_model_checkpoint,
                writing=output_dir,
            )

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
        max_tokens = self.args.max_tokens_per_batch
        if max_tokens is None:
            return super().get_train_dataloader()
        dataset = self.model_input_columns(self.train_dataset)
        sampler = TokenBudgetBatchSampler(
            row_lengths(dataset, "input_ids"),
            row_lengths(dataset, "labels"),
            max_tokens=max_tokens,
            num_processes=self.args.world_size,
            accumulation_steps=self.args.gradient_accumulation_steps,
            seed=self.args.seed,
            pad_to_multiple_of=self.args.pad_to_multiple_of,
        )
        self.batch_sampler_epoch.sampler = sampler
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            **self.loading_options(),
        )
        return self.accelerator.prepare(loader)  # on several processes, accelerate deals the batches out

    def loading_options(self) -> dict:
        """The Trainer's `dataloader_*` settings for our data loaders: collation in `dataloader_num_workers`
        processes (kept from epoch to epoch with `dataloader_persistent_workers`), and batches in pinned memory
        (`dataloader_pin_memory`) where they go to an accelerator; torch warns of pinning without one."""
        args = self.args
        pinned = args.dataloader_pin_memory and args.device.type != "cpu"
        options = {"num_workers": args.dataloader_num_workers, "pin_memory": pinned}
        if args.dataloader_num_workers > 0:
            options["persistent_workers"] = args.dataloader_persistent_workers
            options["prefetch_factor"] = args.dataloader_prefetch_factor
        return options

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
            **self.loading_options(),
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
        checkpoints but the last, unless `args.keep_checkpoints`, and the folders a stopped run left half-written.
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
        if self.is_world_process_zero():  # what a stopped run left half-written goes, kept checkpoints or not
            rotate_checkpoints(output_dir, limit=None if args.keep_checkpoints else 1)
        return state


def private_file(path: str) -> None:
    """Create `path` (and its folder), or narrow an existing file, readable and writable by its owner alone, so that
    what is then written into it (opened "wb", which keeps the mode) is never readable by others, not even for a
    moment or after a kill."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)  # a file that was there keeps its mode through O_CREAT


def saved_model_is_of(output_dir: str, state: TrainerState) -> bool:
    """Whether `output_dir` holds the final model saved at the end of the run `state` describes: its trainer state
    names the step and continues the log of `state`."""
    try:
        saved = TrainerState.load_from_json(os.path.join(output_dir, TRAINER_STATE_NAME))
    except (OSError, ValueError):
        return False
    return saved.global_step == state.global_step and saved.log_history[: len(state.log_history)] == state.log_history
