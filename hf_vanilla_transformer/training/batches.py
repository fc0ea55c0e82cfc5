"""Section 5.1's batches: "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."
transformers' samplers fix the number of *sentences* per batch (`group_by_length`, `batch_rebalance`), so we add
`TokenBudgetBatchSampler`, which fixes the number of *tokens*.
"""

import random
from collections.abc import Iterator, Sequence

from torch.utils.data import Sampler


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
