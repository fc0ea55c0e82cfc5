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
recipe file (.yaml/.json) holds any of these flags; flags after it override it. The command line: flags, then
the run (training/run.py), the model card from what the run recorded (sharing/card.py) and the push (sharing/hub.py).
"""

import logging
import sys

from huggingface_hub.errors import StrictDataclassError

from hf_vanilla_transformer.cli.flags import FlagParser, expand_recipe, flag_name
from hf_vanilla_transformer.errors import exit_refused, one_line
from hf_vanilla_transformer.files import OutputDirRefused
from hf_vanilla_transformer.sharing.card import write_model_card
from hf_vanilla_transformer.sharing.hub import check_hub_login, push_model_folder
from hf_vanilla_transformer.training.arguments import (
    DataTrainingArguments,
    ModelArguments,
    TranslationTrainingArguments,
)
from hf_vanilla_transformer.training.run import LATEST, SPLITS, prepare, train_and_evaluate

logger = logging.getLogger("run_translation")
PROGRAM = "run_translation.py"


ARGUMENT_CLASSES = (ModelArguments, DataTrainingArguments, TranslationTrainingArguments)
# A split is read from its file when one is given, else from --dataset_name: a --dataset_name given after a recipe
# replaces the recipe's files, so that `recipe.yaml --dataset_name bentrevett/multi30k` trains on the Hub's copy, and
# a file given after a recipe replaces the recipe's dataset, so that `wmt14_en_de_base.yaml --train_file F` trains the
# recipe's settings on F.
REPLACED_AFTER_A_RECIPE = {
    "dataset_name": [file_flag for _, file_flag, _ in SPLITS],
    **{file_flag: ["dataset_name", "dataset_config_name"] for _, file_flag, _ in SPLITS},
}
# Flags of transformers' examples/pytorch/translation/run_translation.py that this script does not take, and why
STOCK_FLAGS_NOT_TAKEN = {
    "source_prefix": "a task prefix tells a multi-task model (T5) what to do; this model learns one direction",
    "forced_bos_token": "it names the target language of a multilingual model (mBART, M2M100)",
    "val_max_target_length": "give --generation_max_length, which evaluation and the saved model decode with",
    "pad_to_max_length": "batches are padded to their longest sentence",
    "ignore_pad_token_for_loss": "padding never counts in the loss",
    "config_name": "a new model's config is --preset with --config_overrides",
    "model_revision": "give --model_name_or_path a folder",
    "use_fast_tokenizer": "the tokenizer is always the fast one",
    "token": "give --hub_token",
    "trust_remote_code": "a model folder's own code is never run: this package loads its models",
}


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
        model_args, data_args, training_args = parse_arguments(sys.argv[1:] if argv is None else argv)
        if training_args.push_to_hub:
            check_hub_login(training_args.hub_token)  # now, not after training
        run = prepare(model_args, data_args, training_args)
    except OutputDirRefused as error:
        exit_refused(PROGRAM, error)
    except (ValueError, OSError, ImportError, StrictDataclassError) as error:
        sys.exit(f"{PROGRAM}: error: {one_line(error)}")  # a StrictDataclassError (a config field) takes two lines
    results = train_and_evaluate(run)
    if training_args.should_save:  # the main process
        write_model_card(training_args.output_dir, run.model, run.tokenizer)
        if training_args.push_to_hub:  # the finished folder, once (the Trainer's copy of the arguments has it off)
            url = push_model_folder(
                training_args.output_dir,
                training_args.hub_model_id,
                token=training_args.hub_token,
                private=training_args.hub_private_repo,
            )
            logger.info("Uploaded %s", url)
    return results


if __name__ == "__main__":
    main()
