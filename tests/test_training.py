"""Training utilities: the token-budget sampler, the schedule of Equation 3, and checkpoint averaging."""

import random

import pytest
import torch
from conftest import LETTERS, letter_tokenizer, tiny_model
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, get_scheduler

from hf_vanilla_transformer.training import (
    TokenBudgetBatchSampler,
    TranslationTrainer,
    TranslationTrainingArguments,
    average_checkpoints,
    checkpoint_folders,
    load_averaged_checkpoints,
    paper_learning_rate,
)


def lengths(count: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    sources = [rng.randint(3, 40) for _ in range(count)]
    return sources, [max(2, s + rng.randint(-5, 8)) for s in sources]


def test_every_example_once_per_epoch_within_budget():
    sources, targets = lengths(1000)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=300, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(1000))
        for batch in batches:
            assert len(batch) * max(sources[i] for i in batch) <= 300
            assert len(batch) * max(targets[i] for i in batch) <= 300
    padded = sum(len(b) * max(max(sources[i], targets[i]) for i in b) for b in batches)
    real = sum(max(sources[i], targets[i]) for i in range(1000))
    assert real / padded > 0.85  # batching by length leaves little padding (random batches: about 0.6)


def test_batches_are_reshuffled_each_epoch_and_reproducible():
    sources, targets = lengths(500)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=200, seed=7)
    sampler.set_epoch(0)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == first and second != first
    in_order = TokenBudgetBatchSampler(sources, targets, max_tokens=200, shuffle=False)
    keys = [(sources[i], targets[i]) for batch in in_order for i in batch]
    assert keys == sorted(keys)


def test_two_ranks_get_disjoint_equal_shares_of_everything():
    sources, targets = lengths(777, seed=1)
    shares = [TokenBudgetBatchSampler(sources, targets, 256, num_replicas=2, rank=rank, seed=5) for rank in (0, 1)]
    for share in shares:
        share.set_epoch(2)
    batches = [list(share) for share in shares]
    assert len(batches[0]) == len(batches[1]) == len(shares[0]) == len(shares[1])
    seen = [{i for batch in rank_batches for i in batch} for rank_batches in batches]
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(777))
    assert sum(len(batch) for rank_batches in batches for batch in rank_batches) == 777


def test_an_example_longer_than_the_budget_is_a_batch_of_its_own():
    sampler = TokenBudgetBatchSampler([5, 500, 6, 7], [5, 20, 6, 7], max_tokens=100, shuffle=False)
    assert sorted(map(sorted, sampler)) == [[0, 2, 3], [1]]


def test_bad_sampler_arguments():
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        TokenBudgetBatchSampler([1], [1], max_tokens=0)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="1 examples cannot be shared among 2 processes"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, num_replicas=2, rank=0)


@pytest.mark.parametrize("d_model, warmup, scale", [(512, 4000, 1.0), (256, 500, 0.36), (1024, 100, 2.0)])
def test_inverse_sqrt_schedule_is_equation_3(d_model, warmup, scale):
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=paper_learning_rate(d_model, warmup, scale))
    scheduler = get_scheduler("inverse_sqrt", optimizer, num_warmup_steps=warmup)
    for step in range(1, 3 * warmup):
        optimizer.step()
        scheduler.step()
        equation_3 = scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert scheduler.get_last_lr()[0] == pytest.approx(equation_3, rel=1e-9), step
    assert paper_learning_rate(512, 4000) == pytest.approx(6.988e-4, rel=1e-3)  # the base model's peak


def test_checkpoint_averaging_is_the_mean_of_known_weights(tmp_path):
    model = tiny_model()
    # a distinct value in every entry of every tensor, so that a tensor read under another's name would show
    offset, distinct = 0, {}
    for name, parameter in model.named_parameters():
        distinct[name] = torch.arange(offset, offset + parameter.numel(), dtype=torch.float32).view_as(parameter) / 1e4
        offset += parameter.numel()
    for step, factor in ((10, 1.0), (20, 2.0), (30, 6.0), (5, 100.0)):
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.copy_(factor * distinct[name])
        model.save_pretrained(tmp_path / f"checkpoint-{step}")
    (tmp_path / "checkpoint-40").mkdir()  # an unfinished checkpoint: no weights
    folders = checkpoint_folders(str(tmp_path))
    assert [f.rsplit("-", 1)[1] for f in folders] == ["5", "10", "20", "30"]

    averaged = average_checkpoints(folders[-3:])  # factors 1, 2 and 6: the mean is 3 times each value
    assert averaged.keys() == distinct.keys()  # every parameter, the tied matrix once
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, 3 * distinct[name], msg=name)
    load_averaged_checkpoints(model, folders[-3:])
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.detach(), 3 * distinct[name], msg=name)
    assert model.lm_head.weight is model.model.shared.weight
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([])


def test_trainer_batches_by_token_budget_with_gradient_accumulation(tmp_path):
    tokenizer = letter_tokenizer()
    rng = random.Random(0)
    sources = [" ".join(rng.choices(LETTERS, k=rng.randint(2, 30))) for _ in range(300)]
    dataset = Dataset.from_dict(dict(tokenizer(sources, text_target=[s[::-1] for s in sources])))
    model = tiny_model(vocab_size=len(tokenizer))
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path),
        gradient_accumulation_steps=2,
        max_steps=3,
        max_tokens_per_batch=256,
        report_to=[],
        use_cpu=True,
    )
    trainer = TranslationTrainer(
        model=model, args=args, train_dataset=dataset, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model)
    )
    batches = list(trainer.get_train_dataloader())
    assert sum(len(batch["input_ids"]) for batch in batches) == 300
    assert all(batch["input_ids"].numel() <= 256 and batch["labels"].numel() <= 256 for batch in batches)
    assert len({len(batch["input_ids"]) for batch in batches}) > 3  # the number of sentences varies, tokens do not
    trainer.train()
    assert trainer.state.global_step == 3
