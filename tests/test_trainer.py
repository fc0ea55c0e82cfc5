"""The model trains with transformers' Seq2SeqTrainer and DataCollatorForSeq2Seq, unchanged."""

import random

import pytest
import torch
from conftest import LETTERS, letter_tokenizer, tiny_config
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration


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
    exact = sum(p == r for p, r in zip(decoded, references))
    print(f"losses {losses[0]:.2f} -> {losses[-1]:.2f}, exact {exact}/50")
    assert exact >= 25, list(zip(decoded, references))[:5]
