"""The stock recipe, for comparison: transformers' MarianMTModel of our "small" size, trained by Seq2SeqTrainer.

    python -m bench stock_marian_translation --data tatoeba-en-zh --source_lang en --target_lang zh

What a transformers user would write without this project, on the same data, machine and time budget as our
recipe: an 8,000-token BPE with the Metaspace pre-tokenizer and NFKC (as SentencePiece's default `nmt_nfkc`,
which Marian's own tokenizers use), MarianMTModel with d_model 256, 3+3 layers, 4 heads, 1,024-wide feed-forward,
scaled and tied embeddings, dropout 0.1; Seq2SeqTrainer with batches of 128 sentences grouped by length, Adam
(0.9, 0.98, 1e-9), no weight decay, the stock gradient clipping (1.0), the `inverse_sqrt` schedule with peak 1e-3
after 400 warmup steps, label smoothing 0.1; training stops after `--minutes`; beam 4 (no length penalty) with room
for 256 tokens. Scored with this project's metric: sacreBLEU tokenized for the target language, and chrF.
Writes bench/results/stock_marian_translation/DATE_<data>.json; the model, its tokenizer, the test translations and
the trainer state (with `--eval_steps`, validation BLEU during training:
bench/recipe/bench_plot_validation_curve.py) go to --output_dir.
"""

import argparse
import json
import os
import time
from itertools import chain

from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    DataCollatorForSeq2Seq,
    MarianMTModel,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from bench.helpers.common import REPO_ROOT, SHARED_DATA, machine, marian_like, write_results
from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.files import write_text_atomically
from hf_vanilla_transformer.training.callbacks import TimeLimitCallback
from hf_vanilla_transformer.training.data import read_translation_file
from hf_vanilla_transformer.training.metrics import load_translation_metric, score_generated

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"  # Marian's order: the decoder starts from <pad>


def metaspace_bpe(sentences, vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS, UNK], show_progress=False)
    tokenizer.train_from_iterator(sentences, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", special_tokens=[(EOS, tokenizer.token_to_id(EOS))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def marian(tokenizer) -> MarianMTModel:
    """Our "small" preset's shape as MarianMTModel, with Marian's own conventions: the decoder starts from <pad>,
    `</s>` is forced at the length limit."""
    config = VanillaTransformerConfig.from_preset(
        "small",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        max_position_embeddings=256,
    )
    return marian_like(config, forced_eos_token_id=tokenizer.eos_token_id)


def validation_bleu(validation: Dataset, references: list[str], tokenizer, metric, target_lang: str):
    """`compute_metrics` for evaluation during training, which transformers 5.24 runs in length-grouped order
    (see below): each prediction is put back in line with its raw reference through its labels (which come back
    padded with -100 and, by Seq2SeqTrainer, with the pad token)."""
    by_labels = {tuple(labels): reference for labels, reference in zip(validation["labels"], references, strict=True)}
    padding = (-100, tokenizer.pad_token_id)

    def compute_metrics(prediction) -> dict:
        labels = [tuple(int(i) for i in row if i not in padding) for row in prediction.label_ids]
        in_order = [by_labels[row] for row in labels]
        _, scores = score_generated(prediction.predictions, tokenizer, in_order, metric, target_language=target_lang)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute_metrics


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="tatoeba-en-zh", help="a folder of ../shared/data")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="zh")
    parser.add_argument("--minutes", type=float, default=24)
    parser.add_argument("--output_dir", default=None, help="default: runs/stock-marian-<data in this direction>")
    parser.add_argument("--limit", type=int, default=None, help="only the first N pairs of each split (a dry run)")
    parser.add_argument("--eval_steps", type=int, default=None, help="validation BLEU every N steps of training")
    args = parser.parse_args()
    # the data folder names one direction (tatoeba-en-zh): the other direction's results are named the other way
    run_name = args.data.replace(f"{args.target_lang}-{args.source_lang}", f"{args.source_lang}-{args.target_lang}")
    output_dir = args.output_dir or os.path.join(REPO_ROOT, "runs", f"stock-marian-{run_name}")
    set_seed(1)
    started = time.monotonic()

    splits = {
        split: list(
            read_translation_file(
                os.path.join(SHARED_DATA, args.data, f"{split}.jsonl"), args.source_lang, args.target_lang
            )
        )[: args.limit]
        for split in ("train", "validation", "test")
    }
    tokenizer = metaspace_bpe(chain.from_iterable(splits["train"]), vocab_size=8000)

    def encoded(pairs):
        sources, targets = zip(*pairs, strict=True)
        features = tokenizer(list(sources), text_target=list(targets), max_length=256, truncation=True)
        return Dataset.from_dict(dict(features))

    model = marian(tokenizer)
    training_args = Seq2SeqTrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=128,
        train_sampling_strategy="group_by_length",
        learning_rate=1e-3,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=400,
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        weight_decay=0.0,
        label_smoothing_factor=0.1,
        max_steps=100_000,
        save_strategy="no",
        eval_strategy="no" if args.eval_steps is None else "steps",
        eval_steps=args.eval_steps,
        logging_steps=50,
        per_device_eval_batch_size=64,
        predict_with_generate=True,
        generation_num_beams=4,
        generation_max_length=256,
        report_to="none",
        use_cpu=True,
        seed=1,
    )
    validation = encoded(splits["validation"])
    metric = load_translation_metric()
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=encoded(splits["train"]),
        eval_dataset=validation,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=validation_bleu(
            validation, [target for _, target in splits["validation"]], tokenizer, metric, args.target_lang
        ),
        callbacks=[TimeLimitCallback(args.minutes)],
    )
    train_result = trainer.train()
    trainer.save_model(output_dir)  # the model and its tokenizer, for bench_ctranslate2's Marian rows
    trainer.save_state()

    # transformers 5.24 evaluates in length-grouped order too when training is (Trainer._get_eval_sampler), which
    # returns the predictions shuffled against the references: evaluate in order, as a careful stock user must.
    trainer.args.train_sampling_strategy = "random"
    trainer.compute_metrics = None  # each split is scored below against its own references
    scores = {}
    for split in ("validation", "test"):
        output = trainer.predict(encoded(splits[split]))
        references = [target for _, target in splits[split]]
        predictions, split_scores = score_generated(
            output.predictions, tokenizer, references, metric, target_language=args.target_lang
        )
        scores[split] = {key: split_scores[key] for key in ("bleu", "chrf", "bleu_signature", "chrf_signature")}
        print(split, scores[split])
        if split == "test":
            write_text_atomically(
                os.path.join(output_dir, "generated_predictions.txt"), "".join(p + "\n" for p in predictions)
            )
    results = {
        "machine": machine(),
        "data": args.data,
        "direction": f"{args.source_lang}-{args.target_lang}",
        "minutes": args.minutes,
        "steps": trainer.state.global_step,
        "epochs": round(trainer.state.epoch, 2),
        "train_runtime": train_result.metrics["train_runtime"],
        "wall_seconds": round(time.monotonic() - started, 1),
        "vocab_size": len(tokenizer),
        **scores,
    }
    print(json.dumps(results, indent=2, ensure_ascii=False))
    print("wrote", write_results("stock_marian_translation", results, run_name.replace("-", "_")))


if __name__ == "__main__":
    main()
