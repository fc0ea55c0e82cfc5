"""A run folder's `checkpoint-STEP` folders: which are complete, which one a run resumes from, deleting old ones, and
averaging the newest (Section 6.1: "we used a single model obtained by averaging the last 5 checkpoints").

Averaging is a step of its own, as fairseq's `scripts/average_checkpoints.py`: `average_checkpoints` is the mean of
some folders' weights, `last_checkpoints` the newest complete ones of a run, and `write_averaged_model` (the command
`vanilla-average-checkpoints`) writes their mean as a model folder. `run_translation.py` averages with the same
functions once training is over (`TranslationTrainer.save_final_model`).
"""

import json
import logging
import os
import re
import shutil
from collections.abc import Sequence

import safetensors.torch
import torch
from safetensors.torch import load_file
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers.trainer import TRAINER_STATE_NAME

from hf_vanilla_transformer.files import atomic_output_dir, check_output_dir
from hf_vanilla_transformer.formats import TOKENIZER_FILE
from hf_vanilla_transformer.loading import WEIGHTS_NAME, load_model, load_tokenizer

logger = logging.getLogger(__name__)

CHECKPOINT = re.compile(r"checkpoint-(\d+)")
MOVING_AVERAGE_NAME = "moving_average.safetensors"  # a checkpoint's average of the weights, under --ema_decay
BEING_DELETED = ".deleting-"  # the prefix a checkpoint folder is renamed to before its files are deleted


def checkpoint_folders(output_dir: str) -> list[str]:
    """The Trainer's complete `checkpoint-STEP` folders in `output_dir`, oldest first. A folder that a stopped run
    left half-written is passed over, with a log line: the Trainer writes a checkpoint's `trainer_state.json` last,
    so a checkpoint is complete when that file reads as JSON and names the folder's step. (A folder is renamed
    away before it is deleted, `rotate_checkpoints`, so a half-deleted one is never mistaken for a checkpoint.)"""
    complete, incomplete = checkpoints_by_step(output_dir)
    for folder in incomplete:
        logger.warning("%s is incomplete (its run stopped while writing it): not used", os.path.basename(folder))
    return complete


def checkpoints_by_step(output_dir: str) -> tuple[list[str], list[str]]:
    """The `checkpoint-STEP` folders in `output_dir`, oldest first: the complete ones, and the others."""
    folders = {True: [], False: []}
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    for step, name in sorted((int(match.group(1)), name) for name in names if (match := CHECKPOINT.fullmatch(name))):
        folder = os.path.join(output_dir, name)
        folders[is_complete_checkpoint(folder, step)].append(folder)
    return folders[True], folders[False]


def is_complete_checkpoint(folder: str, step: int) -> bool:
    try:
        with open(os.path.join(folder, TRAINER_STATE_NAME), encoding="utf-8") as file:
            state = json.load(file)
    except (OSError, ValueError):
        return False
    return state.get("global_step") == step and os.path.isfile(os.path.join(folder, WEIGHTS_NAME))


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
            raise ValueError(
                f"resume_from_checkpoint {folder}: incomplete (its run stopped while writing it), and "
                "there is no complete checkpoint beside it"
            )
        logger.warning("%s is incomplete (its run stopped while writing it): resuming from %s instead", folder, newest)
        return newest
    if not os.path.samefile(folder, newest):
        raise ValueError(
            f"resume_from_checkpoint {folder}: {newest} is newer; resume from the newest checkpoint, or "
            "move the newer ones away"
        )
    return folder


def rotate_checkpoints(output_dir: str, limit: int | None, best: str | None = None, writing: str | None = None) -> None:
    """Delete the folders that stopped runs left half-written (all but `writing`, the one being written), and the
    checkpoints older than the newest `limit` by step (None: keep all), counted as transformers counts
    `save_total_limit`: complete ones and `writing` count, `best` (the best one) stays and counts among them, and
    the newest always stays.

    transformers' rotation (`trainer_utils.rotate_checkpoints`, which its Trainer calls with `use_mtime=True` in
    the releases we support, after `save_model` and the trainer state) counts every `checkpoint-*` folder and
    orders them by modification time, which deleting files changes: a half-written folder left in place would make
    it delete a complete checkpoint, and a run stopped while deleting a folder leaves it half-deleted and, to the
    next rotation, the newest, so a newer checkpoint is deleted in its place and checkpoint averaging reads the
    half-deleted one. Ordered by step (`use_mtime=False`) it still deletes a folder file by file where it lies,
    and a half-deleted folder that kept its weights and trainer state reads as complete. Here the order is the
    step's, and each folder is renamed away (atomically) before its files are deleted.
    """
    if not os.path.isdir(output_dir):
        return
    for name in os.listdir(output_dir):  # what a stopped deletion left
        if name.startswith(BEING_DELETED):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
    complete, incomplete = checkpoints_by_step(output_dir)
    writing_step = step_of(writing) if writing is not None else None
    for folder in incomplete:
        if step_of(folder) != writing_step:
            logger.info("Deleting %s, which a stopped run left half-written", os.path.basename(folder))
            delete_checkpoint(folder)
    if not limit:
        return
    steps = {step_of(folder) for folder in complete} | ({writing_step} if writing is not None else set())
    best_step = step_of(best) if best is not None else None
    best_step = best_step if best_step in steps else None
    others = sorted(steps - {best_step})
    if len(steps) <= limit or not others:
        return
    oldest_kept = others[-max(limit - (best_step is not None), 1)]  # the newest always stays, for resuming
    for folder in complete:
        if step_of(folder) < oldest_kept and step_of(folder) != best_step:
            logger.info("Deleting %s (keeping the newest %d)", os.path.basename(folder), limit)
            delete_checkpoint(folder)


def delete_checkpoint(folder: str) -> None:
    """Rename `folder` away (`BEING_DELETED`), then delete its files: never half-deleted under its own name."""
    parent, name = os.path.split(os.path.normpath(folder))
    os.replace(folder, os.path.join(parent, BEING_DELETED + name))
    shutil.rmtree(os.path.join(parent, BEING_DELETED + name))


def step_of(folder: str) -> int:
    """The step of a `checkpoint-STEP` folder."""
    return int(CHECKPOINT.fullmatch(os.path.basename(os.path.normpath(folder))).group(1))


def last_checkpoints(output_dir: str, count: int) -> list[str]:
    """The newest `count` complete checkpoints of a run folder, oldest first (fewer if it holds fewer)."""
    if count < 1:
        raise ValueError(f"the number of checkpoints to average must be at least 1, got {count}")
    return checkpoint_folders(output_dir)[-count:]


def average_checkpoints(folders: Sequence[str]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the `model.safetensors` weights of `folders`, computed in float64."""
    if not folders:
        raise ValueError("no checkpoints to average")
    total = None
    for folder in folders:
        weights = load_file(os.path.join(folder, WEIGHTS_NAME))
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


def moving_average(model: torch.nn.Module, decay: float) -> AveragedModel:
    """An exponential moving average of `model`'s weights (torch's `AveragedModel` with its EMA rule: average =
    decay * average + (1 - decay) * weights, from the first update's weights on), on a copy of the model."""
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))


def load_moving_average(model: torch.nn.Module, folder: str) -> None:
    """Replace `model`'s weights with the moving average a checkpoint `folder` holds (`MOVING_AVERAGE_NAME`)."""
    average = moving_average(model, decay=0.5)  # the decay is not stored: loading only needs the shapes
    safetensors.torch.load_model(average, os.path.join(folder, MOVING_AVERAGE_NAME))
    model.load_state_dict(average.module.state_dict())


def write_averaged_model(model_dir: str, last: int, output_dir: str, overwrite_output_dir: bool = False) -> list[str]:
    """Write the mean of the newest `last` complete checkpoints of the run folder `model_dir` to `output_dir`, as a
    model folder that `from_pretrained` and `pipeline()` load: the newest checkpoint's model (its config and
    generation config) and tokenizer, with the averaged weights; no optimizer or trainer state. Returns the
    checkpoint folders averaged.

    fairseq's `scripts/average_checkpoints.py` writes a new file and leaves its inputs alone; so does this, and the
    output folder is written whole or not at all (`atomic_output_dir`). Fewer checkpoints than `last` is an error
    (fairseq's too): the mean would not be the one asked for.
    """
    if not os.path.isdir(model_dir):
        raise ValueError(f"model_dir {model_dir}: no such folder")
    check_output_dir(output_dir, overwrite_output_dir, reads=[model_dir])  # before the work
    folders = last_checkpoints(model_dir, last)
    if len(folders) < last:
        raise ValueError(
            f"model_dir {model_dir} holds {len(folders)} complete checkpoints; averaging the last {last} needs {last}"
        )
    newest = folders[-1]
    model = load_model(newest, "cpu")
    load_averaged_checkpoints(model, folders)
    tokenizer = load_tokenizer(newest) if os.path.isfile(os.path.join(newest, TOKENIZER_FILE)) else None
    with atomic_output_dir(output_dir, overwrite_output_dir) as staging:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    return folders
