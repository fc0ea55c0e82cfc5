"""vanilla-score: the model's score of given translations, one pair a line of two files (translation/scoring.py)."""

from hf_vanilla_transformer.cli.flags import (
    CommandParser,
    check_output_is_not_an_input,
    device_name,
    finite_float,
    input_file,
    output_file,
    positive_int,
    reported,
)

TARGET_FORMATS = ("text", "jsonl")


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    import torch

    from hf_vanilla_transformer.decoding.ensemble import MembersDiffer
    from hf_vanilla_transformer.decoding.forced_decoding import check_pairs
    from hf_vanilla_transformer.engines.registry import ScoringRefused, check_scoring, translator_loader
    from hf_vanilla_transformer.files import InputError
    from hf_vanilla_transformer.translation.output import OUTPUT_FORMATS, format_translations, write_lines
    from hf_vanilla_transformer.translation.scoring import read_hypotheses, rescored
    from hf_vanilla_transformer.translation.steering_files import read_lines

    parser = CommandParser(
        prog="vanilla-score",
        description="Score given translations with a trained model (forced decoding): for each line of --target, "
        "the log-probability the model gives it as the translation of the same line of --source. A CTranslate2 "
        "folder (vanilla-export-ctranslate2) is scored with CTranslate2; several --model folders as an ensemble.",
    )
    parser.add_argument(
        "--model",
        required=True,
        action="extend",
        nargs="+",
        help="A model folder or a Hub id; several: an ensemble, scored as vanilla-translate decodes with it (the "
        "mean of the models' log-probabilities at every token, renormalised).",
    )
    parser.add_argument(
        "--source", type=input_file, required=True, help="File of source sentences, one a line ('-': standard input)."
    )
    parser.add_argument(
        "--target", type=input_file, required=True, help="File of their translations, one a line ('-': standard input)."
    )
    parser.add_argument(
        "--target_format",
        choices=TARGET_FORMATS,
        default="text",
        help="text: a translation a line, tokenized anew as training tokenizes labels (the model may have written "
        "the same text in other tokens, with another score); jsonl: vanilla-translate's --format jsonl output, each "
        "hypothesis scored on the tokens it was written in, as the n-best list scored it.",
    )
    parser.add_argument(
        "--output", type=output_file, default="-", help="File to write the scores to ('-': standard output)."
    )
    parser.add_argument(
        "--format",
        choices=OUTPUT_FORMATS,
        default="plain",
        help="plain: each pair's log-probability, one a line (jsonl targets: vanilla-translate's n-best lines, "
        "`line ||| translation ||| score ||| log-probability`); jsonl: a JSON object a line with log_probability, "
        "score (log-probability / length^length_penalty, as beam search ranks), tokens and token_log_probs (jsonl "
        "targets: vanilla-translate's --format jsonl).",
    )
    parser.add_argument(
        "--length_penalty", type=finite_float, help="The score's length penalty α (default: the model's)."
    )
    parser.add_argument("--batch_size", type=positive_int, default=32, help="Pairs scored together.")
    parser.add_argument("--device", type=device_name, help="cpu, cuda, cuda:1, ... (default: cuda if available).")
    parser.add_argument(
        "--threads",
        type=positive_int,
        help="CPU threads: torch's (default 1), or for a CTranslate2 folder batches in parallel (default: one a core).",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="The model's dtype (auto: as vanilla-translate chooses it).",
    )
    parser.add_argument(
        "--alignments",
        action="store_true",
        help="Add each pair's word alignment (`i-j` pairs, source word first, from 0) from the encoder-decoder "
        "attention: after ' ||| ' in plain output, as \"alignment\" in jsonl (model folders).",
    )
    args = parser.parse_args(argv)
    try:
        check_scoring(args.model, ["scores", "alignments"] if args.alignments else ["scores"])
    except ScoringRefused as error:
        flag = "--model: scoring given translations is " if error.asked == "scores" else "--alignments: "
        parser.error(f"argument {flag}{error}")
    except ValueError as error:  # an ensemble with an export, refused as vanilla-translate refuses it
        parser.error(str(error))
    if args.source == args.target == "-":
        parser.error("argument --target: --source already reads standard input; give one of them as a file")
    check_output_is_not_an_input(parser, args.output, {"--source": args.source, "--target": args.target})
    with reported(parser.prog):
        torch.set_num_threads(args.threads or 1)  # one intra-op thread by default, as vanilla-translate
        # what the model's folder refuses before the input is read, and bad input before the model is loaded
        loading = translator_loader(args.model, args.device, args.dtype, args.threads)
        names = (file_name(args.source), file_name(args.target))
        sources = read_lines(args.source)
        try:
            if args.target_format == "jsonl":
                hypotheses = read_hypotheses(args.target, len(sources), names)
            else:
                targets = read_lines(args.target)
                check_pairs(sources, targets, *names)
        except (ValueError, InputError) as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        try:
            translator = loading()
        except MembersDiffer as error:
            parser.error(str(error))
        if args.target_format == "jsonl":
            found = rescored(
                translator, sources, hypotheses, args.batch_size, names, args.length_penalty, args.alignments
            )
            lines = format_translations(found, args.format, n_best=args.format == "plain")
        else:
            lines = score_texts(translator, sources, targets, args, names)
        write_lines(args.output, lines)


def file_name(path: str) -> str:
    return "standard input" if path == "-" else path


def score_texts(translator, sources: list[str], targets: list[str], args, names: tuple[str, str]) -> list[str]:
    """The output lines for a translation a line: its log-probability, or its whole score as JSON."""
    from hf_vanilla_transformer.decoding.alignment import format_alignment
    from hf_vanilla_transformer.translation.output import format_scores

    scores = translator.score(sources, targets, args.batch_size, names, args.length_penalty)
    alignments = [None] * len(scores)
    if args.alignments:
        alignments = [format_alignment(pairs) for pairs in translator.align(sources, targets, args.batch_size)]
    return format_scores(scores, translator.tokenizer, alignments, args.format)


if __name__ == "__main__":
    main()
