"""vanilla-translate: translate a file or standard input with a trained model, one sentence a line
(translation/lines.py)."""

import sys

from hf_vanilla_transformer.cli.flags import (
    CommandParser,
    check_output_is_not_an_input,
    device_name,
    finite_float,
    input_file,
    output_file,
    positive_float,
    positive_int,
    probability,
    reported,
)


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    import torch

    from hf_vanilla_transformer.decoding.ensemble import MembersDiffer
    from hf_vanilla_transformer.decoding.request import Steering, SteeringError
    from hf_vanilla_transformer.decoding.words import PHRASE_MATCHES
    from hf_vanilla_transformer.engines.ctranslate2 import COMPUTE_TYPES
    from hf_vanilla_transformer.engines.registry import check_request, translator_kind, translator_loader
    from hf_vanilla_transformer.loading import load_tokenizer, model_folder
    from hf_vanilla_transformer.translation.lines import check_steering_of, translate_lines_in_full
    from hf_vanilla_transformer.translation.output import OUTPUT_FORMATS, format_translations, write_lines
    from hf_vanilla_transformer.translation.steering_files import (
        check_line_counts,
        check_steering_texts,
        read_lines,
        read_steering_files,
    )

    parser = CommandParser(
        prog="vanilla-translate",
        description="Translate a file or standard input with a trained model, one sentence a line. Empty lines stay "
        "empty; decoding is the model's own (for ours the paper's) unless flags say otherwise. A CTranslate2 folder "
        "(vanilla-export-ctranslate2) is translated with CTranslate2, an ONNX folder (vanilla-export-onnx) greedily "
        "with ONNX Runtime; several --model folders decode together as an ensemble.",
    )
    parser.add_argument(
        "--model",
        required=True,
        action="extend",
        nargs="+",
        help="A model folder or a Hub id (downloaded, or from the cache); several (--model A B, or --model A "
        "--model B): an ensemble that averages the models' log-probabilities at every step.",
    )
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
    parser.add_argument(
        "--buffer_size",
        type=positive_int,
        help="Translate standard input N lines at a time as they come, writing each translation at once (default: 1 "
        "where standard input is a terminal, else all lines together).",
    )
    parser.add_argument("--device", type=device_name, help="cpu, cuda, cuda:1, ... (default: cuda if available).")
    parser.add_argument(
        "--threads",
        type=positive_int,
        help="CPU threads: torch's (default 1), or for a CTranslate2 folder batches in parallel, one thread each "
        "(default: one a core).",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="The model's dtype (auto: bfloat16 on a CPU with bfloat16 units, float32 elsewhere).",
    )
    steer = parser.add_argument_group("steering the translation")
    steer.add_argument(
        "--n_best",
        type=positive_int,
        help="Write the N best hypotheses of each line with their scores (`line ||| translation ||| score ||| "
        "log-probability`; the beam is raised to N where it is smaller and --num_beams is not given).",
    )
    steer.add_argument(
        "--format",
        choices=OUTPUT_FORMATS,
        default="plain",
        help="plain: a translation a line (with --n_best, a hypothesis a line); jsonl: a JSON object a line with "
        "each hypothesis' score, log-probability, tokens and their log-probabilities.",
    )
    steer.add_argument(
        "--prefix",
        type=input_file,
        help="File of target prefixes, one per input line (empty: none): each translation starts with its line's "
        "prefix and the model continues it.",
    )
    steer.add_argument(
        "--constraints",
        type=input_file,
        help="File of terminology constraints, one JSON list of target words or phrases per input line (empty or "
        "[]: none): each translation contains them all (lexically constrained beam search).",
    )
    steer.add_argument(
        "--avoid",
        type=input_file,
        help="File of words or phrases no translation may hold, a JSON string or list of strings a line, for every "
        "input line.",
    )
    steer.add_argument(
        "--constraint_match",
        choices=PHRASE_MATCHES,
        default="word",
        help="How --constraints and --avoid match. word: whole words only (inside words where the script has no "
        "spaces: Chinese, Japanese, Thai); subword: anywhere, inside words too.",
    )
    steer.add_argument(
        "--alignments",
        action="store_true",
        help="Add the source-target word alignment of each translation (`i-j` pairs, source word first, from 0) "
        "from the encoder-decoder attention.",
    )
    sample = parser.add_argument_group("sampling (for back-translation)")
    sample.add_argument(
        "--do_sample", action="store_true", help="Sample each token instead of searching (one beam unless --num_beams)."
    )
    sample.add_argument("--top_k", type=positive_int, help="Sample from the k most likely tokens only.")
    sample.add_argument("--top_p", type=probability, help="Sample from the smallest set of tokens this likely.")
    sample.add_argument("--temperature", type=positive_float, help="Divide the logits by this before sampling.")
    sample.add_argument("--seed", type=int, help="Random seed: the same seed gives the same samples.")
    fast = parser.add_argument_group("CTranslate2 folders (from vanilla-export-ctranslate2)")
    fast.add_argument("--compute_type", choices=COMPUTE_TYPES, help="The type to compute in (default: as saved).")
    fast.add_argument(
        "--inter_threads", type=positive_int, help="Batches in parallel (default: a CPU's cores; 1 on a GPU)."
    )
    fast.add_argument("--intra_threads", type=positive_int, help="Threads per batch (default: 1 on a CPU).")
    args = parser.parse_args(argv)
    check_output_is_not_an_input(
        parser,
        args.output,
        {"input": args.input, "prefix": args.prefix, "constraints": args.constraints, "avoid": args.avoid},
    )
    if args.buffer_size and args.input != "-":
        parser.error("argument --buffer_size: for standard input (--input -); a file is translated whole")
    sampling = {"top_k": args.top_k, "top_p": args.top_p, "temperature": args.temperature}
    if not args.do_sample and any(value is not None for value in sampling.values()):
        flag = next(name for name, value in sampling.items() if value is not None)
        parser.error(f"argument --{flag}: only with --do_sample")
    if args.prefix and args.constraints:
        parser.error("argument --prefix: not with --constraints (constrained beam search starts from nothing)")
    if args.constraints and args.do_sample:
        parser.error("argument --constraints: not with --do_sample (constraints are met by beam search)")
    decoding = {
        "num_beams": args.num_beams,
        "length_penalty": args.length_penalty,
        "max_new_tokens": args.max_new_tokens,
        **sampling,
    }
    if args.n_best and args.num_beams and args.n_best > args.num_beams and not args.do_sample:
        parser.error(f"argument --n_best: {args.n_best} is more than --num_beams {args.num_beams}")
    if args.do_sample:
        decoding["do_sample"] = True
    generate_kwargs = {key: value for key, value in decoding.items() if value is not None}
    steering = Steering(  # the per-line prefixes and constraints are read below
        n_best=args.n_best or 1,
        scores=args.n_best is not None or args.format == "jsonl",
        alignments=args.alignments,
        prefixes=[] if args.prefix else None,
        constraints=[] if args.constraints else None,
        avoid=[] if args.avoid else None,
        constraint_match=args.constraint_match,
    )
    try:
        check_request(args.model, steering, generate_kwargs)
    except ValueError as error:
        parser.error(str(error))
    if args.do_sample:  # sampling draws one sequence a beam: plain sampling unless a beam is asked for
        generate_kwargs.setdefault("num_beams", 1)
    with reported(parser.prog):
        # one intra-op thread by default: torch's threads spin at every barrier, and beside another job a thread
        # that loses its core stalls the rest (bench/speed/bench_threads.py)
        torch.set_num_threads(args.threads or 1)
        # a bad steering file first (it is read whole, and cheaply), then what the model's folder refuses (a missing
        # package, a device this machine lacks) before the input is read, and a bad line of input before the model
        # is loaded
        try:
            steering = read_steering_files(steering, args.prefix, args.constraints, args.avoid)
        except SteeringError as error:
            parser.error(str(error))
        loading = translator_loader(
            args.model,
            args.device,
            args.dtype,
            threads=args.threads,
            compute_type=args.compute_type,
            inter_threads=args.inter_threads,
            intra_threads=args.intra_threads,
        )
        streaming = args.buffer_size or (args.input == "-" and sys.stdin.isatty())
        lines = None if streaming else read_lines(args.input)  # bad input: one line naming it, exit status 1
        try:
            if args.prefix or args.constraints or args.avoid:
                check_steering_texts(load_tokenizer(model_folder(args.model[0])), steering)
            if lines is not None:
                check_line_counts(steering, len(lines), args.input)
                if args.prefix or args.constraints:  # what fits, and what clashes with --avoid
                    check_steering_of(args.model[0], lines, steering, args.max_new_tokens)
        except SteeringError as error:
            parser.error(str(error))
        if args.seed is not None:  # before the translator starts: CTranslate2 seeds its workers as it starts them
            translator_kind(args.model).set_seed(args.seed)
        try:  # an ensemble's members are compared before any weights are read (load_ensemble)
            translator = loading()
        except MembersDiffer as error:
            parser.error(str(error))
        beams = generate_kwargs.get("num_beams", translator.num_beams)
        if steering.n_best > beams and not args.do_sample:
            generate_kwargs["num_beams"] = steering.n_best
            print(f"{parser.prog}: the beam is raised from {beams} to --n_best {args.n_best}", file=sys.stderr)
        layout = {"form": args.format, "n_best": args.n_best is not None}
        if streaming:
            try:
                translate_stream(translator, steering, args, generate_kwargs, layout)
            except SteeringError as error:
                parser.error(str(error))
            return
        found = translate_lines_in_full(
            translator, lines, args.batch_size, generate_kwargs, show_progress=args.input != "-", steering=steering
        )
        write_lines(args.output, format_translations(found, **layout))


def translate_stream(translator, steering, args, generate_kwargs: dict, layout: dict) -> None:
    """Standard input translated `--buffer_size` lines at a time (1 from a terminal) as they come, each batch's
    output written and flushed at once, so that a program can write a line and wait for its translation; to
    `--output` a file, the whole output at the end. Per-line files are checked as the input goes."""
    from hf_vanilla_transformer.files import decoded_lines
    from hf_vanilla_transformer.translation.lines import translate_lines_in_full
    from hf_vanilla_transformer.translation.output import format_translations, write_lines
    from hf_vanilla_transformer.translation.steering_files import check_line_counts

    size, buffered, written, kept = args.buffer_size or 1, [], 0, []

    def flush() -> None:
        nonlocal written
        check_line_counts(steering, written + len(buffered), "standard input", complete=False)
        found = translate_lines_in_full(
            translator,
            buffered,
            args.batch_size,
            generate_kwargs,
            show_progress=False,
            steering=steering.lines(written, written + len(buffered)),
        )
        lines = format_translations(found, first=written, **layout)
        if args.output == "-":
            sys.stdout.write("".join(line + "\n" for line in lines))
            sys.stdout.flush()
        else:
            kept.extend(lines)
        written += len(buffered)
        buffered.clear()

    for _, line in decoded_lines(sys.stdin.buffer, "standard input"):
        buffered.append(line.rstrip("\r\n"))
        if len(buffered) == size:
            flush()
    if buffered:
        flush()
    check_line_counts(steering, written, "standard input")
    if args.output != "-":
        write_lines(args.output, kept)


if __name__ == "__main__":
    main()
