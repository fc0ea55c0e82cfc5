"""The whole training loop: Seq2SeqTrainer throughput with token-budget batches against the stock padded batches.

    python -m bench trainer_throughput --steps 30 --repetitions 3

Both runs train the small preset on Multi30k train through the Trainer, end to end (sampling, collation with
`DataCollatorForSeq2Seq`, padding, forward, label-smoothed loss, backward, AdamW, schedule), for --steps steps each:
ours with `TranslationTrainer` and `max_tokens_per_batch`, the stock one with the Trainer's own random
batches of a fixed number of sentences, set to the token-budget batches' mean so that both see about as many real
tokens per step. Reported: the fraction of padding in the batches, and real target tokens per second of
`trainer.train()` wall time. Repetitions are interleaved (ours, stock, ours, ...); medians are kept.
"""

import argparse
import statistics
import tempfile

import torch
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq

from bench.helpers.common import add_repetitions, machine, multi30k_encoded, multi30k_tokenizer, write_results
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.batches import TokenBudgetBatchSampler
from hf_vanilla_transformer.training.trainer import TranslationTrainer


class CountingCollator:
    """DataCollatorForSeq2Seq that records, per batch, real and padded token counts of source and target."""

    def __init__(self, collator: DataCollatorForSeq2Seq):
        self.collator = collator
        self.batches = []

    def __call__(self, features):
        batch = self.collator(features)
        self.batches.append(
            {
                "source_real": int(batch["attention_mask"].sum()),
                "source_padded": batch["input_ids"].numel(),
                "target_real": int((batch["labels"] != -100).sum()),
                "target_padded": batch["labels"].numel(),
            }
        )
        return batch


def train_once(train_dataset, tokenizer, preset: str, steps: int, max_tokens: int | None, batch_size: int) -> dict:
    """Train a fresh model for `steps` steps; the batches' token counts and the train() wall time."""
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig.from_preset(preset, vocab_size=len(tokenizer))
    )
    collator = CountingCollator(DataCollatorForSeq2Seq(tokenizer, model=model))
    with tempfile.TemporaryDirectory() as output_dir:
        args = TranslationTrainingArguments(  # the paper's Adam, schedule and label smoothing by default
            output_dir=output_dir,
            max_steps=steps,
            per_device_train_batch_size=batch_size,
            max_tokens_per_batch=max_tokens,
            learning_rate=7e-4,
            warmup_steps=10,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            disable_tqdm=True,
            use_cpu=True,
            seed=1,
        )
        trainer = TranslationTrainer(
            model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer, data_collator=collator
        )
        seconds = trainer.train().metrics["train_runtime"]
    used = collator.batches[:steps]  # the dataloader may have collated one batch ahead
    totals = {key: sum(batch[key] for batch in used) for key in used[0]}
    return {"seconds": seconds, **totals}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--max_tokens", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=30)
    add_repetitions(parser, 3)
    args = parser.parse_args()

    tokenizer = multi30k_tokenizer()
    encoded = multi30k_encoded(tokenizer)
    train_dataset = Dataset.from_dict({"input_ids": encoded["input_ids"], "labels": encoded["labels"]})
    budget_batches = len(
        TokenBudgetBatchSampler(
            [len(ids) for ids in encoded["input_ids"]], [len(ids) for ids in encoded["labels"]], args.max_tokens
        )
    )
    sentences_per_batch = round(len(encoded["input_ids"]) / budget_batches)
    settings = {
        f"token budget {args.max_tokens}": dict(max_tokens=args.max_tokens, batch_size=8),
        f"stock, {sentences_per_batch} sentences": dict(max_tokens=None, batch_size=sentences_per_batch),
    }

    train_once(train_dataset, tokenizer, args.preset, 3, **settings[next(iter(settings))])  # warm-up
    runs = {name: [] for name in settings}
    for _ in range(args.repetitions):
        for name, setting in settings.items():
            runs[name].append(train_once(train_dataset, tokenizer, args.preset, args.steps, **setting))

    rows = {}
    for name, repetitions in runs.items():
        first = repetitions[0]  # the same batches in every repetition (same seed)
        rows[name] = {
            "source_padding_fraction": round(1 - first["source_real"] / first["source_padded"], 4),
            "target_padding_fraction": round(1 - first["target_real"] / first["target_padded"], 4),
            "target_tokens_per_step": round(first["target_real"] / args.steps),
            "target_tokens_per_second": round(statistics.median(r["target_real"] / r["seconds"] for r in repetitions)),
        }
    ours, stock = rows.values()
    speed_up = ours["target_tokens_per_second"] / stock["target_tokens_per_second"]
    print(f"{args.preset} preset, {args.steps} Trainer steps per run, median of {args.repetitions}")
    print(f"{'batches':<26} {'source pad':>10} {'target pad':>10} {'target tok/step':>15} {'target tok/s':>13}")
    for name, row in rows.items():
        print(
            f"{name:<26} {row['source_padding_fraction']:>10.1%} {row['target_padding_fraction']:>10.1%} "
            f"{row['target_tokens_per_step']:>15,} {row['target_tokens_per_second']:>13,}"
        )
    print(f"speed-up of token-budget batches: {speed_up:.2f}x")
    results = {
        "machine": machine(),
        "preset": args.preset,
        "steps": args.steps,
        "repetitions": args.repetitions,
        "settings": rows,
        "speed_up": round(speed_up, 3),
    }
    print("wrote", write_results("trainer_throughput", results, args.preset))


if __name__ == "__main__":
    main()
