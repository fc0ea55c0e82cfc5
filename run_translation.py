#!/usr/bin/env python
"""Train the Transformer of "Attention Is All You Need" from scratch (or fine-tune one) with Seq2SeqTrainer.

    python run_translation.py recipes/multi30k_small.yaml
    python run_translation.py recipes/multi30k_small.yaml --output_dir runs/mine --max_train_minutes 10
    python run_translation.py --train_file train.jsonl --validation_file dev.jsonl --source_lang en \\
        --target_lang de --preset small --output_dir runs/flags --do_train --do_eval --predict_with_generate

Follows transformers' examples/pytorch/translation/run_translation.py (same flags and output files) with the
paper's recipe as the defaults of its training flags (`TranslationTrainingArguments`): a shared BPE vocabulary
trained on the data when no --tokenizer_name is given, token-budget batches (--max_tokens_per_batch), Adam
(0.9, 0.98, 1e-9), the warmup/inverse-square-root schedule of Equation 3 (--warmup_steps, --learning_rate_scale),
label smoothing 0.1, checkpoint averaging (--average_last_checkpoints) and beam search with length penalty. A
recipe file (.yaml/.json) holds any of these flags; flags after it override it. A thin command line over
`hf_vanilla_transformer`: parsing, loading, then the package's trainer, metric and model card.
"""

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from itertools import chain

import transformers
from datasets import Dataset
from huggingface_hub.errors import StrictDataclassError
from transformers import DataCollatorForSeq2Seq, set_seed

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.checkpoints import checkpoint_to_resume, latest_checkpoint
from hf_vanilla_transformer.commands import FlagParser, expand_recipe, flag_name, parse_config_overrides
from hf_vanilla_transformer.data import load_translation_split
from hf_vanilla_transformer.files import check_output_dir, write_text_atomically
from hf_vanilla_transformer.hub import check_hub_login, push_model_folder, render_model_card, training_table
from hf_vanilla_transformer.loading import load_model, load_tokenizer, one_line
from hf_vanilla_transformer.metrics import (
    bleu_and_chrf_against,
    bleu_tokenization,
    load_translation_metric,
    sacrebleu_bleu,
    score_generated,
)
from hf_vanilla_transformer.modeling_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.tokenizer_training import (
    DEFAULT_NORMALIZATION,
    DEFAULT_VOCAB_SIZE,
    Normalization,
    check_tokenizer_fits_model,
    train_shared_bpe,
)
from hf_vanilla_transformer.training import (
    TranslationTrainer,
    TranslationTrainingArguments,
    fold_generation_settings,
    training_is_over,
)
from hf_vanilla_transformer.visualize import write_card_picture

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
    vocab_size: int = field(
        default=DEFAULT_VOCAB_SIZE, metadata={"help": "Size of the BPE vocabulary trained on the data."}
    )
    normalization: Normalization = field(
        default=DEFAULT_NORMALIZATION,
        metadata={"help": "The new BPE's Unicode normal form: NFKC, or NFC to keep full-width punctuation as written."},
    )
    split_han: bool = field(
        default=False, metadata={"help": "The new BPE makes each Han (Chinese) character a token of its own."}
    )


@dataclass
class DataTrainingArguments:
    source_lang: str = field(default="en", metadata={"help": "Source language key of the translation rows."})
    target_lang: str = field(default="de", metadata={"help": "Target language key of the translation rows."})
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "A `datasets` dataset, a Hub name or a local folder: its train, validation and test splits, "
            "each unless given as a file. Rows hold a 'translation' column or a column a language."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The dataset's configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Translation JSON lines for training."})
    validation_file: str | None = field(default=None, metadata={"help": "Translation JSON lines for --do_eval."})
    test_file: str | None = field(default=None, metadata={"help": "Translation JSON lines for --do_predict."})
    max_source_length: int | None = field(
        default=None,
        metadata={
            "help": "Truncate sources to this many tokens, here and in the saved tokenizer (model_max_length; "
            "default: the model's positions)."
        },
    )
    max_target_length: int | None = field(
        default=None, metadata={"help": "Truncate training targets to this many tokens (default: the positions)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only this many training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only this many validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Use only this many test pairs."})
    num_beams: int | None = field(
        default=None,
        metadata={
            "help": "Beam size, written into the model's generation config: evaluation and the saved model "
            "decode with it (default: the model's, for a new model the paper's 4)."
        },
    )
    length_penalty: float | None = field(
        default=None,
        metadata={
            "help": "Beam search's length penalty alpha, written into the model's generation config as "
            "--num_beams is (default: the model's, for a new model the paper's 0.6)."
        },
    )
    bleu_tokenize: str | None = field(
        default=None,
        metadata={"help": "sacreBLEU's tokenization for BLEU (default: by --target_lang, 'zh' for zh, else '13a')."},
    )
    dataset_description: str | None = field(
        default=None, metadata={"help": "How the model card names the data, e.g. 'Multi30k (en-de)'."}
    )


ARGUMENT_CLASSES = (ModelArguments, DataTrainingArguments, TranslationTrainingArguments)
SPLITS = (("train", "train_file", "max_train_samples"), ("validation", "validation_file", "max_eval_samples"),
          ("test", "test_file", "max_predict_samples"))  # fmt: skip
METRIC_PREFIXES = {"validation": "eval", "test": "predict"}
# A split is read from its file when one is given, else from --dataset_name: a --dataset_name given after a recipe
# replaces the recipe's files, so that `recipe.yaml --dataset_name bentrevett/multi30k` trains on the Hub's copy.
REPLACED_AFTER_A_RECIPE = {"dataset_name": [file_flag for _, file_flag, _ in SPLITS]}
LATEST = "latest"  # --resume_from_checkpoint latest: the newest complete checkpoint in --output_dir
# Flags of transformers' examples/pytorch/translation/run_translation.py that this script does not take, and why
STOCK_FLAGS_NOT_TAKEN = {
    "source_prefix": "a task prefix tells a multi-task model (T5) what to do; this model learns one direction",
    "forced_bos_token": "it names the target language of a multilingual model (mBART, M2M100)",
    "val_max_target_length": "give --generation_max_length, which evaluation and the saved model decode with",
    "pad_to_max_length": "batches are padded to their longest sentence",
    "ignore_pad_token_for_loss": "padding never counts in the loss",
    "overwrite_cache": "nothing is cached: the data is read into memory",
    "preprocessing_num_workers": "tokenizing runs in the tokenizers library's own threads",
    "config_name": "a new model's config is --preset with --config_overrides",
    "cache_dir": "set HF_HOME",
    "model_revision": "give --model_name_or_path a folder",
    "use_fast_tokenizer": "the tokenizer is always the fast one",
    "token": "give --hub_token",
    "trust_remote_code": "a model folder's own code is never run: this package loads its models",
}


@dataclass
class Run:
    """What `prepare` checked and loaded, before anything is written."""

    model_args: ModelArguments
    data_args: DataTrainingArguments
    training_args: TranslationTrainingArguments
    tokenizer: transformers.PreTrainedTokenizerBase
    model: transformers.PreTrainedModel
    splits: dict[str, Dataset]  # raw `source` / `target` sentences
    tokenized: dict[str, Dataset]  # `input_ids` / `labels`


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, DataTrainingArguments, TranslationTrainingArguments]:
    """Flags, or a recipe file (.yaml/.json) followed by flags that override it. A bare `--resume_from_checkpoint`
    means `--resume_from_checkpoint latest`."""
    argv = expand_recipe(argv, REPLACED_AFTER_A_RECIPE)
    for flag in argv:
        name = flag_name(flag)
        if flag.startswith("--") and name in STOCK_FLAGS_NOT_TAKEN:
            raise ValueError(
                f"--{name} (a flag of transformers' example) is not taken here: {STOCK_FLAGS_NOT_TAKEN[name]}"
            )
    for index, flag in enumerate(argv):
        if flag == "--resume_from_checkpoint" and (index + 1 == len(argv) or argv[index + 1].startswith("--")):
            argv = [*argv[: index + 1], LATEST, *argv[index + 1 :]]
            break
    return FlagParser(ARGUMENT_CLASSES).parse_args_into_dataclasses(argv)


def main(argv: list[str] | None = None) -> dict:
    try:
        run = prepare(*parse_arguments(sys.argv[1:] if argv is None else argv))
    except (ValueError, OSError, ImportError, StrictDataclassError) as error:
        sys.exit(f"{PROGRAM}: error: {one_line(error)}")  # a StrictDataclassError (a config field) takes two lines
    return train_and_evaluate(run)


def prepare(model_args, data_args, training_args) -> Run:
    """Everything that can fail on bad input, done before anything is written."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity_warning()
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError("nothing to do: give --do_train, --do_eval and/or --do_predict")
    if training_args.resume_from_checkpoint == LATEST:
        # the same command starts a run and restarts it: from the newest complete checkpoint, if there is one
        training_args.resume_from_checkpoint = latest_checkpoint(training_args.output_dir)
        logger.info("Resuming from %s", training_args.resume_from_checkpoint or "the start: no checkpoint yet")
    elif training_args.resume_from_checkpoint is None:
        check_output_dir(training_args.output_dir, training_args.overwrite_output_dir)
    else:
        training_args.resume_from_checkpoint = checkpoint_to_resume(training_args.resume_from_checkpoint)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and training_args.world_size == 1:  # each would train alone and overwrite the others' files
        raise ValueError(
            f"started as one of {launched} processes (WORLD_SIZE={launched}) that did not join one distributed run; "
            "without a GPU, give --use_cpu true"
        )
    if model_args.model_name_or_path is None and not training_args.do_train:
        raise ValueError("a new model must be trained: give --do_train or --model_name_or_path")
    if training_args.push_to_hub and not training_args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id (for example your-name/multi30k-en-de)")
    if training_args.push_to_hub:
        check_hub_login(training_args.hub_token)  # now, not after training
    sacrebleu_bleu(bleu_tokenization(data_args.target_lang, data_args.bleu_tokenize))  # fails now, not after training
    set_seed(training_args.seed)

    splits = {}
    wanted = {"train": training_args.do_train, "validation": training_args.do_eval, "test": training_args.do_predict}
    for split, file_flag, limit_flag in SPLITS:
        if not wanted[split]:
            continue
        path = getattr(data_args, file_flag)
        if path is None and data_args.dataset_name is None:
            raise ValueError(f"--{file_flag} is needed (or --dataset_name) for the {split} split")
        splits[split] = load_translation_split(
            path, data_args.dataset_name, data_args.dataset_config_name, split,
            data_args.source_lang, data_args.target_lang, getattr(data_args, limit_flag),
        )  # fmt: skip

    tokenizer = load_or_train_tokenizer(model_args, splits, training_args.resume_from_checkpoint)
    model = load_or_build_model(model_args, tokenizer)
    # Section 6.1 chose beam size and alpha on the development set: a recipe may do the same. Every decoding flag
    # goes into the generation config, so that the saved model translates as it was scored.
    fold_generation_settings(model, training_args, num_beams=data_args.num_beams,
                             length_penalty=data_args.length_penalty)  # fmt: skip

    positions = model.config.max_position_embeddings
    for name in ("max_source_length", "max_target_length"):
        value = getattr(data_args, name)
        if value is not None and not 0 < value <= positions:
            raise ValueError(f"--{name} {value} must be between 1 and the model's {positions} positions")
    if data_args.max_source_length is not None:
        # saved with the tokenizer, so that the pipeline and vanilla-translate cut sources as training did
        tokenizer.model_max_length = data_args.max_source_length
    tokenized = {
        split: tokenize(dataset, tokenizer, data_args.max_source_length or positions,
                        data_args.max_target_length or positions)
        for split, dataset in splits.items()
    }  # fmt: skip
    return Run(model_args, data_args, training_args, tokenizer, model, splits, tokenized)


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
        return load_tokenizer(source)
    if "train" not in splits:
        raise ValueError("without --tokenizer_name the vocabulary is trained on the training data: give --do_train")
    logger.info("Training a shared %d-token BPE vocabulary on the training data", model_args.vocab_size)
    train = splits["train"]
    return train_shared_bpe(
        chain(train["source"], train["target"]),
        vocab_size=model_args.vocab_size,
        normalization=model_args.normalization,
        split_han=model_args.split_han,
    )


def load_or_build_model(model_args, tokenizer):
    if model_args.model_name_or_path is not None:
        model = load_model(model_args.model_name_or_path, "cpu")
        if model_args.tokenizer_name is not None:
            try:
                check_tokenizer_fits_model(tokenizer, model.config)
            except ValueError as error:
                raise ValueError(
                    f"--tokenizer_name {model_args.tokenizer_name} does not fit --model_name_or_path "
                    f"{model_args.model_name_or_path}: {error}"
                ) from None
        return model
    config = VanillaTransformerConfig.from_preset(
        model_args.preset,
        **{
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "decoder_start_token_id": tokenizer.bos_token_id,
            **parse_config_overrides(model_args.config_overrides),
        },
    )
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config = paper_generation_config(config)  # Section 6.1, which --num_beams etc. then change
    return model


def tokenize(dataset, tokenizer, max_source_length: int, max_target_length: int):
    def encode(batch):
        features = tokenizer(batch["source"], max_length=max_source_length, truncation=True)
        features["labels"] = tokenizer(text_target=batch["target"], max_length=max_target_length, truncation=True)[
            "input_ids"
        ]
        return features

    return dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="Tokenizing")


def train_and_evaluate(run: Run) -> dict:
    args, tokenizer, splits = run.training_args, run.tokenizer, run.splits
    # The Trainer would push every checkpoint and a card of its own; we upload the finished folder once instead.
    push_to_hub, args.push_to_hub = args.push_to_hub, False
    metric = load_translation_metric()
    metric_options = {"target_language": run.data_args.target_lang, "bleu_tokenize": run.data_args.bleu_tokenize}
    trainer = TranslationTrainer(
        model=run.model,
        args=args,
        train_dataset=run.tokenized.get("train"),
        eval_dataset=run.tokenized.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=run.model),
        compute_metrics=bleu_and_chrf_against(splits["validation"]["target"], tokenizer, metric, **metric_options)
        if "validation" in splits and args.predict_with_generate
        else None,
    )
    results, card_results, started = {}, {}, time.monotonic()
    example = ("A man is sleeping.", "")  # the model card's example, a test sentence and its translation if there are

    state = trainer.state
    if args.do_train:
        checkpoint = args.resume_from_checkpoint
        if checkpoint is not None and training_is_over(checkpoint, args):
            # a run stopped after its training (while averaging, saving or deleting): straight to the final model
            logger.info("Training is over at %s: nothing more to train", checkpoint)
            state = trainer.save_final_model(finished_checkpoint=checkpoint)
            metrics = {"epoch": state.epoch}  # of this start, which trained nothing
        else:
            metrics = trainer.train(resume_from_checkpoint=checkpoint).metrics
            state = trainer.save_final_model()
        metrics["train_samples"] = len(run.tokenized["train"])
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        results.update(metrics)

    trainer.compute_metrics = None  # scored below, each split against its own references
    for split, prefix in METRIC_PREFIXES.items():
        if split not in splits:
            continue
        references = splits[split]["target"]
        output = trainer.predict(run.tokenized[split], metric_key_prefix=prefix)
        metrics = dict(output.metrics)
        if args.predict_with_generate:
            predictions, scores = score_generated(output.predictions, tokenizer, references, metric, **metric_options)
            for key in ("bleu", "chrf", "bleu_signature", "chrf_signature"):
                metrics[f"{prefix}_{key}"] = scores[key]
            card_results[split] = {**scores, "samples": len(references)}
            if split == "test":
                example = (splits["test"]["source"][0], predictions[0])
            if split == "test" and trainer.is_world_process_zero():
                write_text_atomically(
                    os.path.join(args.output_dir, "generated_predictions.txt"), "".join(p + "\n" for p in predictions)
                )
        metrics[f"{prefix}_samples"] = len(references)
        trainer.log_metrics(prefix, metrics)
        trainer.save_metrics(prefix, metrics)
        results.update(metrics)

    if trainer.is_world_process_zero():
        results["wall_seconds"] = round(time.monotonic() - started, 1)
        write_text_atomically(
            os.path.join(args.output_dir, "all_results.json"), json.dumps(results, indent=4, sort_keys=True)
        )
        write_model_card(trainer, state, run, card_results, results, example)
        if push_to_hub:
            url = push_model_folder(args.output_dir, args.hub_model_id, token=args.hub_token,
                                    private=args.hub_private_repo)  # fmt: skip
            logger.info("Uploaded %s", url)
    return results


def write_model_card(trainer, state, run: Run, card_results: dict, results: dict, example: tuple[str, str]) -> None:
    """The run folder's README.md; `state`: the trainer state of the training's end."""
    args, data_args = run.training_args, run.data_args
    data = data_args.dataset_description or data_args.dataset_name or data_args.train_file or "—"
    # the training clock's record (TimeLimitCallback): every start of a resumed run, evaluation not counted (the
    # Trainer's train_runtime is this start's wall-clock time alone)
    recorded = [entry["training_seconds"] for entry in state.log_history if "training_seconds" in entry]
    training = training_table(
        args,
        trainer.model.config.d_model,
        state.global_step,
        training_pairs=results.get("train_samples"),
        training_seconds=recorded[-1] if recorded else results.get("train_runtime"),
        data=data,
    )
    picture = write_card_picture(trainer.model, run.tokenizer, example[0], args.output_dir)
    card = render_model_card(
        trainer.model,
        model_id=args.output_dir,  # the folder as given, which loads from where the run started; a push renames it
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        results=card_results,
        training=training,
        dataset_id=data_args.dataset_name,
        dataset_name=data_args.dataset_description or data_args.dataset_name,
        example_source=example[0],
        example_translation=example[1],
        attention_picture=picture and os.path.basename(picture),
    )
    write_text_atomically(os.path.join(args.output_dir, "README.md"), str(card))


if __name__ == "__main__":
    main()
