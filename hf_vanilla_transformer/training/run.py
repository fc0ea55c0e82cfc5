"""A training run as run_translation.py drives it: read and check everything before anything is written (`prepare`),
then train, average, evaluate and predict (`train_and_evaluate`), leaving a model folder that records what the run
did (`run_record.json`: data, recipe, steps, time, hardware, scores and an example), from which sharing/card.py writes
the model card."""

import copy
import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from itertools import chain

import datasets
import transformers
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import DataCollatorForSeq2Seq, set_seed

from hf_vanilla_transformer.files import check_output_dir, check_output_dir_is_ours, write_text_atomically
from hf_vanilla_transformer.formats import PREDICTIONS_FILE, RUN_RECORD, TOKENIZER_FILE
from hf_vanilla_transformer.hardware import describe_hardware, keep_more_onednn_kernels
from hf_vanilla_transformer.loading import load_model, load_tokenizer
from hf_vanilla_transformer.model.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    paper_generation_config,
)
from hf_vanilla_transformer.training.arguments import (
    DataTrainingArguments,
    ModelArguments,
    TranslationTrainingArguments,
    fold_generation_settings,
    paper_learning_rate,
    parse_config_overrides,
)
from hf_vanilla_transformer.training.checkpoints import checkpoint_to_resume, latest_checkpoint
from hf_vanilla_transformer.training.data import column_values, dataset_fingerprint, load_translation_split
from hf_vanilla_transformer.training.metrics import (
    bleu_and_chrf_against,
    bleu_tokenization,
    load_translation_metric,
    sacrebleu_bleu,
    score_generated,
)
from hf_vanilla_transformer.training.tokenizer import BPEDropoutCollator, check_tokenizer_fits_model, train_shared_bpe
from hf_vanilla_transformer.training.trainer import TranslationTrainer, training_is_over

logger = logging.getLogger("run_translation")

SPLITS = (
    ("train", "train_file", "max_train_samples"),
    ("validation", "validation_file", "max_eval_samples"),
    ("test", "test_file", "max_predict_samples"),
)
METRIC_PREFIXES = {"validation": "eval", "test": "predict"}
# bumped when `tokenize` or the BPE training changes what it makes from the same data, so that no older cache is reused
TOKENS_FORMAT = 1
LATEST = "latest"  # --resume_from_checkpoint latest: the newest complete checkpoint in --output_dir


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
    resume_from: str | None  # the checkpoint --resume_from_checkpoint names (`latest`: the newest), checked


def prepare(model_args, data_args, training_args) -> Run:
    """Everything that can fail on bad input, done before anything is written."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity_warning()
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError("nothing to do: give --do_train, --do_eval and/or --do_predict")
    # a resumed run writes into its folder too: what it must not write is refused whatever the flags
    check_output_dir_is_ours(training_args.output_dir, reads=[model_args.model_name_or_path, model_args.tokenizer_name])
    resume_from = training_args.resume_from_checkpoint
    if resume_from == LATEST:
        # the same command starts a run and restarts it: from the newest complete checkpoint, if there is one
        resume_from = latest_checkpoint(training_args.output_dir)
        logger.info("Resuming from %s", resume_from or "the start: no checkpoint yet")
    elif resume_from is None:
        check_output_dir(training_args.output_dir, training_args.overwrite_output_dir)
    else:
        resume_from = checkpoint_to_resume(resume_from)
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
    sacrebleu_bleu(bleu_tokenization(data_args.target_lang, data_args.bleu_tokenize))  # fails now, not after training
    set_seed(training_args.seed)

    wanted = {"train": training_args.do_train, "validation": training_args.do_eval, "test": training_args.do_predict}
    for split, file_flag, _ in SPLITS:
        if wanted[split] and getattr(data_args, file_flag) is None and data_args.dataset_name is None:
            raise ValueError(f"--{file_flag} is needed (or --dataset_name) for the {split} split")
    # Each machine's first process reads, checks and tokenizes into the data cache; the others then read the cache.
    with training_args.main_process_first(local=True, desc="reading and tokenizing the data"):
        splits = {
            split: load_translation_split(
                getattr(data_args, file_flag),
                data_args.dataset_name,
                data_args.dataset_config_name,
                split,
                data_args.source_lang,
                data_args.target_lang,
                getattr(data_args, limit_flag),
                data_args.cache_dir,
            )
            for split, file_flag, limit_flag in SPLITS
            if wanted[split]
        }
        tokenizer = load_or_train_tokenizer(model_args, data_args, splits, resume_from, training_args.disable_tqdm)
    model = load_or_build_model(model_args, tokenizer, training_attention(model_args, training_args))
    # Section 6.1 chose beam size and alpha on the development set: a recipe may do the same. Every decoding flag
    # goes into the generation config, so that the saved model translates as it was scored.
    fold_generation_settings(
        model, training_args, num_beams=data_args.num_beams, length_penalty=data_args.length_penalty
    )

    positions = model.config.max_position_embeddings
    for name in ("max_source_length", "max_target_length"):
        value = getattr(data_args, name)
        if value is not None and not 0 < value <= positions:
            raise ValueError(f"--{name} {value} must be between 1 and the model's {positions} positions")
    if data_args.max_source_length is not None:
        # saved with the tokenizer, so that the pipeline and vanilla-translate cut sources as training did
        tokenizer.model_max_length = data_args.max_source_length
    with training_args.main_process_first(local=True, desc="tokenizing the data"):
        tokenized = {
            split: tokenize(
                dataset,
                tokenizer,
                *token_limits(data_args, model),
                num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache,
                keep_text=split == "train" and training_args.bpe_dropout > 0,
            )
            for split, dataset in splits.items()
        }
    return Run(model_args, data_args, training_args, tokenizer, model, splits, tokenized, resume_from)


def load_or_train_tokenizer(model_args, data_args, splits, resume_from_checkpoint: str | None, disable_tqdm: bool):
    """The given tokenizer, the fine-tuned model's, the checkpoint's when resuming, or a new shared BPE (cached)."""
    source = model_args.tokenizer_name or model_args.model_name_or_path
    if (
        source is None
        and resume_from_checkpoint
        and os.path.isfile(os.path.join(resume_from_checkpoint, TOKENIZER_FILE))
    ):
        source = resume_from_checkpoint
    if source is not None:
        return load_tokenizer(source)
    if "train" not in splits:
        raise ValueError("without --tokenizer_name the vocabulary is trained on the training data: give --do_train")
    train = splits["train"]
    settings = {
        "vocab_size": model_args.vocab_size,
        "normalization": model_args.normalization,
        "split_han": model_args.split_han,
    }
    fingerprint = dataset_fingerprint(train, TOKENS_FORMAT, settings)
    cached = None
    if fingerprint is not None:
        cached = os.path.join(
            data_args.cache_dir or datasets.config.HF_DATASETS_CACHE, "hf_vanilla_transformer", f"bpe-{fingerprint}"
        )
        if os.path.isdir(cached) and not data_args.overwrite_cache:
            logger.info("Loading the shared BPE vocabulary trained on this data before: %s", cached)
            return load_tokenizer(cached)
    logger.info("Training a shared %d-token BPE vocabulary on the training data", model_args.vocab_size)
    sentences = chain(column_values(train, "source"), column_values(train, "target"))
    progress = tqdm(
        sentences,
        total=2 * len(train),
        desc="Learning the BPE from",
        unit=" sentences",
        disable=disable_tqdm,
    )
    tokenizer = train_shared_bpe(progress, **settings)
    if cached is not None:
        save_tokenizer_atomically(tokenizer, cached)
    return tokenizer


def save_tokenizer_atomically(tokenizer, folder: str) -> None:
    """`tokenizer` saved into `folder` whole or not at all: another process may be reading or writing it."""
    partial = f"{folder}.partial-{os.getpid()}"
    tokenizer.save_pretrained(partial)
    try:
        os.replace(partial, folder)
    except OSError:  # another process wrote it first (a folder is not replaced by a rename)
        shutil.rmtree(partial)


def training_attention(model_args, training_args) -> str | None:
    """--attn_implementation, or eager under bfloat16 autocast on a CPU: there torch's fused attention (sdpa) runs
    its backward in bfloat16 slower than in float32, and a step with eager attention was never slower than sdpa's
    (BENCHMARKS.md, "Training in bfloat16"). None: transformers' default."""
    if model_args.attn_implementation is None and training_args.bf16 and training_args.device.type == "cpu":
        return "eager"
    return model_args.attn_implementation


def load_or_build_model(model_args, tokenizer, attn_implementation: str | None = None):
    if model_args.model_name_or_path is not None:
        model = load_model(model_args.model_name_or_path, "cpu", attn_implementation=attn_implementation)
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
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    model.generation_config = paper_generation_config(config)  # Section 6.1, which --num_beams etc. then change
    return model


def tokenize(
    dataset,
    tokenizer,
    max_source_length: int,
    max_target_length: int,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    keep_text: bool = False,
):
    """`input_ids` and `labels` of a split's pairs, with `datasets.map` into its cache, and the `source` and `target`
    text if `keep_text` (BPE-dropout encodes it again). The cache is named by the split's Arrow files, the
    tokenizer's vocabulary and the lengths, so that a second run on the same data and vocabulary reads it back:
    `datasets` would otherwise hash the tokenizer object, whose state changes as it is used. No attention mask is
    stored: the collator makes it from the padding."""
    vocabulary = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    settings = (vocabulary, max_source_length, max_target_length, keep_text)
    fingerprint = dataset_fingerprint(dataset, TOKENS_FORMAT, *settings)
    lengths = {"max_source_length": max_source_length, "max_target_length": max_target_length}
    return dataset.map(
        encode_pairs,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, **lengths},
        remove_columns=[] if keep_text else dataset.column_names,
        num_proc=num_proc,
        load_from_cache_file=load_from_cache_file,
        new_fingerprint=fingerprint,
        desc="Tokenizing",
    )


def encode_pairs(batch: dict, tokenizer, max_source_length: int, max_target_length: int) -> dict:
    features = tokenizer(batch["source"], max_length=max_source_length, truncation=True, return_attention_mask=False)
    labels = tokenizer(
        text_target=batch["target"], max_length=max_target_length, truncation=True, return_attention_mask=False
    )
    return {"input_ids": features["input_ids"], "labels": labels["input_ids"]}


def token_limits(data_args, model) -> tuple[int, int]:
    """The lengths sources and targets are truncated to: the flags', else the model's positions."""
    positions = model.config.max_position_embeddings
    return data_args.max_source_length or positions, data_args.max_target_length or positions


def trainer_arguments(args: TranslationTrainingArguments) -> TranslationTrainingArguments:
    """The Trainer's copy of a run's arguments, without what the run does itself: the decoding settings, which
    `fold_generation_settings` put into the model's generation config (Seq2SeqTrainer would put --generation_config's
    whole file back in its place, length limits and all), and --push_to_hub (the Trainer would push every checkpoint
    and a card of its own; run_translation.py uploads the finished folder once)."""
    copied = copy.copy(args)
    copied.generation_config = copied.generation_num_beams = copied.generation_max_length = None
    copied.push_to_hub = False
    return copied


def training_collator(run: Run):
    """Pads batches (transformers' seq2seq collator), after encoding training text again under BPE-dropout."""
    multiple = run.training_args.pad_to_multiple_of
    collator = DataCollatorForSeq2Seq(
        run.tokenizer, model=run.model, pad_to_multiple_of=multiple if multiple > 1 else None
    )
    dropout = run.training_args.bpe_dropout
    if not dropout:
        return collator
    return BPEDropoutCollator(run.tokenizer, dropout, collator, *token_limits(run.data_args, run.model))


def train_and_evaluate(run: Run) -> dict:
    """Train (unless only evaluating), save the final model, evaluate and predict; write the results, the test
    predictions and the run's record into the output folder. Returns the results."""
    args, tokenizer, splits = run.training_args, run.tokenizer, run.splits
    keep_more_onednn_kernels()  # before the first bfloat16 product
    metric = load_translation_metric()
    metric_options = {"target_language": run.data_args.target_lang, "bleu_tokenize": run.data_args.bleu_tokenize}
    trainer = TranslationTrainer(
        model=run.model,
        args=trainer_arguments(args),
        train_dataset=run.tokenized.get("train"),
        eval_dataset=run.tokenized.get("validation"),
        processing_class=tokenizer,
        data_collator=training_collator(run),
        compute_metrics=bleu_and_chrf_against(splits["validation"]["target"], tokenizer, metric, **metric_options)
        if "validation" in splits and args.predict_with_generate
        else None,
    )
    results, card_results, started = {}, {}, time.monotonic()
    example = ("A man is sleeping.", "")  # the model card's example, a test sentence and its translation if there are

    state = trainer.state
    if args.do_train:
        checkpoint = run.resume_from
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
                    os.path.join(args.output_dir, PREDICTIONS_FILE), "".join(p + "\n" for p in predictions)
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
        record = run_record(run, trainer, state, card_results, results, example)
        write_text_atomically(
            os.path.join(args.output_dir, RUN_RECORD), json.dumps(record, indent=2, ensure_ascii=False)
        )
    return results


def run_record(run: Run, trainer, state, scores: dict, results: dict, example: tuple[str, str]) -> dict:
    """What the run did, as its model card shows it: the model's name and languages, the data, the recipe and its
    steps, time and hardware, the scores (`scores[split]`: BLEU, chrF, their signatures, the number of sentences) and
    an example, a test sentence and its translation. `state`: the trainer state at the end of training."""
    args, data_args, model = trainer.args, run.data_args, trainer.model  # the trainer's: its learning rate is set
    data = data_args.dataset_description or data_args.dataset_name or data_args.train_file or "—"
    # the training clock's record (TimeLimitCallback): every start of a resumed run, evaluation not counted (the
    # Trainer's train_runtime is this start's wall-clock time alone)
    recorded = [entry["training_seconds"] for entry in state.log_history if "training_seconds" in entry]
    return {
        "model_id": args.output_dir,  # the folder as given, which loads from where the run started; a push renames it
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "dataset_id": data_args.dataset_name,
        "dataset_name": data_args.dataset_description or data_args.dataset_name,
        "training": training_table(
            args,
            model.config.d_model,
            state.global_step,
            training_pairs=results.get("train_samples"),
            training_seconds=recorded[-1] if recorded else results.get("train_runtime"),
            data=data,
        ),
        "scores": scores,
        "example": {"source": example[0], "translation": example[1]},
    }


def training_precision(args) -> str:
    """The arithmetic a run trained in, and what it saved: the weights stay float32 under autocast."""
    mixed = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
    return f"{mixed} autocast, float32 weights (saved in float32)" if mixed else "float32"


def training_table(
    args, d_model: int, steps: int, training_pairs: int | None, training_seconds: float | None, data: str
) -> dict[str, str]:
    """The card's "Training" list, from the run's `TranslationTrainingArguments`."""
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    scale = args.learning_rate_scale
    from_equation_3 = (
        args.warmup_steps >= 1
        and float(args.warmup_steps).is_integer()
        and math.isclose(args.learning_rate, paper_learning_rate(d_model, args.warmup_steps, scale))
    )
    equation = f" (Equation 3 × {scale:g})" if from_equation_3 else ""
    max_tokens = args.max_tokens_per_batch
    averaged = args.average_last_checkpoints
    options = {}  # the variants of the paper's recipe a run used
    if args.ema_decay is not None:
        options["moving average of the weights"] = f"decay {args.ema_decay:g}, the final model"
    if args.bpe_dropout:
        options["BPE-dropout"] = args.bpe_dropout
    return {
        "data": data,
        "training pairs": "—" if training_pairs is None else training_pairs,
        "optimizer": f"Adam (β1={args.adam_beta1}, β2={args.adam_beta2}, ε={args.adam_epsilon})",
        "learning rate": f"{schedule}, peak {args.learning_rate:.3g}{equation}, {args.warmup_steps:g} warmup steps",
        "batches": f"about {max_tokens} tokens" if max_tokens else f"{args.per_device_train_batch_size} sentence pairs",
        "gradient accumulation": args.gradient_accumulation_steps,
        "label smoothing": args.label_smoothing_factor,
        "checkpoint averaging": f"last {averaged}" if averaged > 1 else "none",
        "precision": training_precision(args),
        "steps": steps,
        "training time": "—" if training_seconds is None else f"{training_seconds / 60:.1f} minutes",
        "hardware": describe_hardware(),
    } | options
