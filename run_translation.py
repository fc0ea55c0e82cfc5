#!/usr/bin/env python
"""Train the Transformer of "Attention Is All You Need" from scratch (or fine-tune one) with Seq2SeqTrainer.

    python run_translation.py recipes/multi30k_small.yaml
    python run_translation.py recipes/multi30k_small.yaml --output_dir runs/mine --max_train_minutes 10
    python run_translation.py --train_file train.jsonl --validation_file dev.jsonl --source_lang en \\
        --target_lang de --preset small --output_dir runs/flags --do_train --do_eval --predict_with_generate

Follows transformers' examples/pytorch/translation/run_translation.py (same flags and output files) and adds the
paper's recipe: a shared BPE vocabulary trained on the data when no --tokenizer_name is given, token-budget
batches (--max_tokens_per_batch), the warmup/inverse-square-root schedule (--lr_scheduler_type inverse_sqrt,
with --learning_rate_scale for Equation 3's constant), label smoothing (--label_smoothing_factor), checkpoint
averaging (--average_last_checkpoints) and beam search with length penalty. A recipe file (.yaml/.json) holds
any of these flags; flags after it override it.
"""

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import transformers
import yaml
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.data import TranslationDataError, load_translation_split
from hf_vanilla_transformer.files import check_output_dir, write_text_atomically
from hf_vanilla_transformer.hub import describe_hardware, push_model_folder, render_model_card
from hf_vanilla_transformer.metrics import load_translation_metric
from hf_vanilla_transformer.tokenizer_training import check_tokenizer_fits_model, train_shared_bpe
from hf_vanilla_transformer.training import (
    TokenBudgetSeq2SeqTrainer,
    checkpoint_folders,
    load_averaged_checkpoints,
    paper_learning_rate,
)

logger = logging.getLogger("run_translation")
PROGRAM = "run_translation.py"


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(default=None, metadata={"help": "A trained model folder to fine-tune."})
    preset: str = field(default="small", metadata={"help": "small, base or big: the model to train from scratch."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "Config attributes for a new model, e.g. 'd_model=256,dropout=0.2'."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "A train_bpe.py folder. Without it a shared BPE is trained on the data."}
    )
    vocab_size: int = field(default=8000, metadata={"help": "Size of the BPE vocabulary trained on the data."})


@dataclass
class DataTrainingArguments:
    source_lang: str = field(default="en", metadata={"help": "Source language key of the translation rows."})
    target_lang: str = field(default="de", metadata={"help": "Target language key of the translation rows."})
    dataset_name: str | None = field(default=None, metadata={"help": "A `datasets` dataset (name or path)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "The dataset's configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Translation JSON lines for training."})
    validation_file: str | None = field(default=None, metadata={"help": "Translation JSON lines for --do_eval."})
    test_file: str | None = field(default=None, metadata={"help": "Translation JSON lines for --do_predict."})
    max_source_length: int | None = field(
        default=None, metadata={"help": "Truncate sources to this many tokens (default: the model's positions)."}
    )
    max_target_length: int | None = field(
        default=None, metadata={"help": "Truncate training targets to this many tokens (default: the positions)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only this many training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only this many validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Use only this many test pairs."})
    num_beams: int | None = field(default=None, metadata={"help": "Beam size for evaluation (default: 4)."})
    dataset_description: str | None = field(
        default=None, metadata={"help": "How the model card names the data, e.g. 'Multi30k (en-de)'."}
    )


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a non-empty --output_dir (transformers 5 removed this flag)."}
    )
    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={"help": "Token budget of a training batch, per process and accumulation step (Section 5.1)."},
    )
    learning_rate_scale: float | None = field(
        default=None,
        metadata={"help": "Set --learning_rate to scale * d_model^-0.5 * warmup_steps^-0.5 (Equation 3)."},
    )
    average_last_checkpoints: int = field(
        default=1, metadata={"help": "Average the weights of the last K checkpoints into the final model."}
    )
    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training (after saving a checkpoint) once this much time has passed."}
    )


class TimeLimitCallback(TrainerCallback):
    """Ends training, with a final checkpoint, once `minutes` of training have passed."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60
        self.start = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.start >= self.seconds:
            control.should_training_stop = True
            control.should_save = args.save_strategy != "no"
        return control


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, DataTrainingArguments, TranslationTrainingArguments]:
    """Flags, or a recipe file (.yaml/.json) followed by flags that override it."""
    if argv and argv[0].endswith((".yaml", ".yml", ".json")):
        argv = [*recipe_flags(argv[0]), *argv[1:]]
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TranslationTrainingArguments))
    return parser.parse_args_into_dataclasses(argv)


def recipe_flags(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as file:
            recipe = json.load(file) if path.endswith(".json") else yaml.safe_load(file)
    except OSError as error:
        raise ValueError(f"{path}: cannot read the recipe ({error.strerror})") from None
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: not a valid recipe ({error})") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"{path}: a recipe is a mapping of flag names to values")
    flags = []
    for name, value in recipe.items():
        values = value if isinstance(value, list) else [value]
        flags += [f"--{name}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
    return flags


def main(argv: list[str] | None = None) -> dict:
    try:
        model_args, data_args, training_args = parse_arguments(sys.argv[1:] if argv is None else argv)
        setup = prepare(model_args, data_args, training_args)
    except (TranslationDataError, ValueError, OSError) as error:
        sys.exit(f"{PROGRAM}: error: {error}")
    return train_and_evaluate(*setup)


def prepare(model_args: ModelArguments, data_args: DataTrainingArguments, training_args: TranslationTrainingArguments):
    """Everything that can fail on bad input, done before anything is written."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity_warning()
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError("nothing to do: give --do_train, --do_eval and/or --do_predict")
    if training_args.resume_from_checkpoint is None:
        check_output_dir(training_args.output_dir, training_args.overwrite_output_dir)
    if model_args.model_name_or_path is None and not training_args.do_train:
        raise ValueError("a new model must be trained: give --do_train or --model_name_or_path")
    set_seed(training_args.seed)

    splits = {}
    for split, wanted, path, limit in (
        ("train", training_args.do_train, data_args.train_file, data_args.max_train_samples),
        ("validation", training_args.do_eval, data_args.validation_file, data_args.max_eval_samples),
        ("test", training_args.do_predict, data_args.test_file, data_args.max_predict_samples),
    ):
        if not wanted:
            continue
        if path is None and data_args.dataset_name is None:
            raise ValueError(f"--{split}_file is needed (or --dataset_name) for the {split} split")
        splits[split] = load_translation_split(
            path, data_args.dataset_name, data_args.dataset_config_name, split,
            data_args.source_lang, data_args.target_lang, limit,
        )  # fmt: skip

    tokenizer = load_or_train_tokenizer(model_args, splits, training_args.resume_from_checkpoint)
    model = load_or_build_model(model_args, tokenizer)
    if model_args.model_name_or_path is not None and model_args.tokenizer_name is not None:
        try:
            check_tokenizer_fits_model(tokenizer, model.config)
        except ValueError as error:
            raise ValueError(
                f"--tokenizer_name {model_args.tokenizer_name} does not fit --model_name_or_path "
                f"{model_args.model_name_or_path}: {error}"
            ) from None
    if training_args.learning_rate_scale is not None:
        if not training_args.warmup_steps or training_args.warmup_steps < 1:
            raise ValueError("--learning_rate_scale needs --warmup_steps as a number of steps (at least 1)")
        training_args.learning_rate = paper_learning_rate(
            model.config.d_model, int(training_args.warmup_steps), training_args.learning_rate_scale
        )
    if data_args.num_beams is not None:
        training_args.generation_num_beams = data_args.num_beams
    if training_args.push_to_hub and not training_args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id (for example your-name/multi30k-en-de)")

    positions = model.config.max_position_embeddings
    for name in ("max_source_length", "max_target_length"):
        value = getattr(data_args, name)
        if value is not None and not 0 < value <= positions:
            raise ValueError(f"--{name} {value} must be between 1 and the model's {positions} positions")
    tokenized = {
        split: tokenize(dataset, tokenizer, data_args.max_source_length or positions,
                        data_args.max_target_length or positions)
        for split, dataset in splits.items()
    }  # fmt: skip
    return model_args, data_args, training_args, tokenizer, model, splits, tokenized


def load_or_train_tokenizer(model_args, splits, resume_from_checkpoint: str | None):
    """The given tokenizer, the fine-tuned model's, the checkpoint's when resuming, or a new shared BPE."""
    source = model_args.tokenizer_name or model_args.model_name_or_path
    if (
        source is None
        and resume_from_checkpoint
        and os.path.isfile(os.path.join(resume_from_checkpoint, "tokenizer.json"))
    ):
        source = resume_from_checkpoint
    if source is not None:
        if not os.path.isdir(source):
            raise ValueError(f"--tokenizer_name {source}: no such folder")
        return AutoTokenizer.from_pretrained(source)
    if "train" not in splits:
        raise ValueError("without --tokenizer_name the vocabulary is trained on the training data: give --do_train")
    logger.info("Training a shared %d-token BPE vocabulary on the training data", model_args.vocab_size)
    train = splits["train"]
    return train_shared_bpe(chain(train["source"], train["target"]), vocab_size=model_args.vocab_size)


def load_or_build_model(model_args, tokenizer):
    if model_args.model_name_or_path is not None:
        return AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path)
    overrides = parse_config_overrides(model_args.config_overrides)
    config = VanillaTransformerConfig.from_preset(
        model_args.preset,
        **{
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "decoder_start_token_id": tokenizer.bos_token_id,
            **overrides,
        },
    )
    return VanillaTransformerForConditionalGeneration(config)


def parse_config_overrides(text: str | None) -> dict:
    """'d_model=256,dropout=0.2,position_embedding_type=learned' -> typed values."""
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        name, separator, value = item.partition("=")
        if not separator or not hasattr(VanillaTransformerConfig(), name.strip()):
            raise ValueError(f"--config_overrides: {item!r} is not NAME=VALUE with a config attribute NAME")
        overrides[name.strip()] = yaml.safe_load(value)
    return overrides


def tokenize(dataset, tokenizer, max_source_length: int, max_target_length: int):
    def encode(batch):
        features = tokenizer(batch["source"], max_length=max_source_length, truncation=True)
        features["labels"] = tokenizer(text_target=batch["target"], max_length=max_target_length, truncation=True)[
            "input_ids"
        ]
        return features

    return dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="Tokenizing")


def bleu_against(references: list[str], tokenizer, metric):
    """compute_metrics for the Trainer: sacreBLEU and chrF of the generated ids against raw references."""

    def compute_metrics(prediction):
        predictions = decode(prediction.predictions, tokenizer)
        scores = metric.compute(predictions=predictions, references=[[r] for r in references[: len(predictions)]])
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute_metrics


def decode(generated, tokenizer) -> list[str]:
    generated = np.where(generated == -100, tokenizer.pad_token_id, generated)
    return [text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True)]


def train_and_evaluate(model_args, data_args, training_args, tokenizer, model, splits, tokenized) -> dict:
    # The Trainer would push every checkpoint and a card of its own; we upload the finished folder once instead.
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    metric = load_translation_metric()
    callbacks = [TimeLimitCallback(training_args.max_train_minutes)] if training_args.max_train_minutes else []
    trainer = TokenBudgetSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized.get("train"),
        eval_dataset=tokenized.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=bleu_against(splits["validation"]["target"], tokenizer, metric)
        if "validation" in splits and training_args.predict_with_generate
        else None,
        callbacks=callbacks,
        max_tokens_per_batch=training_args.max_tokens_per_batch,
    )
    results, card_results, started = {}, {}, time.monotonic()

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        if training_args.average_last_checkpoints > 1:
            average_into(trainer, training_args.average_last_checkpoints)
        trainer.save_model()
        metrics = {**train_result.metrics, "train_samples": len(tokenized["train"])}
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results.update(metrics)

    trainer.compute_metrics = None  # scored below, each split against its own references
    for split, prefix in (("validation", "eval"), ("test", "predict")):
        if split not in splits:
            continue
        references = splits[split]["target"]
        output = trainer.predict(tokenized[split], metric_key_prefix=prefix)
        metrics = dict(output.metrics)
        if training_args.predict_with_generate:
            predictions = decode(output.predictions, tokenizer)
            scores = metric.compute(predictions=predictions, references=[[r] for r in references])
            for key in ("bleu", "chrf", "bleu_signature", "chrf_signature"):
                metrics[f"{prefix}_{key}"] = scores[key]
            card_results[split] = {**scores, "samples": len(references)}
            if split == "test" and trainer.is_world_process_zero():
                write_text_atomically(
                    os.path.join(training_args.output_dir, "generated_predictions.txt"),
                    "".join(p + "\n" for p in predictions),
                )
        metrics[f"{prefix}_samples"] = len(references)
        trainer.log_metrics(prefix, metrics)
        trainer.save_metrics(prefix, metrics)
        results.update(metrics)

    if trainer.is_world_process_zero():
        results["wall_seconds"] = round(time.monotonic() - started, 1)
        write_text_atomically(
            os.path.join(training_args.output_dir, "all_results.json"), json.dumps(results, indent=4, sort_keys=True)
        )
        write_model_card(trainer, data_args, training_args, card_results, results, splits)
        if push_to_hub:
            url = push_model_folder(
                training_args.output_dir,
                training_args.hub_model_id,
                token=training_args.hub_token,
                private=training_args.hub_private_repo,
            )
            logger.info("Uploaded %s", url)
    return results


def average_into(trainer, count: int) -> None:
    """Section 6.1: the final model is the average of the last `count` checkpoints (the final step included)."""
    output_dir = trainer.args.output_dir
    folders = checkpoint_folders(output_dir)
    final = os.path.join(output_dir, f"checkpoint-{trainer.state.global_step}")
    if final not in folders:  # the last step was not a save step
        trainer.save_model(final)
        folders.append(final)
    chosen = folders[-count:]
    if len(chosen) < count:
        logger.warning("Only %d checkpoints to average (asked for %d)", len(chosen), count)
    logger.info("Averaging %s", ", ".join(os.path.basename(folder) for folder in chosen))
    load_averaged_checkpoints(trainer.model, chosen)


def write_model_card(trainer, data_args, training_args, card_results, results, splits) -> None:
    args = training_args
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    scale = f" (Equation 3 × {args.learning_rate_scale:g})" if args.learning_rate_scale is not None else ""
    training = {
        "data": data_args.dataset_description or data_args.dataset_name or data_args.train_file or "—",
        "training pairs": results.get("train_samples", "—"),
        "optimizer": f"Adam (β1={args.adam_beta1}, β2={args.adam_beta2}, ε={args.adam_epsilon})",
        "learning rate": f"{schedule}, peak {args.learning_rate:.3g}{scale}, {args.warmup_steps:g} warmup steps",
        "batches": f"about {args.max_tokens_per_batch} tokens" if args.max_tokens_per_batch else
                   f"{args.per_device_train_batch_size} sentence pairs",
        "gradient accumulation": args.gradient_accumulation_steps,
        "label smoothing": args.label_smoothing_factor,
        "checkpoint averaging": f"last {args.average_last_checkpoints}" if args.average_last_checkpoints > 1
                                else "none",
        "steps": trainer.state.global_step,
        "training time": f"{results['train_runtime'] / 60:.1f} minutes" if "train_runtime" in results else "—",
        "hardware": describe_hardware(),
    }  # fmt: skip
    example = splits["test"]["source"][0] if "test" in splits else "A man is sleeping."
    card = render_model_card(
        trainer.model,
        model_id=args.hub_model_id or os.path.basename(os.path.abspath(args.output_dir)),
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        results=card_results,
        training=training,
        dataset_id=data_args.dataset_name,
        dataset_name=data_args.dataset_description or data_args.dataset_name,
        example_source=example,
    )
    card.save(os.path.join(args.output_dir, "README.md"))


if __name__ == "__main__":
    main()
