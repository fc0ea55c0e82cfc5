"""transformers' stock example's data path, for bench_big_data.py to run side by side with ours: the way
examples/pytorch/translation/run_translation.py reads and tokenizes (`load_dataset("json")`, then `map` with the
tokenizer, in `main_process_first`), then its padded batches through `Seq2SeqTrainer` for a few steps. The model and
tokenizer are ours (the stock example needs a trained tokenizer: give it the BPE our run trained).

    python -m bench.helpers.stock_data_path --train_file big.jsonl --tokenizer_name BPE_FOLDER --cache_dir CACHE \\
        --output_dir OUT --max_steps 2
"""

import argparse

from datasets import load_dataset
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("--train_file", "--tokenizer_name", "--cache_dir", "--output_dir"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--max_steps", type=int, default=2)
    parser.add_argument("--preprocessing_num_workers", type=int, default=None)
    args = parser.parse_args()
    training_args = Seq2SeqTrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, use_cpu=True, report_to="none", save_strategy="no"
    )
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name)
    raw = load_dataset("json", data_files={"train": args.train_file}, cache_dir=args.cache_dir)["train"]

    def preprocess_function(examples):  # the example's, less its prefix and padding options
        inputs = [example[args.source_lang] for example in examples["translation"]]
        targets = [example[args.target_lang] for example in examples["translation"]]
        model_inputs = tokenizer(inputs, max_length=1024, truncation=True)
        labels = tokenizer(text_target=targets, max_length=1024, truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    with training_args.main_process_first(desc="train dataset map pre-processing"):
        train_dataset = raw.map(
            preprocess_function,
            batched=True,
            num_proc=args.preprocessing_num_workers,
            remove_columns=raw.column_names,
            desc="Running tokenizer on train dataset",
        )
    config = VanillaTransformerConfig.from_preset(args.preset, vocab_size=len(tokenizer))
    model = VanillaTransformerForConditionalGeneration(config)
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
    )
    trainer.train()


if __name__ == "__main__":
    main()
