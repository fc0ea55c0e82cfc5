"""The package's command lines, in one place: the console scripts `vanilla-translate`, `vanilla-attention`,
`vanilla-average-checkpoints`, `vanilla-export-ctranslate2`, `vanilla-export-marian` and `vanilla-push-to-hub`
(setup.cfg), each a thin shell over a library module (translate.py, visualize.py, checkpoints.py,
export_ctranslate2.py, export_marian.py, hub.py), and what the
top-level scripts `run_translation.py` and `train_bpe.py` share: a flag parser whose errors are one line, recipe
files (expanded to flags, which the parser then checks) and `--config_overrides`.

Library functions raise plain exceptions that name their own parameters; each command reports them in its own
name, in one line, with a non-zero exit. The console scripts' flag values are checked as argparse reads them
(`CommandParser` and the `type=` functions below: one line, exit status 2), so that a value that cannot work stops
a command before it reads, loads or writes anything.
"""

import argparse
import io
import json
import math
import os
import re
import signal
import sys
from collections.abc import Collection

import yaml
from transformers import HfArgumentParser

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .extras import require
from .files import atomic_output_dir, check_output_dir, write_text_atomically
from .loading import one_line, parse_device

RECIPE_EXTENSIONS = (".yaml", ".yml", ".json")
FLAG_NAME = re.compile(r"[A-Za-z][\w-]*")


class FlagParser(HfArgumentParser):
    """`HfArgumentParser` whose errors (a mistyped flag, a bad value) are a ValueError of one line: argparse would
    print the whole usage (hundreds of lines for the Trainer's flags) above the error."""

    def error(self, message: str):
        raise ValueError(f"{message} (see --help)")


def recipe_flags(recipe_file: str, left_out: Collection[str] = ()) -> list[str]:
    """The command-line flags a recipe file (.yaml/.json mapping flag names to values) stands for: `name: value`
    becomes `--name value`, a list one flag with several values, true/false `true`/`false`. A null value, or a
    name in `left_out`, leaves the flag at its default. The command's parser then checks the flags as it checks
    those typed."""
    try:
        with open(recipe_file, encoding="utf-8") as file:
            recipe = json.load(file) if recipe_file.endswith(".json") else yaml.safe_load(file)
    except OSError as error:
        raise ValueError(f"{recipe_file}: cannot read the recipe ({error.strerror})") from None
    except (ValueError, RecursionError, yaml.YAMLError) as error:  # JSON and UTF-8 errors are ValueErrors
        raise ValueError(f"{recipe_file}: not a valid recipe ({one_line(error)})") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"{recipe_file}: a recipe is a mapping of flag names to values")
    flags = []
    for name, value in recipe.items():
        if not (isinstance(name, str) and FLAG_NAME.fullmatch(name)):
            raise ValueError(f"{recipe_file}: {name!r} is not a flag name")
        if value is None or name in left_out:
            continue
        values = value if isinstance(value, list) else [value]
        for one in values:
            if one is None or isinstance(one, (dict, list)):
                raise ValueError(f"{recipe_file}: {name}: {one!r} is not a value (a number, a string or true/false)")
        flags += [f"--{name}", *(str(one).lower() if isinstance(one, bool) else str(one) for one in values)]
    return flags


def expand_recipe(argv: list[str], replaces: dict[str, Collection[str]] | None = None) -> list[str]:
    """`argv` with a leading recipe file replaced by its flags; flags after the recipe override it. `replaces` maps
    a flag to the recipe's flags that it replaces when given after the recipe: those that would otherwise still
    apply beside it."""
    if argv and argv[0].endswith(RECIPE_EXTENSIONS):
        replaces = replaces or {}
        given = {flag_name(flag) for flag in argv[1:] if flag.startswith("--")}
        left_out = {name for flag in given & replaces.keys() for name in replaces[flag]}
        return [*recipe_flags(argv[0], left_out), *argv[1:]]
    return argv


def flag_name(flag: str) -> str:
    """The name of a command-line flag as its dataclass field spells it: `--max-steps=5` -> `max_steps`."""
    return flag.removeprefix("--").partition("=")[0].replace("-", "_")


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


class CommandParser(argparse.ArgumentParser):
    """The console scripts' argparse: a bad flag or value is one line, `PROG: error: argument --flag: ...`, and exit
    status 2, where argparse would print the usage (several lines) above it. Each flag's value is checked by its
    `type=` (the functions below), so that nothing is loaded, read or written before every flag is known good."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    """A count of at least 1: a batch size, a number of beams, tokens, threads."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def finite_float(text: str) -> float:
    """A number, not NaN or infinite (float() takes both)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def device_name(text: str) -> str:
    """A device torch can name (cpu, cuda, cuda:1, mps, ...); whether this machine has it is checked by the engine
    that runs on it (torch or CTranslate2), before the model is loaded."""
    try:
        parse_device(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def input_file(text: str) -> str:
    """A file to read ('-': standard input)."""
    if text != "-" and not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text}: {'a folder, not a file' if os.path.isdir(text) else 'no such file'}")
    return text


def output_file(text: str) -> str:
    """A file to write, in a folder that exists ('-': standard output); checked before any work, so that a mistyped
    folder does not fail once everything is translated."""
    if text == "-":
        return text
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder; give the name of a file to write")
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text}: there is no folder {folder} to write it in")
    return text


def hub_repo_id(text: str) -> str:
    """A repository id the Hub accepts (`name` or `namespace/name`), checked before the login is asked for."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError as error:
        raise argparse.ArgumentTypeError(one_line(error)) from None
    return text


def translate_main(argv: list[str] | None = None) -> None:
    """vanilla-translate: translate a file or standard input, one sentence a line (translate.py)."""
    import torch

    from .translate import COMPUTE_TYPES, read_lines, translate_lines, translator_loader, write_lines

    parser = CommandParser(
        prog="vanilla-translate",
        description="Translate a file or standard input with a trained model, one sentence a line. Empty lines stay "
        "empty; decoding is the model's own (for ours the paper's) unless flags say otherwise; a CTranslate2 folder "
        "(vanilla-export-ctranslate2) is translated with CTranslate2.",
    )
    parser.add_argument("--model", required=True, help="A model folder or a Hub id (downloaded, or from the cache).")
    parser.add_argument(
        "--input", type=input_file, default="-", help="File of sentences, one a line ('-': standard input)."
    )
    parser.add_argument(
        "--output", type=output_file, default="-", help="File to write translations to ('-': standard output)."
    )
    parser.add_argument("--num_beams", type=positive_int, help="Beam size (default: the model's).")
    parser.add_argument("--length_penalty", type=finite_float, help="Beam search's α (default: the model's).")
    parser.add_argument("--max_new_tokens", type=positive_int, help="Longest translation, in tokens.")
    parser.add_argument("--batch_size", type=positive_int, default=32, help="Sentences translated together.")
    parser.add_argument("--device", type=device_name, help="cpu, cuda, cuda:1, ... (default: cuda if available).")
    parser.add_argument(
        "--threads", type=positive_int,
        help="CPU threads: torch's (default 1, as fast as two on an idle CPU and twice as fast beside another job), "
        "or for a CTranslate2 folder batches in parallel, one thread each (default: one a core).",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="The model's dtype (auto: bfloat16 on a CPU with bfloat16 units, float32 elsewhere).",
    )  # fmt: skip
    fast = parser.add_argument_group("CTranslate2 folders (from vanilla-export-ctranslate2)")
    fast.add_argument("--compute_type", choices=COMPUTE_TYPES, help="The type to compute in (default: as saved).")
    fast.add_argument(
        "--inter_threads", type=positive_int, help="Batches in parallel (default: a CPU's cores; 1 on a GPU)."
    )
    fast.add_argument("--intra_threads", type=positive_int, help="Threads per batch (default: 1 on a CPU).")
    args = parser.parse_args(argv)
    # the same file by any path, a link included
    if (
        args.output != "-"
        and args.input != "-"
        and os.path.exists(args.output)
        and os.path.samefile(args.output, args.input)
    ):
        parser.error(f"argument --output: {args.output} is the input file {args.input}; it would be replaced")
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, _raise_interrupted)
    try:
        if isinstance(sys.stdout, io.TextIOWrapper):  # standard output is UTF-8 too, whatever the locale says
            sys.stdout.reconfigure(encoding="utf-8")
        # one intra-op thread by default: torch's threads spin at every barrier, and beside another job a thread
        # that loses its core stalls the rest (bench/bench_threads.py)
        torch.set_num_threads(args.threads or 1)
        # what the model's folder refuses (a missing package, a device this machine lacks) before the input is
        # read, and a bad line of input before the model is loaded
        load_translator = translator_loader(
            args.model, args.device, args.dtype, threads=args.threads, compute_type=args.compute_type,
            inter_threads=args.inter_threads, intra_threads=args.intra_threads,
        )  # fmt: skip
        lines = read_lines(args.input)
        translator = load_translator()
        decoding = {"num_beams": args.num_beams, "length_penalty": args.length_penalty,
                    "max_new_tokens": args.max_new_tokens}  # fmt: skip
        generate_kwargs = {key: value for key, value in decoding.items() if value is not None}
        translations = translate_lines(
            translator, lines, args.batch_size, generate_kwargs, show_progress=args.input != "-"
        )
        write_lines(args.output, translations)
    except Interrupted as interruption:
        print(f"\n{parser.prog}: interrupted; nothing was written", file=sys.stderr)
        sys.exit(interruption.exit_code)
    except (OSError, ValueError, ImportError) as error:
        sys.exit(f"{parser.prog}: error: {error}")


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM (a job scheduler's stop): unwinds like KeyboardInterrupt, so no half-written output stays."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


def attention_main(argv: list[str] | None = None) -> None:
    """vanilla-attention: attention pictures and step-by-step decoding of one sentence (visualize.py)."""
    import warnings

    from .inspection import attention_maps, decoding_steps, teacher_forced_steps
    from .loading import load_model_and_tokenizer
    from .visualize import attention_page, check_selection, format_steps, warning_lines, write_attention_pictures

    parser = CommandParser(
        prog="vanilla-attention",
        description="Draw every attention map of a trained model for one sentence (PNG files and attention.html, "
        "which needs no network), and with --steps show its decoding step by step.",
    )
    parser.add_argument("--model", required=True, help="A model folder or a Hub id (downloaded, or from the cache).")
    parser.add_argument("--source", required=True, help="The sentence to translate.")
    parser.add_argument("--target", help="A translation to read with teacher forcing instead of the model's own.")
    parser.add_argument("--output_dir", required=True, help="Folder for the PNG files and attention.html.")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="Replace --output_dir if it exists.")
    parser.add_argument("--layer", type=positive_int, help="Draw this layer only (from 1).")
    parser.add_argument("--head", type=positive_int, help="Draw this head only (from 1).")
    parser.add_argument("--steps", action="store_true", help="Show the decoding step by step.")
    parser.add_argument(
        "--num_beams", type=positive_int, help="Beam size of the beam-search table of --steps (default: the model's)."
    )
    parser.add_argument("--top_k", type=positive_int, default=5, help="Alternatives shown at each step.")
    parser.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    if args.num_beams is not None and not (args.steps and args.target is None):
        parser.error("argument --num_beams: only the beam-search table of --steps (without --target) has beams")
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(encoding="utf-8")
    # warnings (the switch to eager attention, fonts without a token's characters) as plain lines, each once
    with warnings.catch_warnings(record=True) as caught:
        try:
            require("matplotlib", "drawing attention pictures")
            check_output_dir(args.output_dir, args.overwrite_output_dir, source=args.model)
            # the eager attention path, the one that returns attention weights
            model, tokenizer = load_model_and_tokenizer(args.model, args.device, attn_implementation="eager")
            maps = attention_maps(model, tokenizer, args.source, args.target, top_k=args.top_k)
            check_selection(maps, args.layer, args.head)
            step_tables = {}
            if args.steps and args.target is not None:
                step_tables["Teacher forcing: the probability of each reference token"] = teacher_forced_steps(maps)
            elif args.steps:
                beams = args.num_beams or model.generation_config.num_beams or 1
                for title, num_beams in (("Greedy decoding", 1), (f"Beam search, {beams} beams", beams)):
                    step_tables[title], _ = decoding_steps(model, tokenizer, args.source, num_beams, args.top_k)
            with atomic_output_dir(args.output_dir, args.overwrite_output_dir) as staging:
                paths = write_attention_pictures(maps, staging, args.layer, args.head)
                write_text_atomically(os.path.join(staging, "attention.html"), attention_page(maps, step_tables))
        except (OSError, ValueError, ImportError) as error:
            sys.exit(f"{parser.prog}: error: {error}")
        finally:
            for line in warning_lines([str(warning.message) for warning in caught]):
                print(f"{parser.prog}: {line}", file=sys.stderr)
    print(f"{'target' if maps.teacher_forced else 'translation'}: {maps.translation}")
    for title, steps in step_tables.items():
        print(format_steps(title, steps))
    print(f"wrote {len(paths)} pictures and attention.html to {args.output_dir}")


def average_checkpoints_main(argv: list[str] | None = None) -> None:
    """vanilla-average-checkpoints: a run's newest checkpoints averaged into a model folder (checkpoints.py)."""
    from .checkpoints import write_averaged_model

    parser = argparse.ArgumentParser(
        prog="vanilla-average-checkpoints",
        description="Average the weights of the newest checkpoints of a training run (Section 6.1 of the paper: the "
        "last 5), as fairseq's scripts/average_checkpoints.py does, into a new model folder that from_pretrained "
        "and pipeline() load: the newest checkpoint's config, generation config and tokenizer with the mean weights.",
    )
    parser.add_argument("--model_dir", required=True, help="The run folder holding checkpoint-STEP folders.")
    parser.add_argument("--last", type=int, default=5, help="How many of the newest checkpoints (default 5).")
    parser.add_argument("--output_dir", required=True, help="The model folder to write (not the run folder).")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="Replace a non-empty --output_dir.")
    args = parser.parse_args(argv)
    try:
        folders = write_averaged_model(args.model_dir, args.last, args.output_dir, args.overwrite_output_dir)
    except (OSError, ValueError) as error:
        sys.exit(f"{parser.prog}: error: {one_line(error)}")
    print(f"Wrote the mean of {', '.join(os.path.basename(folder) for folder in folders)} to {args.output_dir}")


def export_ctranslate2_main(argv: list[str] | None = None) -> None:
    """vanilla-export-ctranslate2: write a model folder as a CTranslate2 folder (export_ctranslate2.py)."""
    from .export_ctranslate2 import QUANTIZATIONS, export

    parser = CommandParser(
        prog="vanilla-export-ctranslate2",
        description="Export a trained model folder to CTranslate2, OpenNMT's inference engine, for fast CPU "
        "translation (needs the [fast] extra).",
    )
    parser.add_argument("--model", required=True, help="One of our model folders (run_translation.py), or its Hub id.")
    parser.add_argument("--output_dir", required=True, help="The CTranslate2 model folder to write.")
    parser.add_argument("--quantization", default="float32", choices=QUANTIZATIONS, help="Weight type.")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="Replace a non-empty --output_dir.")
    args = parser.parse_args(argv)
    try:
        export(args.model, args.output_dir, args.quantization, args.overwrite_output_dir)
    except (OSError, ValueError, ImportError) as error:
        sys.exit(f"{parser.prog}: error: {error}")
    print(f"Wrote a CTranslate2 model ({args.quantization}) to {args.output_dir}")


def export_marian_main(argv: list[str] | None = None) -> None:
    """vanilla-export-marian: write a model folder as transformers' own MarianMTModel (export_marian.py)."""
    from .export_marian import export

    parser = CommandParser(
        prog="vanilla-export-marian",
        description="Export a trained model folder to transformers' own MarianMTModel: the same model, loaded by "
        "plain transformers with no code of ours and no trust_remote_code.",
    )
    parser.add_argument("--model", required=True, help="One of our model folders (run_translation.py), or its Hub id.")
    parser.add_argument("--output_dir", required=True, help="The MarianMTModel folder to write.")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="Replace a non-empty --output_dir.")
    args = parser.parse_args(argv)
    try:
        export(args.model, args.output_dir, args.overwrite_output_dir)
    except (OSError, ValueError) as error:
        sys.exit(f"{parser.prog}: error: {error}")
    print(f"Wrote a MarianMTModel to {args.output_dir}")


def push_to_hub_main(argv: list[str] | None = None) -> None:
    """vanilla-push-to-hub: upload a finished model folder, ours or an export, to the Hub in one commit (hub.py)."""
    from .hub import check_hub_login, push_model_folder

    parser = CommandParser(
        prog="vanilla-push-to-hub",
        description="Upload a finished model folder (from run_translation.py, vanilla-export-ctranslate2 or "
        "vanilla-export-marian) to a Hugging Face Hub repository in one commit, checkpoints and trainer state left "
        "out; the card's code then names the repository.",
    )
    parser.add_argument("--model", required=True, help="The model folder to upload.")
    parser.add_argument(
        "--repo_id", type=hub_repo_id, required=True, help="The repository, for example your-name/multi30k-en-de."
    )
    parser.add_argument("--private", action="store_true", help="Create the repository private.")
    parser.add_argument("--token", default=None, help="A Hub token (default: the saved login, `hf auth login`).")
    args = parser.parse_args(argv)
    try:
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            raise ValueError(f"{args.model}: not a model folder (no config.json)")
        check_hub_login(args.token)
        url = push_model_folder(args.model, args.repo_id, token=args.token, private=args.private or None)
    except (OSError, ValueError) as error:
        sys.exit(f"{parser.prog}: error: {one_line(error)}")
    print(f"Uploaded {args.model} to {url}")
