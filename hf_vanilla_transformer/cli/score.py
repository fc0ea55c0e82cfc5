"""vanilla-score: the model's score of given translations, one pair a line of two files (tools/scoring.py)."""

import json

from hf_vanilla_transformer.cli.flags import (
    CommandParser,
    check_output_is_not_an_input,
    device_name,
    input_file,
    output_file,
    positive_int,
    reported,
)


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    import torch

    from hf_vanilla_transformer.tools.alignment import align, format_alignment
    from hf_vanilla_transformer.tools.export_ctranslate2 import is_ctranslate2_folder
    from hf_vanilla_transformer.tools.scoring import check_pairs, score_lines
    from hf_vanilla_transformer.tools.translate import read_lines, translator_loader, write_lines

    parser = CommandParser(
        prog="vanilla-score",
        description="Score given translations with a trained model (forced decoding): for each line of --target, "
        "the log-probability the model gives it as the translation of the same line of --source. A CTranslate2 "
        "folder (vanilla-export-ctranslate2) is scored with CTranslate2.",
    )
    parser.add_argument("--model", required=True, help="A model folder or a Hub id (downloaded, or from the cache).")
    parser.add_argument(
        "--source", type=input_file, required=True, help="File of source sentences, one a line ('-': standard input)."
    )
    parser.add_argument(
        "--target", type=input_file, required=True, help="File of their translations, one a line ('-': standard input)."
    )
    parser.add_argument(
        "--output", type=output_file, default="-", help="File to write the scores to ('-': standard output)."
    )
    parser.add_argument(
        "--format",
        choices=["plain", "jsonl"],
        default="plain",
        help="plain: each pair's log-probability, one a line; jsonl: a JSON object a line with log_probability, score "
        "(log-probability / length^length_penalty, the model's length penalty, as beam search ranks), tokens and "
        "token_log_probs.",
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
    if args.alignments and is_ctranslate2_folder(args.model):
        parser.error(f"argument --alignments: for model folders; {args.model} is a CTranslate2 folder")
    if args.source == args.target == "-":
        parser.error("argument --target: --source already reads standard input; give one of them as a file")
    check_output_is_not_an_input(parser, args.output, {"--source": args.source, "--target": args.target})
    with reported(parser.prog):
        torch.set_num_threads(args.threads or 1)  # one intra-op thread by default, as vanilla-translate
        # what the model's folder refuses before the input is read, and bad input before the model is loaded
        eager = "eager" if args.alignments else None  # attention weights come from the eager path only
        load_translator = translator_loader(args.model, args.device, args.dtype, args.threads, eager)
        sources, targets = read_lines(args.source), read_lines(args.target)
        names = (file_name(args.source), file_name(args.target))
        try:
            check_pairs(sources, targets, *names)
        except ValueError as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        translator = load_translator()
        scores = score_lines(translator, sources, targets, args.batch_size, names)
        alignments = [None] * len(scores)
        if args.alignments:
            alignments = [
                format_alignment(pairs)
                for pairs in align(translator.model, translator.tokenizer, sources, targets, batch_size=args.batch_size)
            ]
        if args.format == "plain":
            lines = [
                str(score.log_probability) if alignment is None else f"{score.log_probability} ||| {alignment}"
                for score, alignment in zip(scores, alignments, strict=True)
            ]
        else:
            lines = [
                json_line(score, translator.tokenizer, alignment)
                for score, alignment in zip(scores, alignments, strict=True)
            ]
        write_lines(args.output, lines)


def file_name(path: str) -> str:
    return "standard input" if path == "-" else path


def json_line(score, tokenizer, alignment: str | None = None) -> str:
    """A pair's `SequenceScore` as one JSON object, its tokens as the tokenizer spells them, and its alignment."""
    tokens = tokenizer.convert_ids_to_tokens(score.token_ids)
    fields = {
        "log_probability": score.log_probability,
        "score": score.score,
        "tokens": tokens,
        "token_log_probs": score.token_log_probs,
    }
    return json.dumps(fields | ({"alignment": alignment} if alignment is not None else {}), ensure_ascii=False)


if __name__ == "__main__":
    main()
