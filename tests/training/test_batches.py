"""TokenBudgetBatchSampler over arrays: the batches the list-based sampler made, a few bytes a pair, lengths read
from Arrow offsets."""

import random
import tracemalloc

import datasets
import numpy as np
import pytest

from hf_vanilla_transformer.training.batches import TokenBudgetBatchSampler, row_lengths


def list_sampler_batches(sources, targets, max_tokens, epoch, seed, per_step=1, shuffle=True) -> list[list[int]]:
    """The batches of an epoch as the sampler made them with Python lists, up to version 0.4 (the reference the
    array version must reproduce, so that a run resumed by a newer version goes on with the same batches)."""
    rng = random.Random(seed + epoch)
    order = list(range(len(sources)))
    if shuffle:
        rng.shuffle(order)
    order.sort(key=lambda i: (sources[i], targets[i]))
    batches, batch, longest = [], [], 0
    for index in order:
        length = max(sources[index], targets[index])
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    while len(batches) % per_step:
        largest = max(range(len(batches)), key=lambda b: len(batches[b]))
        half = len(batches[largest]) // 2
        batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
    if shuffle:
        rng.shuffle(batches)
    return batches


@pytest.mark.parametrize("seed", range(6))
def test_the_batches_are_those_the_list_based_sampler_made(seed):
    """Many ties (lengths 1 to 12), pairs longer than the budget, odd batch counts evened out over processes and
    accumulation steps, several epochs."""
    rng = random.Random(seed)
    count = rng.randint(50, 3000)
    sources = [rng.randint(1, 12) if rng.random() < 0.97 else rng.randint(40, 90) for _ in range(count)]
    targets = [max(1, s + rng.randint(-3, 3)) for s in sources]
    max_tokens = rng.choice([16, 48, 64, 256])
    processes, accumulation = rng.choice([(1, 1), (2, 1), (1, 3), (2, 2)])
    for shuffle in (True, False):
        sampler = TokenBudgetBatchSampler(
            sources,
            targets,
            max_tokens,
            num_processes=processes,
            accumulation_steps=accumulation,
            shuffle=shuffle,
            seed=seed,
        )
        for epoch in (0, 1, 5):
            expected = list_sampler_batches(
                sources, targets, max_tokens, epoch, seed, processes * accumulation, shuffle
            )
            sampler.set_epoch(epoch)
            assert list(sampler) == expected
            assert len(sampler) == len(expected)


def test_an_epoch_of_batches_takes_a_few_bytes_a_pair():
    """Measured with tracemalloc (numpy reports its arrays to it): building the sampler and taking an epoch's
    batches. The list-based sampler took about 170 bytes a pair (a list of Python integers and a sort key tuple
    each)."""
    count = 150_000
    sources, targets = np.random.default_rng(0).integers(3, 61, size=(2, count), dtype=np.int32)  # as row_lengths
    tracemalloc.start()
    try:
        sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=4096, num_processes=2, seed=1)
        taken = sum(len(batch) for batch in sampler)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert taken == count
    assert peak / count < 40, f"{peak / count:.1f} bytes a pair"


def test_row_lengths_are_read_from_the_arrow_offsets():
    dataset = datasets.Dataset.from_dict({"input_ids": [[5, 6, 2], [2], [7, 8, 9, 10, 2]], "labels": [[2], [3, 2], []]})
    assert row_lengths(dataset, "input_ids").tolist() == [3, 1, 5]
    assert row_lengths(dataset, "labels").tolist() == [1, 2, 0]
    assert row_lengths(dataset.select([2, 0]), "input_ids").tolist() == [5, 3]  # through an indices mapping too


def test_padded_to_a_multiple_the_batches_keep_the_budget_and_take_fewer_shapes():
    """With the collator padding lengths up to a multiple of 8, the budget counts the padded lengths, every batch's
    shape is made of multiples of 8, and an epoch holds fewer distinct shapes than unpadded."""
    rng = np.random.default_rng(0)
    sources = rng.integers(1, 120, 5000)
    targets = np.maximum(1, (sources * rng.uniform(0.8, 1.3, 5000)).astype(int))  # a translation's length follows
    shapes = {}
    for multiple in (1, 8):
        sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=1024, pad_to_multiple_of=multiple)
        seen = set()
        for batch in sampler:
            padded = [-(-int(max(lengths[batch])) // multiple) * multiple for lengths in (sources, targets)]
            assert len(batch) * max(padded) <= 1024
            seen.add((len(batch), *padded))
        assert sorted(i for batch in sampler for i in batch) == list(range(5000))
        shapes[multiple] = seen
    assert all(length % 8 == 0 for shape in shapes[8] for length in shape[1:])
    assert len(shapes[8]) < len(shapes[1]) / 3
    with pytest.raises(ValueError, match="pad_to_multiple_of must be positive, got 0"):
        TokenBudgetBatchSampler(sources, targets, max_tokens=1024, pad_to_multiple_of=0)
