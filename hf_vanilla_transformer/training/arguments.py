"""The paper's training settings (Sections 5.3, 5.4, 6.1) as `Seq2SeqTrainingArguments` defaults, written once here;
recipes, benchmarks and tests read them from it.

- Schedule (Section 5.3, Equation 3): lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5). That is
  transformers' `inverse_sqrt` schedule, lr * min(step / warmup, sqrt(warmup / step)), with the peak
  lr = d_model^-0.5 * warmup^-0.5 (`paper_learning_rate`), so we use it as it is.
- Label smoothing (Section 5.4) is the Trainer's own `label_smoothing_factor`.
- Decoding (Section 6.1): one generation config for evaluation and for the saved model
  (`fold_generation_settings`), so that a saved model translates as it was scored.
"""

import copy
import logging
from dataclasses import dataclass, field

import yaml
from transformers import (
    GenerationConfig,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.trainer_utils import SchedulerType

from hf_vanilla_transformer.hardware import cpu_has_bf16_units
from hf_vanilla_transformer.model.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.training.tokenizer import DEFAULT_NORMALIZATION, DEFAULT_VOCAB_SIZE, Normalization

logger = logging.getLogger(__name__)


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` whose defaults are the paper's recipe, plus the settings the recipe adds.

    Section 5.3: Adam with beta1 = 0.9 (transformers' default too), beta2 = 0.98, epsilon = 1e-9, and the learning
    rate of Equation 3 — transformers' `inverse_sqrt` schedule over 4,000 warmup steps, whose peak is
    `learning_rate_scale` * d_model^-0.5 * warmup_steps^-0.5 unless `learning_rate` is given. Section 5.4: label
    smoothing 0.1. The paper names no weight decay (transformers' default is none) and no gradient clipping.
    """

    adam_beta2: float = field(default=0.98, metadata={"help": "Adam's beta2 (Section 5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam's epsilon (Section 5.3: 1e-9)."})
    lr_scheduler_type: SchedulerType | str = field(
        default="inverse_sqrt", metadata={"help": "The schedule; inverse_sqrt is Equation 3's."}
    )
    warmup_steps: float = field(default=4000, metadata={"help": "Warmup steps of Equation 3 (Section 5.3: 4000)."})
    learning_rate: float | None = field(
        default=None,
        metadata={"help": "Peak learning rate (default: learning_rate_scale * d_model^-0.5 * warmup_steps^-0.5)."},
    )
    learning_rate_scale: float = field(
        default=1.0, metadata={"help": "Multiplies Equation 3 when learning_rate is not given (the paper: 1)."}
    )
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "Label smoothing (Section 5.4: 0.1)."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping norm; 0: none, as in the paper."})
    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={"help": "Token budget of a training batch, per process and accumulation step (Section 5.1)."},
    )
    pad_to_multiple_of: int = field(
        default=1,
        metadata={
            "help": "Pad each training batch's lengths up to a multiple of this (8 or 64 on a GPU: fewer distinct "
            "shapes, aligned for its matrix units), counted in --max_tokens_per_batch. 1: no rounding."
        },
    )
    bpe_dropout: float = field(
        default=0.0,
        metadata={
            "help": "BPE-dropout: each merge is skipped with this probability when a training batch is encoded, "
            "so a word's segmentation varies from epoch to epoch; evaluation and the saved tokenizer segment as "
            "trained. 0: off, as in the paper. Needs --max_tokens_per_batch."
        },
    )
    average_last_checkpoints: int = field(
        default=1, metadata={"help": "Average the weights of the last K checkpoints into the final model (6.1)."}
    )
    ema_decay: float | None = field(
        default=None,
        metadata={
            "help": "Keep an exponential moving average of the weights, updated after every step with this decay "
            "(e.g. 0.999), saved in each checkpoint, and make it the final model instead of an average of "
            "checkpoints (--average_last_checkpoints must be 1). Default: none (Section 6.1 averages checkpoints)."
        },
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Stop training (after saving a checkpoint) once this much training time has passed "
            "(evaluation during training does not count)."
        },
    )
    keep_checkpoints: bool = field(
        default=False,
        metadata={
            "help": "Keep every checkpoint once the final model is saved (default: only the last, which a "
            "resumed run or a longer budget starts from)."
        },
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a non-empty output_dir (transformers 5 removed this setting)."}
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={
            "help": "Every parameter takes part in every step; transformers' default (True) would make DDP "
            "walk the autograd graph once more each step."
        },
    )
    # transformers' --bf16 with a third value, None: decided by the hardware. argparse takes `nargs` and `const`
    # from the metadata (HfArgumentParser gives a bool field without a default no bare `--bf16`)
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "Train under bfloat16 autocast. Default: on where a run trains under --use_cpu on a CPU "
            "with bfloat16 units (AVX512-BF16 or AMX), where a step runs faster; off elsewhere (float32; on "
            "a GPU, give --bf16 true).",
            "nargs": "?",
            "const": True,
        },
    )

    def __post_init__(self):
        if self.bf16 is None:
            self.bf16 = bf16_by_default(self.use_cpu, self.fp16)
        super().__post_init__()
        averaged, kept = self.average_last_checkpoints, self.save_total_limit
        if averaged < 1:
            raise ValueError(f"--average_last_checkpoints {averaged} must be at least 1")
        if averaged > 1 and self.save_strategy == "no":
            raise ValueError(f"--average_last_checkpoints {averaged} needs checkpoints, and --save_strategy is 'no'")
        if kept and averaged > kept:
            raise ValueError(
                f"--average_last_checkpoints {averaged} is more than the --save_total_limit {kept} checkpoints kept"
            )
        if self.ema_decay is not None:
            if not 0 < self.ema_decay < 1:
                raise ValueError(f"--ema_decay {self.ema_decay} must be above 0 and below 1")
            if averaged > 1:
                message = f"--ema_decay and --average_last_checkpoints {averaged}: the final model is one or the other"
                raise ValueError(message)
            if self.save_strategy == "no":
                raise ValueError("--ema_decay needs checkpoints, which carry the average, and --save_strategy is 'no'")
        if self.pad_to_multiple_of < 1:
            raise ValueError(f"--pad_to_multiple_of {self.pad_to_multiple_of} must be at least 1")
        if not 0 <= self.bpe_dropout < 1:
            raise ValueError(f"--bpe_dropout {self.bpe_dropout} must be at least 0 and below 1")
        if self.bpe_dropout and self.max_tokens_per_batch is None:
            raise ValueError("--bpe_dropout needs --max_tokens_per_batch, whose batches it encodes as they are taken")
        if self.max_tokens_per_batch is not None and self.train_sampling_strategy != "random":
            raise ValueError(
                f"--train_sampling_strategy {self.train_sampling_strategy!r} has no effect with "
                "--max_tokens_per_batch, whose batches are grouped by length and shuffled"
            )


def bf16_by_default(use_cpu: bool, fp16: bool) -> bool:
    """Whether a run trains under bfloat16 autocast when --bf16 is not given: where it trains on the CPU by
    --use_cpu (transformers accepts bf16 without a GPU only then; every CPU recipe gives it) and the CPU has
    bfloat16 units. There a training step runs faster than in float32 (BENCHMARKS.md, "Training in bfloat16 on a
    CPU with bf16 units"); on CPUs without the units bfloat16 is slower than float32."""
    return use_cpu and not fp16 and cpu_has_bf16_units()


# The settings that only one way of decoding reads: GenerationConfig.validate (transformers 5.24) refuses to save a
# config that holds them for another (the paper's length penalty with greedy decoding, a temperature without sampling).
BEAM_SEARCH_ONLY = ("length_penalty", "early_stopping")
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff")


def fold_generation_settings(model, args: Seq2SeqTrainingArguments, **settings) -> GenerationConfig:
    """Write a run's decoding settings into `model.generation_config`, which evaluation then uses and the model is
    saved with, and return it: the Trainer's `args.generation_config` (a generation config file or folder: the
    settings it holds; transformers would replace the model's whole config, its length limits included),
    `args.generation_num_beams` and `args.generation_max_length` (transformers passes those to each evaluation's
    `generate()` only, so a model saved by a run decoded unlike the run's scores), then `settings` (e.g.
    `num_beams`, `length_penalty`; `None` values are not given). `args` stays as given: the Trainer gets a copy
    without the three (`run.trainer_arguments`).

    A setting that the resulting decoding ignores (see `BEAM_SEARCH_ONLY`, `SAMPLING_ONLY`) goes back to
    transformers' default when it came from the model, and is an error naming it when it was given.
    """
    config = copy.deepcopy(model.generation_config)
    given = {}
    if args.generation_config is not None:
        given.update(Seq2SeqTrainer.load_generation_config(args.generation_config).to_diff_dict())
        given.pop("transformers_version", None)
    for settings_in_order in (
        {"num_beams": args.generation_num_beams, "max_length": args.generation_max_length},
        settings,
    ):
        given.update({name: value for name, value in settings_in_order.items() if value is not None})
    config.update(**given)
    if config.num_beams is not None and config.num_beams < 1:
        raise ValueError(f"num_beams={config.num_beams} must be at least 1")
    greedy_or_sampling = (config.num_beams or 1) == 1
    ignored = (BEAM_SEARCH_ONLY if greedy_or_sampling else ()) + (() if config.do_sample else SAMPLING_ONLY)
    for name in ignored:
        if name in given:
            mode = "greedy decoding or sampling (num_beams=1)" if name in BEAM_SEARCH_ONLY else "do_sample=False"
            raise ValueError(f"{name}={given[name]!r} has no effect with {mode}: leave it out")
        setattr(config, name, None)
    config.validate(strict=True)
    model.generation_config = config
    return config


def paper_learning_rate(d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """The peak of Equation 3, scale * d_model^-0.5 * warmup^-0.5, reached at step `warmup_steps`."""
    if warmup_steps < 1 or warmup_steps != int(warmup_steps):
        raise ValueError(f"warmup_steps {warmup_steps} must be a whole number of steps, at least 1, for Equation 3")
    return scale * d_model**-0.5 * int(warmup_steps) ** -0.5


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
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention to train and evaluate with: eager, sdpa or flex_attention (the saved model does "
            "not keep it). Default: eager under --bf16 on a CPU, where torch's fused attention backward is "
            "slow in bfloat16; elsewhere transformers' default, sdpa."
        },
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
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where the data read, its BPE vocabulary and its tokens are cached as Arrow files, for the "
            "next run on the same files to reuse (default: datasets' cache, HF_DATASETS_CACHE)."
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that tokenize the data (default: one, in the tokenizers' threads)."}
    )
    overwrite_cache: bool = field(
        default=False, metadata={"help": "Build the vocabulary and the tokenized data again, ignoring their cache."}
    )


def parse_config_overrides(config_overrides: str | None) -> dict:
    """'d_model=256,dropout=0.2,position_embedding_type=learned' -> {"d_model": 256, "dropout": 0.2, ...}.

    Values are read as YAML scalars (numbers, true/false, null, strings; 1e-2 is a number too, which YAML 1.1
    would read as a string). transformers' own
    `PretrainedConfig.update_from_string` cannot set attributes whose default is None (`head_dim`) and sets them
    after the config is built, past its validation; these overrides go to the constructor instead.
    """
    overrides = {}
    for item in filter(None, (config_overrides or "").split(",")):
        name, separator, value = item.partition("=")
        if not separator or not hasattr(VanillaTransformerConfig(), name.strip()):
            raise ValueError(f"config_overrides: {item!r} is not NAME=VALUE with a config attribute NAME")
        overrides[name.strip()] = scalar(value)
    return overrides


def scalar(text: str):
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)  # exponent forms that YAML 1.1 leaves as strings: 1e-2, 5E3
        except ValueError:
            return value
    return value
