"""Training: the token-budget sampler, the schedule of Equation 3, checkpoint averaging and TranslationTrainer; and
the model training with transformers' Seq2SeqTrainer and DataCollatorForSeq2Seq, unchanged."""

import dataclasses
import os
import pickle
import random
import re
import subprocess
import sys
import traceback
import warnings

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard
from datasets import Dataset
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader
from transformers import (
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    TrainerState,
    get_scheduler,
)

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.cli import run_translation
from hf_vanilla_transformer.training.arguments import (
    TranslationTrainingArguments,
    fold_generation_settings,
    paper_learning_rate,
)
from hf_vanilla_transformer.training.batches import TokenBudgetBatchSampler, row_lengths
from hf_vanilla_transformer.training.callbacks import BatchSamplerEpoch
from hf_vanilla_transformer.training.checkpoints import MOVING_AVERAGE_NAME, average_checkpoints
from hf_vanilla_transformer.training.loss import LabelSmoothedLoss
from hf_vanilla_transformer.training.run import tokenize, trainer_arguments
from hf_vanilla_transformer.training.tokenizer import BPEDropoutCollator, train_shared_bpe
from hf_vanilla_transformer.training.trainer import TranslationTrainer, training_is_over
from support.models import (
    BOS,
    letter_tokenizer,
    random_token_dataset,
    reversal_dataset,
    tiny_config,
    tiny_model,
)
from support.paths import REPO_ROOT


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


def shares(sampler: TokenBudgetBatchSampler, processes: int) -> list[list[list[int]]]:
    """Each process's batches as accelerate deals them out (`accelerator.prepare` wraps a DataLoader's batch sampler
    in this BatchSamplerShard on several processes)."""
    return [list(BatchSamplerShard(sampler, num_processes=processes, process_index=rank)) for rank in range(processes)]


def test_accelerate_gives_two_processes_disjoint_equal_shares_of_everything():
    sources, targets = lengths(777, seed=1)
    sampler = TokenBudgetBatchSampler(sources, targets, 256, num_processes=2, seed=5)
    sampler.set_epoch(2)
    batches = shares(sampler, 2)
    assert len(batches[0]) == len(batches[1]) == len(sampler) // 2
    assert batches[0] == list(sampler)[0::2] and batches[1] == list(sampler)[1::2]  # round-robin
    seen = [{i for batch in rank_batches for i in batch} for rank_batches in batches]
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(777))
    assert sum(len(batch) for rank_batches in batches for batch in rank_batches) == 777


@pytest.mark.parametrize("count", [777, 778, 779, 780])
def test_n_processes_get_the_batches_of_one_process_accumulating_n(count):
    """Step k of one process accumulating 2 batches takes the batches that accelerate deals to process 0 and 1 at
    step k, for any number of batches (odd counts are evened out the same way in both), in every epoch."""
    sources, targets = lengths(count, seed=count)
    one = TokenBudgetBatchSampler(sources, targets, 256, seed=5, accumulation_steps=2)
    two = TokenBudgetBatchSampler(sources, targets, 256, seed=5, num_processes=2)
    for epoch in (0, 1, 2):
        one.set_epoch(epoch)
        two.set_epoch(epoch)
        accumulated = list(one)
        assert len(accumulated) % 2 == 0 and len(accumulated) == len(two)
        assert [batch for pair in zip(*shares(two, 2), strict=True) for batch in pair] == accumulated
        assert sorted(i for batch in accumulated for i in batch) == list(range(count))


def test_the_batches_of_a_seed_stay_what_they_were():
    """A run resumed by a later version of the package goes on with the batches it started with: these are the
    batches that version 0.2.0 (which dealt out the shares itself) gave each of 2 processes."""
    sources = [8, 9, 8, 8, 9, 4, 3, 9, 8, 3, 2, 8, 5, 3, 2, 9, 1, 7, 8, 3, 1]
    targets = [9, 2, 1, 1, 4, 4, 1, 8, 6, 8, 4, 9, 4, 5, 8, 1, 2, 8, 5, 7, 9]
    sampler = TokenBudgetBatchSampler(sources, targets, 16, num_processes=2, seed=4)
    assert shares(sampler, 2) == [
        [[8], [17, 2], [5, 12], [7], [10], [0], [11], [14]],
        [[20], [1], [19, 9], [15], [4], [6, 13], [16], [3, 18]],
    ]
    sampler.set_epoch(1)
    assert shares(sampler, 2) == [
        [[8], [7], [19, 9], [17, 2], [0], [10], [5, 12], [11]],
        [[3, 18], [1], [4], [20], [15], [6, 13], [14], [16]],
    ]


def test_an_example_longer_than_the_budget_is_a_batch_of_its_own():
    sampler = TokenBudgetBatchSampler([5, 500, 6, 7], [5, 20, 6, 7], max_tokens=100, shuffle=False)
    assert sorted(map(sorted, sampler)) == [[0, 2, 3], [1]]


def test_bad_sampler_arguments():
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        TokenBudgetBatchSampler([1], [1], max_tokens=0)
    with pytest.raises(ValueError, match="num_processes must be positive, got 0"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, num_processes=0)
    with pytest.raises(ValueError, match=r"1 examples cannot fill the 2 batches of a step \(2 processes x 1"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, num_processes=2)
    with pytest.raises(ValueError, match="accumulation_steps must be positive, got 0"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, accumulation_steps=0)


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


def test_trainer_batches_by_token_budget_with_gradient_accumulation(tmp_path):
    tokenizer = letter_tokenizer()
    dataset = reversal_dataset(tokenizer, 300, seed=0, letters=(2, 30))
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


def test_the_training_arguments_default_to_the_papers_recipe(tmp_path):
    args = TranslationTrainingArguments(output_dir=str(tmp_path))
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.98, 1e-9)  # Section 5.3
    assert (args.lr_scheduler_type, args.warmup_steps, args.learning_rate_scale) == ("inverse_sqrt", 4000, 1.0)
    assert args.learning_rate is None  # Equation 3's peak, once the model's d_model is known
    assert args.label_smoothing_factor == 0.1  # Section 5.4
    assert (args.weight_decay, args.max_grad_norm) == (0.0, 0.0)  # neither is in the paper
    # the class attributes are the one home that recipes, benchmarks and tests read
    assert TranslationTrainingArguments.adam_beta2 == args.adam_beta2


def test_predictions_come_in_dataset_order_even_with_length_grouped_training(tmp_path):
    dataset = random_token_dataset(40, seed=3)  # sources of 1-20 tokens: length grouping reorders them

    def predicted_labels(trainer_class, arguments_class):
        args = arguments_class(
            output_dir=str(tmp_path),
            report_to=[],
            use_cpu=True,
            per_device_eval_batch_size=8,
            train_sampling_strategy="group_by_length",
            learning_rate=1e-3,
        )
        model = tiny_model()
        collator = DataCollatorForSeq2Seq(letter_tokenizer(), model=model, padding=True)
        trainer = trainer_class(model=model, args=args, data_collator=collator)
        return [[t for t in row if t != -100] for row in trainer.predict(dataset).label_ids.tolist()]

    assert predicted_labels(TranslationTrainer, TranslationTrainingArguments) == dataset["labels"]
    # transformers 5.24's own Seq2SeqTrainer evaluates in length-grouped order, out of line with the references
    assert predicted_labels(Seq2SeqTrainer, Seq2SeqTrainingArguments) != dataset["labels"]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"average_last_checkpoints": 0}, "--average_last_checkpoints 0 must be at least 1"),
        ({"average_last_checkpoints": 3, "save_strategy": "no"}, "needs checkpoints, and --save_strategy is 'no'"),
        ({"average_last_checkpoints": 5, "save_total_limit": 2}, "is more than the --save_total_limit 2 checkpoints"),
        (
            {"max_tokens_per_batch": 500, "train_sampling_strategy": "group_by_length"},
            "--train_sampling_strategy 'group_by_length' has no effect with --max_tokens_per_batch",
        ),
        ({"bpe_dropout": 0.1}, "--bpe_dropout needs --max_tokens_per_batch"),
        ({"ema_decay": 1.0}, "--ema_decay 1.0 must be above 0 and below 1"),
        ({"ema_decay": 0.99, "average_last_checkpoints": 3}, "--ema_decay and --average_last_checkpoints 3"),
        ({"ema_decay": 0.99, "save_strategy": "no"}, "--ema_decay needs checkpoints"),
        ({"bpe_dropout": 1.0, "max_tokens_per_batch": 500}, "--bpe_dropout 1.0 must be at least 0 and below 1"),
        ({"pad_to_multiple_of": 0}, "--pad_to_multiple_of 0 must be at least 1"),
    ],
)
def test_training_arguments_that_make_no_sense_together_are_refused(tmp_path, settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TranslationTrainingArguments(output_dir=str(tmp_path), **settings)


def write_state(folder, **fields) -> str:
    folder.mkdir(parents=True)
    TrainerState(**fields).save_to_json(str(folder / "trainer_state.json"))
    return str(folder)


def test_training_is_over_at_max_steps_at_the_epochs_end_or_when_the_budget_is_spent(tmp_path):
    def args(**settings):
        return TranslationTrainingArguments(output_dir=str(tmp_path), **settings)

    spent = {"TimeLimitCallback": {"args": {"minutes": 1.0}, "attributes": {"spent_seconds": 60.0}}}
    at_step_40 = write_state(
        tmp_path / "a" / "checkpoint-40", global_step=40, max_steps=40, num_train_epochs=2, stateful_callbacks=spent
    )
    assert training_is_over(at_step_40, args(max_steps=40)) and not training_is_over(at_step_40, args(max_steps=41))
    assert training_is_over(at_step_40, args(num_train_epochs=2))  # the run that trained 2 epochs ended at step 40
    assert not training_is_over(at_step_40, args(num_train_epochs=3))
    assert training_is_over(at_step_40, args(max_steps=100, max_train_minutes=1.0))  # 60 s of 60 spent
    assert not training_is_over(at_step_40, args(max_steps=100, max_train_minutes=1.5))
    at_step_10 = write_state(tmp_path / "b" / "checkpoint-10", global_step=10, max_steps=40, num_train_epochs=2)
    assert not training_is_over(at_step_10, args(num_train_epochs=2))
    assert not training_is_over(at_step_10, args(max_steps=40, max_train_minutes=1.0))  # no time recorded: none spent


def test_the_sampler_takes_the_epoch_the_trainer_is_in_even_where_accelerate_does_not_pass_it_on():
    sampler = TokenBudgetBatchSampler(*lengths(50), max_tokens=100)
    callback = BatchSamplerEpoch()
    callback.sampler = sampler
    for epoch, expected in ((0.0, 0), (1.0, 1), (2 + 26 / 27, 2), (3.0, 3)):  # begun, or resumed part-way
        callback.on_epoch_begin(None, TrainerState(epoch=epoch), None)
        assert sampler.epoch == expected


def test_a_resumed_run_takes_the_batches_an_uninterrupted_run_takes(tmp_path):
    """Token-budget batches, 2 accumulated a step, 6 batches an epoch: stopped after step 4, in its second epoch,
    and resumed, the run goes on with the batches an uninterrupted run takes from there."""
    dataset = random_token_dataset(60, seed=6)

    class StopAt4(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 4

    def batches_seen(output_dir, resume=None, callbacks=()):
        seen, collator = [], DataCollatorForSeq2Seq(letter_tokenizer(), model=tiny_model())

        def record(features):
            seen.append([tuple(feature["input_ids"]) for feature in features])
            return collator(features)

        args = TranslationTrainingArguments(
            output_dir=str(output_dir),
            max_steps=8,
            save_steps=4,
            max_tokens_per_batch=200,
            gradient_accumulation_steps=2,
            warmup_steps=2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = TranslationTrainer(
            model=tiny_model(), args=args, train_dataset=dataset, data_collator=record, callbacks=list(callbacks)
        )
        assert len(trainer.get_train_dataloader()) == 6
        seen.clear()
        trainer.train(resume_from_checkpoint=resume)
        return seen

    # 16 batches trained, and one more that accelerate's loader reads ahead
    uninterrupted = batches_seen(tmp_path / "whole")
    assert len(uninterrupted) == 17 and uninterrupted[:6] != uninterrupted[6:12]  # each epoch its own batches
    assert len(batches_seen(tmp_path / "stopped", callbacks=[StopAt4()])) == 9
    assert batches_seen(tmp_path / "stopped", resume=str(tmp_path / "stopped" / "checkpoint-4")) == uninterrupted[8:]


def test_evaluation_under_bf16_runs_in_the_saved_models_precision(tmp_path):
    """With --bf16 accelerate runs the model's forward under bfloat16 autocast, evaluation included (transformers'
    Seq2SeqTrainer predicts in bfloat16); TranslationTrainer turns autocast off inside, so its predictions are the
    float32 model's, while training stays in bfloat16."""
    dataset = random_token_dataset(12, seed=7)

    def run(trainer_class, args_class, bf16, train=False):
        model = tiny_model(encoder_layers=1, decoder_layers=1)  # an untrained model decodes to its length limit
        dtypes = []
        model.lm_head.register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
        args = args_class(
            output_dir=str(tmp_path),
            bf16=bf16,
            use_cpu=True,
            max_steps=2,
            learning_rate=0.0,
            per_device_train_batch_size=4,
            per_device_eval_batch_size=4,
            predict_with_generate=True,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
        )
        trainer = trainer_class(
            model=model,
            args=args,
            train_dataset=dataset,
            data_collator=DataCollatorForSeq2Seq(letter_tokenizer(), model=model),
        )
        phases = {}
        if train:
            trainer.train()
            phases["training"], dtypes[:] = set(dtypes), []
        predictions = trainer.predict(dataset).predictions
        phases["prediction"], dtypes[:] = set(dtypes), []
        if train:
            trainer.train()  # again, after the prediction
            phases["training again"] = set(dtypes)
        return predictions, phases

    float32, _ = run(Seq2SeqTrainer, Seq2SeqTrainingArguments, bf16=False)
    ours, phases = run(TranslationTrainer, TranslationTrainingArguments, bf16=True, train=True)  # lr 0: untrained
    assert phases == {"training": {torch.bfloat16}, "prediction": {torch.float32}, "training again": {torch.bfloat16}}
    assert ours.tolist() == float32.tolist()
    _, theirs = run(Seq2SeqTrainer, Seq2SeqTrainingArguments, bf16=True)
    assert theirs == {"prediction": {torch.bfloat16}}


def test_evaluation_cuts_the_examples_accelerate_repeats_to_fill_the_last_batches(tmp_path):
    """On several processes accelerate fills each process's last batch with examples from the dataset's start, which
    come after the dataset's own when gathered; Seq2SeqTrainer's `accelerator.gather` keeps them. A loader that adds
    them as accelerate does, on one process: the predictions and what compute_metrics receives are cut to the
    dataset, in order."""
    dataset = random_token_dataset(12, seed=3)
    collator = DataCollatorForSeq2Seq(letter_tokenizer(), model=tiny_model(), padding=True)
    repeated = DataLoader(dataset, batch_sampler=[list(range(8)), [8, 9, 10, 11, 0, 1, 2, 3]], collate_fn=collator)

    def evaluate(trainer_class, args_class):
        received = []
        args = args_class(output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_eval_batch_size=8)
        trainer = trainer_class(
            model=tiny_model(),
            args=args,
            data_collator=collator,
            compute_metrics=lambda prediction: received.append(prediction) or {},
        )
        output = trainer.evaluation_loop(repeated, "Evaluation")
        return output.label_ids.tolist(), received[0].label_ids.tolist(), len(received[0].predictions[0])  # logits

    labels, metric_labels, metric_predictions = evaluate(TranslationTrainer, TranslationTrainingArguments)
    assert [[t for t in row if t != -100] for row in labels] == dataset["labels"]
    assert metric_labels == labels and metric_predictions == 12
    assert len(evaluate(Seq2SeqTrainer, Seq2SeqTrainingArguments)[0]) == 16  # transformers' own keeps the repeats


def test_the_trainer_takes_equation_3s_peak_unless_a_learning_rate_is_given(tmp_path):
    def trainer(**settings):
        args = TranslationTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, **settings)
        return TranslationTrainer(model=tiny_model(), args=args)

    assert trainer().args.learning_rate == pytest.approx(32**-0.5 * 4000**-0.5)  # the tiny model's d_model is 32
    scaled = trainer(warmup_steps=100, learning_rate_scale=2.0).args.learning_rate
    assert scaled == pytest.approx(2.0 * 32**-0.5 * 100**-0.5)
    assert trainer(learning_rate=1e-3, learning_rate_scale=2.0).args.learning_rate == 1e-3
    with pytest.raises(ValueError, match=r"warmup_steps 0.1 must be a whole number of steps"):
        trainer(warmup_steps=0.1)


def test_the_trainer_leaves_the_arguments_it_is_given_as_they_were(tmp_path):
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, save_total_limit=3, average_last_checkpoints=2
    )
    before = args.to_dict()
    trainer = TranslationTrainer(model=tiny_model(), args=args)
    assert args.to_dict() == before and args.learning_rate is None and args.save_total_limit == 3
    assert trainer.args.learning_rate == pytest.approx(32**-0.5 * 4000**-0.5)  # set in the trainer's own copy
    # arguments rebuilt from what they print are the same arguments
    fields = {field.name for field in dataclasses.fields(TranslationTrainingArguments) if field.init}
    rebuilt = TranslationTrainingArguments(**{name: value for name, value in before.items() if name in fields})
    assert rebuilt.to_dict() == before


def test_the_trainer_takes_only_its_own_arguments_class(tmp_path):
    stock = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(TypeError, match=r"TranslationTrainer takes TranslationTrainingArguments, not Seq2Seq"):
        TranslationTrainer(model=tiny_model(), args=stock)


def test_a_run_folds_the_decoding_flags_into_the_model_and_gives_the_trainer_a_copy_without_them(tmp_path):
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, generation_num_beams=3, generation_max_length=40
    )
    model = tiny_model()
    fold_generation_settings(model, args, length_penalty=1.0)
    assert (model.generation_config.num_beams, model.generation_config.max_length) == (3, 40)
    assert (args.generation_num_beams, args.generation_max_length) == (3, 40)  # as given
    copied = trainer_arguments(args)
    assert (copied.generation_num_beams, copied.generation_max_length, copied.generation_config) == (None,) * 3
    assert not copied.push_to_hub and (args.generation_num_beams, args.output_dir) == (3, copied.output_dir)


def test_the_main_recipes_weight_decay_shrinks_every_matrix_but_no_bias_or_layer_norm(tmp_path):
    recipe = str(REPO_ROOT / "recipes" / "multi30k_small.yaml")
    _, _, args = run_translation.parse_arguments([recipe, "--output_dir", str(tmp_path), "--bf16", "false"])
    model = tiny_model()
    trainer = TranslationTrainer(model=model, args=args)
    optimizer = trainer.create_optimizer()
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)  # Adam's own step is then zero: what moves is the decay alone
    optimizer.step()
    shrunk = {name for name, parameter in model.named_parameters() if not torch.equal(parameter, before[name])}
    kept = {name for name in before if name.endswith("bias") or "layer_norm" in name}
    assert shrunk == set(before) - kept and kept
    assert "model.shared.weight" in shrunk
    assert args.weight_decay == 0.1
    factor = 1 - trainer.args.learning_rate * args.weight_decay
    assert torch.allclose(model.model.shared.weight, before["model.shared.weight"] * factor)


@pytest.mark.parametrize("keep_checkpoints", [False, True])
def test_the_final_model_is_the_average_and_only_the_last_checkpoint_stays(tmp_path, keep_checkpoints):
    dataset = random_token_dataset(64, seed=1)
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=12,
        save_steps=3,
        save_total_limit=4,
        average_last_checkpoints=3,
        keep_checkpoints=keep_checkpoints,
        per_device_train_batch_size=4,
        warmup_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    collator = DataCollatorForSeq2Seq(letter_tokenizer(), model=tiny_model())
    trainer = TranslationTrainer(model=tiny_model(), args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    average = average_checkpoints([str(tmp_path / f"checkpoint-{step}") for step in (6, 9, 12)])
    last = average_checkpoints([str(tmp_path / "checkpoint-12")])
    trainer.save_final_model()
    saved = average_checkpoints([str(tmp_path)])
    assert saved.keys() == average.keys() and all(torch.equal(saved[k], average[k]) for k in saved)
    assert not all(torch.equal(saved[k], last[k]) for k in saved)
    kept = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))
    assert kept == ([3, 6, 9, 12] if keep_checkpoints else [12])
    # ended at the last checkpoint (a rerun, or a run stopped while deleting): the saved model, not the average of
    # the checkpoints left
    assert training_is_over(str(tmp_path / "checkpoint-12"), args)
    again = TranslationTrainer(model=tiny_model(), args=args, train_dataset=dataset, data_collator=collator)
    again.save_final_model(finished_checkpoint=str(tmp_path / "checkpoint-12"))
    state = again.model.state_dict()
    assert all(torch.equal(state[k], average[k]) for k in average)
    assert average_checkpoints([str(tmp_path)]).keys() == saved.keys()


@pytest.mark.slow
def test_seq2seq_trainer_learns_to_reverse(tmp_path):
    tokenizer = letter_tokenizer()
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(
        tiny_config(vocab_size=len(tokenizer), d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, dropout=0.1)
    )
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=32,
        gradient_accumulation_steps=2,
        max_steps=120,
        learning_rate=3e-3,
        warmup_steps=20,
        # the paper's schedule, beta2 and label smoothing, read from their one home
        lr_scheduler_type=TranslationTrainingArguments.lr_scheduler_type,
        adam_beta2=TranslationTrainingArguments.adam_beta2,
        label_smoothing_factor=TranslationTrainingArguments.label_smoothing_factor,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        predict_with_generate=True,
        generation_num_beams=1,
        use_cpu=True,
        seed=0,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=reversal_dataset(tokenizer, 4000, seed=1),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < 0.6 * losses[0], losses

    test = reversal_dataset(tokenizer, 50, seed=2)
    predictions = trainer.predict(test).predictions
    predictions[predictions == -100] = tokenizer.pad_token_id
    decoded = tokenizer.batch_decode(predictions, skip_special_tokens=True)
    references = tokenizer.batch_decode(
        [[t for t in labels if t != -100] for labels in test["labels"]], skip_special_tokens=True
    )
    exact = sum(p == r for p, r in zip(decoded, references, strict=False))
    print(f"losses {losses[0]:.2f} -> {losses[-1]:.2f}, exact {exact}/50")
    assert exact >= 25, list(zip(decoded, references, strict=False))[:5]


class GradientRecorder(TrainerCallback):
    """Keeps a copy of every parameter's gradient just before each optimizer step."""

    def __init__(self):
        self.gradients = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradients.append({name: p.grad.detach().clone() for name, p in model.named_parameters()})


def trainer_gradient(
    dataset, tmp_path, batch_size: int, accumulation: int, label_smoothing: float, ours: bool = False
) -> dict:
    """The gradient of the first optimizer step over the whole `dataset`, of transformers' Seq2SeqTrainer or (`ours`)
    TranslationTrainer."""
    model = tiny_model().train()
    recorder = GradientRecorder()
    trainer_class, arguments_class, precision = (
        (TranslationTrainer, TranslationTrainingArguments, {"bf16": False})  # float32: the definition's precision
        if ours
        else (Seq2SeqTrainer, Seq2SeqTrainingArguments, {})
    )
    args = arguments_class(
        **precision,
        output_dir=str(tmp_path / f"{batch_size}x{accumulation}"),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        label_smoothing_factor=label_smoothing,
        max_grad_norm=0.0,  # no clipping: the gradient as computed
        train_sampling_strategy="sequential",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
    )
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(letter_tokenizer(), model=model),
        callbacks=[recorder],
    )
    trainer.train()
    assert len(recorder.gradients) == 1
    return recorder.gradients[0]


def definition_gradient(dataset, label_smoothing: float) -> dict:
    """Section 5.4's label-smoothed cross-entropy, averaged over every target token of `dataset`, computed one
    sentence at a time without any padding: (1 - eps) * -log p(y) + eps * mean over the vocabulary of -log p(v).
    """
    model = tiny_model().train()
    tokens = sum(len(labels) for labels in dataset["labels"])
    for source, labels in zip(dataset["input_ids"], dataset["labels"], strict=False):
        decoder_input_ids = torch.tensor([[BOS, *labels[:-1]]])
        log_probs = (
            model(input_ids=torch.tensor([source]), decoder_input_ids=decoder_input_ids).logits[0].log_softmax(-1)
        )
        nll = -log_probs[torch.arange(len(labels)), torch.tensor(labels)]
        loss = (1 - label_smoothing) * nll - label_smoothing * log_probs.mean(-1)
        (loss.sum() / tokens).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def largest_relative_difference(gradients: dict, reference: dict) -> float:
    assert gradients.keys() == reference.keys()
    scale = max(g.abs().max() for g in reference.values())
    return float(max((gradients[name] - reference[name]).abs().max() for name in reference) / scale)


@pytest.mark.parametrize("ours", [False, True])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_two_accumulated_half_batches_give_the_gradient_of_the_full_batch(tmp_path, label_smoothing, ours):
    # sorted by target length, so that the second half holds far more target tokens than the first: a mean of the
    # two halves' means would weigh the first half's tokens more than the full batch's mean does
    dataset = random_token_dataset(8, seed=5)
    dataset = dataset.select(sorted(range(8), key=lambda i: len(dataset["labels"][i])))
    tokens = [sum(map(len, dataset["labels"][half])) for half in (slice(0, 4), slice(4, 8))]
    assert tokens[1] > 1.5 * tokens[0]
    full = trainer_gradient(dataset, tmp_path, batch_size=8, accumulation=1, label_smoothing=label_smoothing, ours=ours)
    halves = trainer_gradient(dataset, tmp_path, 4, accumulation=2, label_smoothing=label_smoothing, ours=ours)
    # padding takes no share: the padded batches give the gradient of the sentences taken one by one, unpadded
    reference = definition_gradient(dataset, label_smoothing)
    assert largest_relative_difference(full, reference) < 1e-5
    assert largest_relative_difference(halves, reference) < 1e-5


class _RunsCode:
    """A pickle that would create a file as it loads."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("state_file", ["rng_state.pth", "optimizer.pt", "scheduler.pt"])
def test_resuming_never_unpickles_code(tmp_path, state_file):
    dataset = random_token_dataset(40, seed=2)
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=4,
        save_steps=2,
        per_device_train_batch_size=4,
        warmup_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    model = tiny_model()
    collator = DataCollatorForSeq2Seq(letter_tokenizer(), model=model)
    TranslationTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator).train()
    marker = tmp_path / "code-ran"
    torch.save({"state": _RunsCode(str(marker))}, tmp_path / "run" / "checkpoint-2" / state_file)
    args.max_steps = 6
    resumed = TranslationTrainer(model=tiny_model(), args=args, train_dataset=dataset, data_collator=collator)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert not marker.exists()


def test_bpe_dropout_batches_resegment_the_training_text_each_time_they_are_made(tmp_path):
    words = ["cats", "dogs", "walking", "running", "slowly"]
    sentences = [" ".join(random.Random(i).choices(words, k=6)) for i in range(60)]
    tokenizer = train_shared_bpe(sentences * 5, vocab_size=300)
    pairs = Dataset.from_dict({"source": sentences, "target": [sentence.upper() for sentence in sentences]})
    dataset = tokenize(pairs, tokenizer, 64, 64, keep_text=True)
    model = tiny_model(vocab_size=len(tokenizer))
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path), max_steps=4, max_tokens_per_batch=200, bpe_dropout=0.3, report_to=[], use_cpu=True
    )
    collator = BPEDropoutCollator(tokenizer, args.bpe_dropout, DataCollatorForSeq2Seq(tokenizer, model=model), 64, 64)
    trainer = TranslationTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)

    # the same epoch's batches of the same pairs, made twice
    first, second = list(trainer.get_train_dataloader()), list(trainer.get_train_dataloader())
    assert set(first[0]) == {"input_ids", "attention_mask", "labels", "decoder_input_ids"}  # no text reaches the model
    assert [len(batch["input_ids"]) for batch in first] == [len(batch["input_ids"]) for batch in second]
    assert any(not torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, second, strict=True))
    decoded = {tokenizer.decode(row, skip_special_tokens=True) for batch in first for row in batch["input_ids"]}
    assert decoded == set(sentences)
    trainer.train()
    assert trainer.state.global_step == 4


def test_the_moving_average_of_the_weights_is_the_final_model_and_goes_on_from_a_checkpoint(tmp_path):
    dataset, collator = random_token_dataset(64, seed=2), DataCollatorForSeq2Seq(letter_tokenizer(), model=tiny_model())
    options = {"per_device_train_batch_size": 4, "report_to": [], "use_cpu": True, "disable_tqdm": True}

    class RecordWeights(TrainerCallback):
        def __init__(self):
            self.steps = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.steps.append({name: value.detach().clone() for name, value in model.named_parameters()})

    def trainer(output_dir, callbacks=(), **settings):
        settings = {"max_steps": 8, "save_steps": 4, "ema_decay": 0.7, "warmup_steps": 2, **options, **settings}
        args = TranslationTrainingArguments(output_dir=str(output_dir), **settings)
        model = tiny_model()
        return TranslationTrainer(model, args, train_dataset=dataset, data_collator=collator, callbacks=list(callbacks))

    record = RecordWeights()
    whole = trainer(tmp_path / "whole", [record], keep_checkpoints=True)
    whole.train()
    expected = record.steps[0]  # the first step's weights, then average = 0.7 average + 0.3 weights
    for weights in record.steps[1:]:
        expected = {name: 0.7 * expected[name] + 0.3 * weights[name] for name in expected}
    whole.save_final_model()
    final = dict(whole.model.named_parameters())
    assert len(record.steps) == 8 and all(torch.allclose(final[k], expected[k], atol=1e-6) for k in expected)
    assert not all(torch.equal(final[k], record.steps[-1][k]) for k in expected)  # not the last step's weights
    assert (tmp_path / "whole" / "checkpoint-8" / MOVING_AVERAGE_NAME).is_file()

    # resumed from step 4's checkpoint, the average goes on from the one saved there and ends where it did
    resumed = trainer(tmp_path / "whole", keep_checkpoints=True)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-4"))
    resumed.save_final_model()
    state, reference = resumed.model.state_dict(), whole.model.state_dict()
    assert all(torch.allclose(state[k], reference[k], atol=1e-7) for k in reference)

    trainer(tmp_path / "plain", max_steps=4, ema_decay=None).train()
    with pytest.raises(ValueError, match="checkpoint-4: no moving average of the weights to go on from"):
        trainer(tmp_path / "plain").train(resume_from_checkpoint=str(tmp_path / "plain" / "checkpoint-4"))


class HostReads(TorchFunctionMode):
    """Each call that reads a tensor's value on the host (`.item()`, `bool(t)`, `.tolist()`, ...), which on a GPU
    waits for the device, recorded by the innermost frame of our package or a library that made it."""

    READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy"})

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            frames = [frame.filename for frame in traceback.extract_stack()[:-1]]
            placed = [name for name in frames if "site-packages" in name or "hf_vanilla_transformer" in name]
            self.calls.append(placed[-1] if placed else frames[-1])
        return func(*args, **(kwargs or {}))


def test_a_training_step_reads_nothing_back_from_the_device_in_our_code(tmp_path):
    """No `.item()` or the like of ours inside a step, where a GPU would wait for the host: over 12 steps of token
    budget batches with label smoothing, every read of a tensor's value is transformers' (its attention-mask check
    and, unless --logging_nan_inf_filter false, its loss check) or the data loader's."""
    tokenizer = letter_tokenizer()
    dataset = reversal_dataset(tokenizer, 300, seed=0, letters=(2, 30))
    model = tiny_model(vocab_size=len(tokenizer))
    reads = {}
    for nan_inf_filter in (True, False):
        args = TranslationTrainingArguments(
            output_dir=str(tmp_path),
            max_steps=12,
            max_tokens_per_batch=256,
            label_smoothing_factor=0.1,
            logging_nan_inf_filter=nan_inf_filter,
            logging_steps=100,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
        )
        collator = DataCollatorForSeq2Seq(tokenizer, model=model)
        trainer = TranslationTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
        with HostReads() as recorder:
            trainer.train()
        reads[nan_inf_filter] = recorder.calls
    assert not [place for calls in reads.values() for place in calls if "hf_vanilla_transformer" in place]
    trainer_reads = [
        [place for place in calls if place.endswith("transformers/trainer.py")] for calls in reads.values()
    ]
    assert len(trainer_reads[0]) - len(trainer_reads[1]) == 2 * 12  # the loss check (isnan, isinf), each step
    assert reads[False]  # the recorder sees reads: transformers' attention-mask check, the data loader's seed


def device_reads(run) -> int:
    """How many times `run` reads a tensor's value back to the host, as torch.profiler sees it: each such read is one
    `aten::_local_scalar_dense`, whatever Python call made it."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        run()
    return sum(event.name == "aten::_local_scalar_dense" for event in profiler.events())


@pytest.mark.slow
def test_the_profiler_sees_no_host_read_in_the_compiled_step_and_only_transformers_mask_checks_in_the_eager_one():
    """torch.profiler over the step of each of 3 batches of different shapes: eagerly, the forward reads back 2 values,
    transformers' check of the source mask for padding (`create_bidirectional_mask`, encoder and cross-attention);
    our label-smoothed loss and the backward read none. Compiled (aot_eager: the graphs torch's compilers are given),
    the forward reads none either."""
    tokenizer = letter_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer)).train()
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    dataset = reversal_dataset(tokenizer, 60, seed=0, letters=(2, 30))
    sampler = TokenBudgetBatchSampler(row_lengths(dataset, "input_ids"), row_lengths(dataset, "labels"), 256)
    batches = [collator([dataset[i] for i in batch]) for batch in list(sampler)[:3]]
    assert len({tuple(batch["input_ids"].shape) for batch in batches}) == 3
    loss_function = LabelSmoothedLoss(0.1)
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    for batch in batches:
        inputs = {name: value for name, value in batch.items() if name != "labels"}
        outputs = {}

        def forward(inputs=inputs, outputs=outputs):
            outputs["logits"] = model(**inputs).logits

        def loss_and_backward(outputs=outputs, labels=batch["labels"]):
            loss_function(outputs, labels).backward()

        assert (device_reads(forward), device_reads(loss_and_backward)) == (2, 0)
        compiled(**inputs)  # compiled for this shape first, so that only the step is profiled below

        def compiled_step(inputs=inputs, labels=batch["labels"]):
            loss_function(compiled(**inputs), labels).backward()

        assert device_reads(compiled_step) == 0


COMPILED_RUN = """
import sys
sys.path.insert(0, {tests!r})
import torch
from transformers import DataCollatorForSeq2Seq
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.trainer import TranslationTrainer
from support.models import letter_tokenizer, reversal_dataset, tiny_model

torch.set_num_threads(1)
tokenizer = letter_tokenizer()
dataset = reversal_dataset(tokenizer, 600, seed=0, letters=(2, 40))
model = tiny_model(vocab_size=len(tokenizer))
args = TranslationTrainingArguments(
    output_dir={output!r}, max_steps=40, max_tokens_per_batch=256, label_smoothing_factor=0.1, logging_steps=1000,
    save_strategy="no", report_to=[], use_cpu=True, torch_compile=True, torch_compile_backend="eager",
)
collator = DataCollatorForSeq2Seq(tokenizer, model=model)
trainer = TranslationTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
shapes = {{(*batch["input_ids"].shape, *batch["labels"].shape) for batch in trainer.get_train_dataloader()}}
print("SHAPES", len(shapes))
trainer.train()
"""


@pytest.mark.slow
def test_a_compiled_training_step_compiles_twice_whatever_the_shapes_of_the_token_budget_batches(tmp_path):
    """Under --torch_compile, 40 steps of token-budget batches, whose shapes differ from batch to batch, compile the
    model's forward once for the first shape and once more with dynamic shapes, then never again (torch's own
    recompile log, TORCH_LOGS=recompiles, counts it; dynamo's eager backend traces as inductor would, quickly)."""
    script = COMPILED_RUN.format(tests=str(REPO_ROOT / "tests"), output=str(tmp_path / "run"))
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "TORCH_LOGS": "recompiles", "HF_HUB_OFFLINE": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shapes = int(re.search(r"SHAPES (\d+)", result.stdout).group(1))
    recompiles = re.findall(r"Recompiling function (\w+)", result.stderr)
    assert shapes >= 20 and recompiles == ["forward"], (shapes, recompiles)


@pytest.mark.slow  # worker processes, each importing torch
def test_collation_in_dataloader_workers_gives_the_same_batches_in_the_same_order(tmp_path):
    """On a GPU, --dataloader_num_workers moves collation off the training process (docs/training.md): the token
    budget batches of two epochs, made in two persistent workers, are those made in the training process; and no
    warning (torch's of pinned memory without an accelerator) on a CPU."""
    tokenizer = letter_tokenizer()
    dataset = reversal_dataset(tokenizer, 200, seed=0, letters=(2, 30))
    model = tiny_model(vocab_size=len(tokenizer))
    epochs = {}
    for workers in (0, 2):
        args = TranslationTrainingArguments(
            output_dir=str(tmp_path),
            max_tokens_per_batch=256,
            dataloader_num_workers=workers,
            dataloader_persistent_workers=workers > 0,
            report_to=[],
        )
        collator = DataCollatorForSeq2Seq(tokenizer, model=model)
        trainer = TranslationTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
        loader = trainer.get_train_dataloader()
        epochs[workers] = []
        for epoch in range(2):
            trainer.batch_sampler_epoch.sampler.set_epoch(epoch)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                epochs[workers].append([batch["input_ids"] for batch in loader])
    assert len(epochs[0][0]) > 5 and [len(epoch) for epoch in epochs[2]] == [len(epoch) for epoch in epochs[0]]
    assert not all(torch.equal(a, b) for a, b in zip(*epochs[0], strict=False))  # the two epochs differ
    for made_in_workers, made_here in zip(epochs[2], epochs[0], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(made_in_workers, made_here, strict=True))
