"""What the test files share: tiny models and tokenizers, the Multi30k paths and the run that trains on them, the Hub
boundary, and small functions more than one file uses. Fixtures are in conftest.py; tests import these directly
(`from helpers import ...`: setup.cfg puts tests/ on pytest's pythonpath)."""

import inspect
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.modeling_vanilla_transformer import CACHE_NAME, paper_generation_config

PAD, BOS, EOS = 1, 0, 2
REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"
TATOEBA_EN_ZH = REPO_ROOT.parent / "shared" / "data" / "tatoeba-en-zh"


def tiny_config(**overrides) -> VanillaTransformerConfig:
    """A model small enough to run hundreds of times a second on a CPU, with every dimension distinct."""
    values = dict(
        vocab_size=99,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=2,
        encoder_ffn_dim=48,
        decoder_ffn_dim=40,
        max_position_embeddings=128,
        dropout=0.0,
    )
    values.update(overrides)
    return VanillaTransformerConfig(**values)


def cache_of(output):
    """The decoder cache of a model output, under the name of the installed transformers (`CACHE_NAME`)."""
    return getattr(output, CACHE_NAME)


def enable_checkpointing(model) -> None:
    """Gradient checkpointing on, by transformers' public name of this release (5.24 renamed it "activation")."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def tiny_model(seed: int = 0, attn_implementation: str = "eager", **overrides):
    torch.manual_seed(seed)
    model = VanillaTransformerForConditionalGeneration(tiny_config(**overrides))
    model.set_attn_implementation(attn_implementation)
    return model.eval()


LETTERS = list("abcdefghij")


def letter_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ten letters with the model's special-token layout; encoding appends </s>."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{letter: 4 + i for i, letter in enumerate(LETTERS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def beam_search_example():
    """A tiny random model whose beam search (3 beams, 8 tokens at most) finishes three hypotheses at different
    steps, drops others and stops with some still running: seed 5 was picked for that, with the paper's length
    penalty, which a trained model's generation config holds."""
    model = tiny_model(5, vocab_size=14)
    model.generation_config = paper_generation_config(model.config)
    return model, letter_tokenizer(), "a b c d e", {"num_beams": 3, "max_new_tokens": 8}


def round_trip(tokenizer, text: str) -> str:
    return tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True)


def random_token_dataset(size: int, seed: int) -> Dataset:
    """Sources and targets of random ids between 4 and 98 (the tiny model's vocabulary), of varied lengths."""
    rng = random.Random(seed)

    def sentence(longest: int) -> list[int]:
        return [rng.randint(4, 98) for _ in range(rng.randint(1, longest))] + [EOS]

    rows = [(sentence(20), sentence(12)) for _ in range(size)]
    return Dataset.from_dict({"input_ids": [s for s, _ in rows], "labels": [t for _, t in rows]})


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


TRAIN, VALIDATION, TEST = (str(MULTI30K / f"{split}.jsonl") for split in ("train", "validation", "test"))

# a 2+2-layer d_model 64 model, trained, evaluated and used for prediction in seconds
TINY_MODEL_RUN = [
    "--preset", "small",
    "--config_overrides", "d_model=64,encoder_ffn_dim=128,decoder_ffn_dim=128,encoder_layers=2,decoder_layers=2",
    "--do_train", "--do_eval", "--do_predict", "--predict_with_generate",
    "--max_tokens_per_batch", "1500", "--per_device_eval_batch_size", "32", "--report_to", "none", "--use_cpu", "true",
    "--disable_tqdm", "true", "--seed", "0",
]  # fmt: skip

TINY_RUN = [
    *TINY_MODEL_RUN, "--train_file", TRAIN, "--validation_file", VALIDATION, "--test_file", TEST,
    "--max_train_samples", "3000", "--max_eval_samples", "40", "--max_predict_samples", "50", "--vocab_size", "1000",
    "--max_steps", "150", "--warmup_steps", "40", "--learning_rate_scale", "0.3",
    "--save_steps", "50", "--average_last_checkpoints", "3", "--logging_steps", "25",
    "--keep_checkpoints", "true",  # the averaged checkpoints stay, for the tests that read them and the push's
]  # fmt: skip

# the same tiny model, English→Chinese on a Tatoeba slice, with the vocabulary normalised as the Chinese recipe's
CHINESE_RUN = [
    *TINY_MODEL_RUN, "--train_file", str(TATOEBA_EN_ZH / "train.jsonl"),
    "--validation_file", str(TATOEBA_EN_ZH / "validation.jsonl"), "--test_file", str(TATOEBA_EN_ZH / "test.jsonl"),
    "--source_lang", "en", "--target_lang", "zh", "--normalization", "NFC", "--split_han", "true",
    "--num_beams", "2",
    "--max_train_samples", "6000", "--max_eval_samples", "40", "--max_predict_samples", "50", "--vocab_size", "1500",
    "--max_steps", "300", "--warmup_steps", "60",
    "--learning_rate_scale", "0.5",  # at 1.0 it ran into "我一一一…" on an Intel Xeon (AVX512), not on an AMD EPYC
    "--save_strategy", "no", "--average_last_checkpoints", "1", "--logging_steps", "50",
]  # fmt: skip
CHINESE_CHARACTER = re.compile(r"[\u4e00-\u9fff]")


@dataclass
class TrainedRun:
    output: Path
    results: dict
    commits: list = field(default_factory=list)  # (repo_id, {path_in_repo: bytes}) of every intercepted upload


SENTENCES = ["A man is sleeping.", "Two dogs play in the snow.", "A little girl climbs into a wooden playhouse."]


def generate_text(model, tokenizer, sentences, **kwargs) -> list[str]:
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        return tokenizer.batch_decode(model.generate(**batch, **kwargs), skip_special_tokens=True)


def run_with_peak_rss(command: list[str]) -> tuple[int, str, int]:
    """Run `command`; its exit status, stderr and peak resident memory in bytes (the kernel's count for that one
    child, from wait4)."""
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        return process.returncode, stderr.read().decode(errors="replace"), usage.ru_maxrss * 1024


@contextmanager
def intercepted_hub(commits: list):
    """huggingface_hub with the network calls of an upload (and of the login check before it) replaced: the commit
    is recorded, not sent.

    The Hub checks a README's metadata server-side (`/api/validate-yaml`); here it is parsed by huggingface_hub's
    own `ModelCard`, which raises on YAML or `model-index` it cannot read.
    """
    from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl

    def create_repo(self, repo_id, *args, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, *args, **kwargs):
        files = {}
        for operation in operations:
            source = operation.path_or_fileobj
            files[operation.path_in_repo] = Path(source).read_bytes() if isinstance(source, (str, Path)) else source
        commits.append((repo_id, files))
        return CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/{'0' * 40}",
            commit_message=kwargs.get("commit_message", ""),
            commit_description="",
            oid="0" * 40,
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HfApi, "create_repo", create_repo)
        patch.setattr(HfApi, "create_commit", create_commit)
        patch.setattr(HfApi, "whoami", lambda self, *args, **kwargs: {"name": "someone"})
        patch.setattr(HfApi, "_validate_yaml", lambda self, content, **kwargs: ModelCard(content))
        yield


def hub_snapshot(cache, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay `files` out as huggingface_hub's cache holds a downloaded repository (refs/main -> snapshots/<sha>)."""
    repo = cache / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("1" * 40)
    for name, content in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(content)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("1" * 40)


def run_python(code: str, hf_home, package_importable: bool = False) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python, offline, with standard input closed (so a prompt cannot wait for an answer)
    and, unless `package_importable`, where `import hf_vanilla_transformer` fails."""
    block = "" if package_importable else 'import sys\nsys.modules["hf_vanilla_transformer"] = None\n'
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", block + textwrap.dedent(code)],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# Debian's packages (apt-get install chromium chromium-driver; setup.sh installs them)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


DEMO_APP = REPO_ROOT / "demo" / "app.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def served_demo(command: list[str], log_path: Path, start_timeout: float = 120):
    """Run a demo/app.py command line (it must name a `--port`) until it answers over HTTP; yield its URL, then stop
    it."""
    port = command[command.index("--port") + 1]
    # this checkout's package, not the one installed: they differ in a git worktree
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": python_path}
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if server.poll() is not None:
                pytest.fail(f"the demo exited with {server.returncode}:\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the demo did not answer within {start_timeout} s:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


@contextmanager
def headless_chromium(width: int = 1280, height: int = 1600, timeout: float = 90):
    """A real Chromium without a display, driven through Selenium; quit when the block ends."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        browser.set_page_load_timeout(timeout)
        yield browser
    finally:
        browser.quit()


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


# The two layouts of the Hub's translation datasets, each making a row of an English and a German sentence
HUB_LAYOUTS = {
    "translation column": lambda en, de: {"translation": {"en": en, "de": de}},  # wmt14, Helsinki-NLP/opus-100
    "language columns": lambda en, de: {"en": en, "de": de},  # bentrevett/multi30k
}


def write_dataset(folder, splits: dict[str, list[dict]], form: str = "jsonl") -> str:
    """`splits` (rows a split) as a local folder that `datasets.load_dataset(folder)` reads: JSON lines or parquet
    files named as bentrevett/multi30k names them (val.jsonl holds the validation split), or `save_to_disk`'s
    folder."""
    tables = {split: Dataset.from_list(rows) for split, rows in splits.items()}
    if form == "saved":
        DatasetDict(tables).save_to_disk(folder)
        return str(folder)
    folder.mkdir()
    for split, rows in splits.items():
        name = folder / ("val" if split == "validation" else split)
        if form == "jsonl":
            write_lines(name.with_suffix(".jsonl"), [json.dumps(row) for row in rows])
        else:
            tables[split].to_parquet(name.with_suffix(".parquet"))
    return str(folder)


# Hostile input, for the property tests of every reader (hypothesis). Each entry point must give a result or one
# line of error naming the file. Every run of the suite tries the same 150 inputs per entry point (derandomized, so
# that CI cannot fail by chance); FUZZ_EXAMPLES=2000 FUZZ_RANDOM=1 tries more, and new ones each run.
FUZZ_SETTINGS = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 150)),
    deadline=None,
    derandomize=os.environ.get("FUZZ_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow],
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)
HOSTILE_LINES = [
    b"\xef\xbb\xbf",  # a byte-order mark
    b"\x00",  # NUL
    b"\xff\xfe\xed\xa0\x80",  # not UTF-8; an encoded surrogate
    b"[" * 50_000,  # nesting deeper than the JSON reader's recursion
    b"9" * 5_000,  # an integer too long for int()
    b'{"translation": {"en": "a", "en": "b", "de": "c"}}',  # a duplicate key
    b'{"translation": {"en": "\\ud800", "de": "c"}}',  # a lone surrogate
    b'{"translation": {"en": "a\\u2028b", "de": "c\\u0085d"}}',  # line separators inside a sentence
    b"\r",
]
RAW_LINES = st.one_of(
    st.sampled_from(HOSTILE_LINES),
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.tuples(JSON_VALUES, JSON_VALUES).map(
        lambda pair: json.dumps({"translation": {"en": pair[0], "de": pair[1]}}).encode()
    ),
    st.tuples(st.text(min_size=1), st.text(min_size=1)).map(
        lambda pair: json.dumps({"translation": {"en": pair[0], "de": pair[1]}}).encode()
    ),
)


def assert_one_line_error(error: BaseException, *names: str) -> None:
    """An error a user sees: one line that names the file (or field) it is about."""
    message = str(error)
    assert message and "\n" not in message and "Traceback" not in message, message
    assert any(name in message for name in names), (message, names)


def write_bytes_lines(folder: Path, name: str, lines: list[bytes], bom: bool = False) -> str:
    path = folder / name
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"".join(line + b"\n" for line in lines))
    return str(path)


def read_fuzzed_file(reader, lines: list[bytes], bom: bool, name: str):
    """`reader(path)` on a file of `lines`: (its result, the file's text) or, when it refuses the file, None once its
    error is checked to be one line naming the file."""
    from hf_vanilla_transformer.data import TranslationDataError

    with tempfile.TemporaryDirectory() as folder:
        path = write_bytes_lines(Path(folder), name, lines, bom)
        try:
            result = reader(path)
        except TranslationDataError as error:
            assert_one_line_error(error, f"{path}:")
            return None
        return result, Path(path).read_bytes().decode("utf-8-sig")


# Python's audit hooks see every file a process opens for writing, renames or removes from Python code (transformers'
# JSON files, our atomic writes); `sitecustomize` installs one in each process a launcher starts.
WRITE_AUDIT = """
import os, sys

def _install(log_dir, root):
    log = open(os.path.join(log_dir, f"{os.environ.get('RANK', 'single')}-{os.getpid()}.txt"), "a", buffering=1)
    root = os.path.realpath(root) + os.sep

    def record(what, path):
        if isinstance(path, (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(path))
            if path.startswith(root):
                log.write(f"{what} {path[len(root):]}\\n")

    def hook(event, args):
        if event == "open" and (any(c in args[1] for c in "wax+") if args[1] else args[2] & (os.O_WRONLY | os.O_RDWR)):
            record("write", args[0])
        elif event in ("os.rename", "os.replace"):
            record(event, args[1])
        elif event == "os.remove":
            record(event, args[0])

    sys.addaudithook(hook)

if os.environ.get("WRITE_AUDIT_DIR"):
    _install(os.environ["WRITE_AUDIT_DIR"], os.environ["WRITE_AUDIT_ROOT"])
"""


def sitecustomize_env(folder: Path, code: str) -> dict:
    """The environment of a Python process that runs `code` at start-up (a `sitecustomize` module in `folder`)."""
    (folder / "site").mkdir(parents=True)
    (folder / "site" / "sitecustomize.py").write_text(code)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(folder / "site"), os.environ.get("PYTHONPATH")])),
    }


def write_audit_env(folder: Path, root: Path) -> dict:
    """The environment for a launched command whose writes under `root` are to be recorded in `folder`, one log per
    process named by its RANK ("single" outside a launcher); read them with `audited_writes`."""
    return {**sitecustomize_env(folder, WRITE_AUDIT), "WRITE_AUDIT_DIR": str(folder), "WRITE_AUDIT_ROOT": str(root)}


class NotInstalled:
    """A meta-path finder under which importing one of `packages` fails as it does where the package is not
    installed (first on `sys.meta_path`, and with the package not imported yet)."""

    def __init__(self, *packages: str):
        self.packages = set(packages)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.packages:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def not_installed_env(folder: Path, *packages: str) -> dict:
    """The environment of a Python process in which `packages` are not installed, as far as imports tell."""
    code = f"import sys\n\n{inspect.getsource(NotInstalled)}\nsys.meta_path.insert(0, NotInstalled(*{packages!r}))\n"
    return sitecustomize_env(folder, code)


def audited_writes(folder: Path) -> dict[str, list[str]]:
    """{rank: ["write PATH", "os.replace PATH", ...]} of the processes `write_audit_env` recorded, paths relative
    to the root; the launcher itself, if it wrote nothing there, is left out."""
    writes = {}
    for log in sorted(folder.glob("*-*.txt")):
        lines = log.read_text().splitlines()
        if lines:
            writes.setdefault(log.name.split("-")[0], []).extend(lines)
    return writes
