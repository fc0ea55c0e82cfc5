"""vanilla-translate: translate a file or standard input with a trained model, one sentence a line
(tools/translate.py)."""

import io
import os
import signal
import sys

from hf_vanilla_transformer.cli.flags import (
    CommandParser,
    device_name,
    finite_float,
    input_file,
    output_file,
    positive_int,
)


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    import torch

    from hf_vanilla_transformer.tools.translate import (
        COMPUTE_TYPES,
        read_lines,
        translate_lines,
        translator_loader,
        write_lines,
    )

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
    # the handlers for this command's work only: a caller (a test, a notebook) gets its own back afterwards
    previous = {stop: signal.signal(stop, raise_interrupted) for stop in (signal.SIGINT, signal.SIGTERM)}
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
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM (a job scheduler's stop): unwinds like KeyboardInterrupt, so no half-written output stays."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


def raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


if __name__ == "__main__":
    main()
