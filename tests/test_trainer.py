"""The model trains with transformers' Seq2SeqTrainer and DataCollatorForSeq2Seq, unchanged."""

import json
import random

import pytest
import torch
from conftest import BOS, EOS, LETTERS, PAD, letter_tokenizer, tiny_config, tiny_model
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.training import TranslationTrainer


def reversal_dataset(tokenizer, size: int, seed: int) -> Dataset:
    """Translate a letter string into its reverse: a task a tiny Transformer learns in a few hundred steps."""
    rng = random.Random(seed)
    sources = [" ".join(rng.choices(LETTERS, k=rng.randint(3, 7))) for _ in range(size)]
    targets = [" ".join(reversed(s.split())) for s in sources]
    return Dataset.from_dict({"source": sources, "target": targets}).map(
        lambda batch: tokenizer(batch["source"], text_target=batch["target"]),
        batched=True,
        remove_columns=["source", "target"],
    )


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_seq2seq_trainer_learns_to_reverse(tmp_path, gradient_checkpointing):
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
        lr_scheduler_type="inverse_sqrt",
        adam_beta2=0.98,
        label_smoothing_factor=0.1,
        activation_checkpointing=gradient_checkpointing,
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
    assert model.model.decoder.layers[0].gradient_checkpointing is gradient_checkpointing
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


def random_token_dataset(size: int, seed: int) -> Dataset:
    """Sources and targets of random ids between 4 and 98 (the tiny model's vocabulary), of varied lengths."""
    rng = random.Random(seed)

    def sentence(longest: int) -> list[int]:
        return [rng.randint(4, 98) for _ in range(rng.randint(1, longest))] + [EOS]

    rows = [(sentence(20), sentence(12)) for _ in range(size)]
    return Dataset.from_dict({"input_ids": [s for s, _ in rows], "labels": [t for _, t in rows]})


def output_lengths(predictions) -> list[int]:
    """Generated tokens per row, `</s>` included (the start token and the padding after </s> left out)."""
    lengths = []
    for row in predictions.tolist():
        tokens = [t for t in row[1:] if t not in (-100, PAD)]
        lengths.append(tokens.index(EOS) + 1 if EOS in tokens else len(tokens))
    return lengths


@pytest.mark.parametrize("trainer_class", [Seq2SeqTrainer, TranslationTrainer])
def test_evaluation_keeps_the_length_limit_of_every_batch_and_of_the_saved_model(tmp_path, trainer_class):
    """Seq2SeqTrainer fills the model's unset generation settings with transformers' defaults after its first
    evaluation batch (max_length=20 among them); every later batch, and every later call, must still decode each
    sentence to its source length + 50 tokens. An untrained model never chooses </s>, so each output reaches it.
    """
    model = tiny_model()
    dataset = random_token_dataset(12, seed=3)
    limits = [len(ids) + 50 for ids in dataset["input_ids"]]
    seen_in_training = []

    def record_lengths(prediction):
        seen_in_training.append(output_lengths(prediction.predictions))
        return {}

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,  # 3 evaluation batches
        max_steps=4,
        learning_rate=0.0,  # the weights stay untrained, so that no output ends before its limit
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="no",
        predict_with_generate=True,
        report_to=[],
        use_cpu=True,
    )
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(letter_tokenizer(), model=model),
        compute_metrics=record_lengths,
    )
    trainer.train()  # evaluates at steps 2 and 4
    assert seen_in_training == [limits, limits]
    for _ in range(2):
        assert output_lengths(trainer.predict(dataset).predictions) == limits
        trainer.evaluate()
        assert seen_in_training[-1] == limits

    trainer.save_model(str(tmp_path / "model"))
    saved = json.loads((tmp_path / "model" / "generation_config.json").read_text())
    assert saved["max_length"] == model.config.max_position_embeddings and saved["max_new_tokens_over_source"] == 50
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path / "model")
    sources = DataCollatorForSeq2Seq(letter_tokenizer())([{"input_ids": ids} for ids in dataset["input_ids"]])
    assert output_lengths(reloaded.generate(**sources)) == limits


class GradientRecorder(TrainerCallback):
    """Keeps a copy of every parameter's gradient just before each optimizer step."""

    def __init__(self):
        self.gradients = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradients.append({name: p.grad.detach().clone() for name, p in model.named_parameters()})


def trainer_gradient(dataset, tmp_path, batch_size: int, accumulation: int, label_smoothing: float) -> dict:
    """The gradient of the Trainer's first optimizer step over the whole `dataset`."""
    model = tiny_model().train()
    recorder = GradientRecorder()
    args = Seq2SeqTrainingArguments(
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
    trainer = Seq2SeqTrainer(
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


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_two_accumulated_half_batches_give_the_gradient_of_the_full_batch(tmp_path, label_smoothing):
    # sorted by target length, so that the second half holds far more target tokens than the first: a mean of the
    # two halves' means would weigh the first half's tokens more than the full batch's mean does
    dataset = random_token_dataset(8, seed=5)
    dataset = dataset.select(sorted(range(8), key=lambda i: len(dataset["labels"][i])))
    tokens = [sum(map(len, dataset["labels"][half])) for half in (slice(0, 4), slice(4, 8))]
    assert tokens[1] > 1.5 * tokens[0]
    full = trainer_gradient(dataset, tmp_path, batch_size=8, accumulation=1, label_smoothing=label_smoothing)
    halves = trainer_gradient(dataset, tmp_path, batch_size=4, accumulation=2, label_smoothing=label_smoothing)
    # padding takes no share: the padded batches give the gradient of the sentences taken one by one, unpadded
    reference = definition_gradient(dataset, label_smoothing)
    assert largest_relative_difference(full, reference) < 1e-5
    assert largest_relative_difference(halves, reference) < 1e-5
