"""Training utilities for the paper's recipe (Section 5): token-budget batches, the learning-rate schedule,
checkpoint averaging, and a `Seq2SeqTrainer` that uses them.

- Batching (Section 5.1): "Sentence pairs were batched together by approximate sequence length. Each training
  batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."
  transformers' samplers fix the number of *sentences* per batch (`group_by_length`, `batch_rebalance`), so we
  add `TokenBudgetBatchSampler`, which fixes the number of *tokens*.
- Schedule (Section 5.3, Equation 3): lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5). That is
  transformers' `inverse_sqrt` schedule, lr * min(step / warmup, sqrt(warmup / step)), with the peak
  lr = d_model^-0.5 * warmup^-0.5 (`paper_learning_rate`), so we use it as it is.
- Checkpoint averaging (Section 6.1): "we used a single model obtained by averaging the last 5 checkpoints".
- Label smoothing (Section 5.4) is the Trainer's own `label_smoothing_factor`.
"""

import os
import random
import re
from collections.abc import Iterator, Sequence

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, Sampler
from transformers import Seq2SeqTrainer


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of sentence pairs of similar length, each padded to at most `max_tokens` source and target tokens.

    Pairs are sorted by (source length, target length), ties broken at random each epoch, and cut into batches
    that stay within the budget once padded: len(batch) * longest source <= max_tokens, and the same for targets.
    The batches are then shuffled (same seed on every process) and dealt out round-robin, so each of the
    `num_replicas` processes gets a disjoint share and every pair is seen exactly once per epoch. If the number of
    batches does not divide evenly, the largest batches are halved until it does, as every process must run the
    same number of steps. A pair longer than the budget on its own forms a batch alone.
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
    ):
        if len(source_lengths) != len(target_lengths):
            raise ValueError("source_lengths and target_lengths differ in length")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.source_lengths = list(source_lengths)
        self.target_lengths = list(target_lengths)
        self.max_tokens = max_tokens
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
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

        while len(batches) % self.num_replicas:
            largest = max(range(len(batches)), key=lambda b: len(batches[b]))
            if len(batches[largest]) < 2:
                raise ValueError(f"{len(order)} examples cannot be shared among {self.num_replicas} processes")
            half = len(batches[largest]) // 2
            batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
        if self.shuffle:
            rng.shuffle(batches)
        return batches


def paper_learning_rate(d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """The peak of Equation 3, scale * d_model^-0.5 * warmup^-0.5, reached at step `warmup_steps`."""
    return scale * d_model**-0.5 * warmup_steps**-0.5


def checkpoint_folders(output_dir: str) -> list[str]:
    """The Trainer's `checkpoint-STEP` folders in `output_dir`, oldest first."""
    steps = []
    for name in os.listdir(output_dir) if os.path.isdir(output_dir) else []:
        match = re.fullmatch(r"checkpoint-(\d+)", name)
        if match and os.path.isfile(os.path.join(output_dir, name, "model.safetensors")):
            steps.append(int(match.group(1)))
    return [os.path.join(output_dir, f"checkpoint-{step}") for step in sorted(steps)]


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


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose training batches hold about `max_tokens_per_batch` tokens (per process and step of
    gradient accumulation) instead of a fixed number of sentences. With `max_tokens_per_batch=None` it is the
    plain `Seq2SeqTrainer`. The train dataset needs `input_ids` and `labels` columns.
    """

    def __init__(self, *args, max_tokens_per_batch: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens_per_batch = max_tokens_per_batch

    def get_train_dataloader(self) -> DataLoader:
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        sampler = TokenBudgetBatchSampler(
            [len(ids) for ids in dataset["input_ids"]],
            [len(ids) for ids in dataset["labels"]],
            max_tokens=self.max_tokens_per_batch,
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
            seed=self.args.seed,
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
