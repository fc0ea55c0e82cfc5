"""The training runs the slow tier shares (trained on ../shared/data), and what they are checked with."""

import re
from dataclasses import dataclass, field
from pathlib import Path

from support.paths import TATOEBA_EN_ZH, TEST, TRAIN, VALIDATION

# a run on the CPU that reports to no tracker and draws no progress bar
QUIET_CPU = ["--report_to", "none", "--use_cpu", "true", "--disable_tqdm", "true"]

# a 2+2-layer d_model 64 model, trained, evaluated and used for prediction in seconds
TINY_MODEL_RUN = [
    "--preset",
    "small",
    "--config_overrides",
    "d_model=64,encoder_ffn_dim=128,decoder_ffn_dim=128,encoder_layers=2,decoder_layers=2",
    "--do_train",
    "--do_eval",
    "--do_predict",
    "--predict_with_generate",
    "--max_tokens_per_batch",
    "1500",
    "--per_device_eval_batch_size",
    "32",
    *QUIET_CPU,
    "--seed",
    "0",
]


TINY_RUN = [
    *TINY_MODEL_RUN,
    "--train_file",
    TRAIN,
    "--validation_file",
    VALIDATION,
    "--test_file",
    TEST,
    "--max_train_samples",
    "3000",
    "--max_eval_samples",
    "40",
    "--max_predict_samples",
    "50",
    "--vocab_size",
    "1000",
    "--max_steps",
    "150",
    "--warmup_steps",
    "40",
    "--learning_rate_scale",
    "0.3",
    "--save_steps",
    "50",
    "--average_last_checkpoints",
    "3",
    "--logging_steps",
    "25",
    "--keep_checkpoints",
    "true",  # the averaged checkpoints stay, for the tests that read them and the push's
]


# the same tiny model, English→Chinese on a Tatoeba slice, with the vocabulary normalised as the Chinese recipe's
CHINESE_RUN = [
    *TINY_MODEL_RUN,
    "--train_file",
    str(TATOEBA_EN_ZH / "train.jsonl"),
    "--validation_file",
    str(TATOEBA_EN_ZH / "validation.jsonl"),
    "--test_file",
    str(TATOEBA_EN_ZH / "test.jsonl"),
    "--source_lang",
    "en",
    "--target_lang",
    "zh",
    "--normalization",
    "NFC",
    "--split_han",
    "true",
    "--num_beams",
    "2",
    "--max_train_samples",
    "6000",
    "--max_eval_samples",
    "40",
    "--max_predict_samples",
    "50",
    "--vocab_size",
    "1500",
    "--max_steps",
    "300",
    "--warmup_steps",
    "60",
    "--learning_rate_scale",
    "0.5",  # at 1.0 it ran into "我一一一…" on an Intel Xeon (AVX512), not on an AMD EPYC
    "--save_strategy",
    "no",
    "--average_last_checkpoints",
    "1",
    "--logging_steps",
    "50",
]


CHINESE_CHARACTER = re.compile(r"[\u4e00-\u9fff]")


@dataclass
class TrainedRun:
    output: Path
    results: dict
    commits: list = field(default_factory=list)  # (repo_id, {path_in_repo: bytes}) of every intercepted upload
