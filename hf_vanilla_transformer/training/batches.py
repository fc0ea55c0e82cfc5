"""Section 5.1's batches: "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."
transformers' samplers fix the number of *sentences* per batch (`group_by_length`, `batch_rebalance`), so we add
`TokenBudgetBatchSampler`, which fixes the number of *tokens*.
"""

import random
from array import array
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow.compute
from torch.utils.data import Sampler


def row_lengths(dataset, column: str) -> np.ndarray:
    """The length of each row's token list in `column` of a `datasets.Dataset`, read from the Arrow list offsets:
    no row is decoded into Python."""
    return pyarrow.compute.list_value_length(dataset.with_format("arrow")[column]).to_numpy()


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of sentence pairs of similar length, each padded to at most `max_tokens` source and target tokens.

    Pairs are sorted by (source length, target length), ties broken at random each epoch, and cut into batches
    that stay within the budget once padded: len(batch) * longest source <= max_tokens, and the same for targets,
    the longest rounded up to a multiple of `pad_to_multiple_of` where the collator pads to one.
    The batches are then shuffled (with the same seed on every process). An optimizer step takes
    `num_processes * accumulation_steps` batches; if the number of batches is not a multiple of that, the largest
    batches are halved until it is, as every process must run the same number of steps. A pair longer than the
    budget on its own forms a batch alone.

    On several processes, accelerate shares the batches out: `accelerator.prepare` wraps the sampler in its
    `BatchSamplerShard`, which deals them round-robin, process r taking batches r, r + N, r + 2N, ... So N processes
    and one process accumulating N batches take the same batches in the same steps. (The sampler has no
    `batch_size`: accelerate then deals its batches as they are, whatever their sizes.)

    Memory: the lengths and one epoch's order are arrays of 4 and 8 bytes a pair, so that a corpus of tens of millions
    of pairs is batched in a few hundred MB; a batch becomes a list only when it is taken. The batch sizes do not
    depend on the epoch (only which of the pairs of equal lengths go together does), so they are cut once.
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
        pad_to_multiple_of: int = 1,
    ):
        if len(source_lengths) != len(target_lengths):
            raise ValueError("source_lengths and target_lengths differ in length")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if num_processes < 1:
            raise ValueError(f"num_processes must be positive, got {num_processes}")
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be positive, got {accumulation_steps}")
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be positive, got {pad_to_multiple_of}")
        self.source_lengths = np.asarray(source_lengths, dtype=np.int32)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int32)
        self.max_tokens = max_tokens
        self.num_processes = num_processes
        self.accumulation_steps = accumulation_steps
        self.shuffle = shuffle
        self.seed = seed
        self.pad_to_multiple_of = pad_to_multiple_of
        self.epoch = 0
        self.batch_starts = self.cut_into_batches()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.batch_starts) - 1

    def __iter__(self) -> Iterator[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        order = self.sorted_order(rng)
        batches = list(range(len(self)))
        if self.shuffle:
            rng.shuffle(batches)
        for batch in batches:
            yield order[self.batch_starts[batch] : self.batch_starts[batch + 1]].tolist()

    def sorted_order(self, rng: random.Random) -> np.ndarray:
        """The pairs' indices sorted by (source length, target length), ties in a random order drawn from `rng`:
        shuffled first as `random.shuffle` shuffles a list (an array of machine integers takes 8 bytes a pair where
        a list of Python integers takes 36), then sorted by a stable sort."""
        order = array("q", range(len(self.source_lengths)))
        if self.shuffle:
            rng.shuffle(order)
        order = np.frombuffer(order, dtype=np.int64)
        return order[np.lexsort((self.target_lengths[order], self.source_lengths[order]))]

    def cut_into_batches(self) -> np.ndarray:
        """Where each batch starts in the sorted order, and where the last ends (len(batches) + 1 positions)."""
        # The budget holds for both sides at once: len(batch) * max(longest source, longest target) <= max_tokens.
        order = np.lexsort((self.target_lengths, self.source_lengths))
        multiple = self.pad_to_multiple_of
        lengths = -(-np.maximum(self.source_lengths, self.target_lengths)[order] // multiple) * multiple
        starts, start = [0], 0
        while start < len(lengths):
            # a batch is the longest run from `start` whose size times its longest pair fits (one pair at least);
            # no batch holds more than max_tokens pairs, each at least one token long
            window = lengths[start : start + self.max_tokens]
            padded = np.arange(1, len(window) + 1) * np.maximum.accumulate(window)
            start += max(1, int(np.searchsorted(padded, self.max_tokens, side="right")))
            starts.append(start)

        per_step = self.num_processes * self.accumulation_steps
        while (len(starts) - 1) % per_step:
            sizes = np.diff(starts)
            largest = int(np.argmax(sizes))  # the first of the largest, as max() would take
            if sizes[largest] < 2:
                raise ValueError(
                    f"{len(lengths)} examples cannot fill the {per_step} batches of a step "
                    f"({self.num_processes} processes x {self.accumulation_steps} accumulation steps)"
                )
            starts.insert(largest + 1, starts[largest] + sizes[largest] // 2)
        return np.asarray(starts, dtype=np.int64)
