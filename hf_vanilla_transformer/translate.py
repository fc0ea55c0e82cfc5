"""Translate a file or standard input with a trained model, one sentence a line.

    vanilla-translate --model runs/multi30k-small --input sentences.en --output sentences.de
    echo "A man is sleeping." | python -m hf_vanilla_transformer.translate --model runs/multi30k-small

Input and output are UTF-8, files and standard streams alike. Lines are sorted by length into batches, so that
little padding is computed, and written back in input order; an empty line stays an empty line. Decoding is the
model's own (for ours the paper's: beam 4, length penalty 0.6, at most source length + 50 tokens) unless
--num_beams or --max_new_tokens say otherwise.
"""

import argparse
import io
import logging
import signal
import sys

from tqdm.auto import tqdm

from hf_vanilla_transformer.cli import command_line_error
from hf_vanilla_transformer.data import decoded_lines, numbered_lines
from hf_vanilla_transformer.files import write_text_atomically
from hf_vanilla_transformer.loading import load_model_and_tokenizer

logger = logging.getLogger("vanilla-translate")

# the parameters of the functions below that the command line sets with a flag of another name
FLAGS = {"model_path": "model"}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vanilla-translate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="A model folder (from run_translation.py or the Hub cache).")
    parser.add_argument("--input", default="-", help="File of sentences, one a line ('-': standard input).")
    parser.add_argument("--output", default="-", help="File to write translations to ('-': standard output).")
    parser.add_argument("--num_beams", type=int, default=None, help="Beam size (default: the model's).")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="Longest translation, in tokens.")
    parser.add_argument("--batch_size", type=int, default=32, help="Sentences translated together.")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available).")
    return parser.parse_args(argv)


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM (a job scheduler's stop): unwinds like KeyboardInterrupt, so no half-written output stays."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, _raise_interrupted)
    try:
        translate_file(args)
    except Interrupted as interruption:
        print("\nvanilla-translate: interrupted; nothing was written", file=sys.stderr)
        sys.exit(interruption.exit_code)
    except (OSError, ValueError) as error:
        sys.exit(f"vanilla-translate: error: {command_line_error(error, FLAGS)}")


def translate_file(args: argparse.Namespace) -> None:
    if isinstance(sys.stdout, io.TextIOWrapper):  # standard output is UTF-8 too, whatever the locale says
        sys.stdout.reconfigure(encoding="utf-8")
    lines = read_lines(args.input)
    translator = load_translator(args.model, args.device)
    generate_kwargs = {
        key: value for key, value in (("num_beams", args.num_beams), ("max_new_tokens", args.max_new_tokens)) if value
    }
    translations = translate_lines(translator, lines, args.batch_size, generate_kwargs, show_progress=args.input != "-")
    write_lines(args.output, translations)


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 file ('-': standard input, read as bytes whatever the locale), blank ones included."""
    numbered = decoded_lines(sys.stdin.buffer, "standard input") if path == "-" else numbered_lines(path)
    return [line.rstrip("\r\n") for _, line in numbered]


def load_translator(model_path: str, device: str | None):
    """A TranslationPipeline over the folder's model and tokenizer."""
    from hf_vanilla_transformer.pipeline_translation import TranslationPipeline

    model, tokenizer = load_model_and_tokenizer(model_path, device)
    return TranslationPipeline(model=model, tokenizer=tokenizer, device=model.device)


def translate_lines(translator, lines: list[str], batch_size: int, generate_kwargs: dict, show_progress: bool):
    """Translations of `lines`, in order; blank lines give empty lines. Batches hold sentences of similar length.
    Only strings are kept, never a batch's tensors, so memory grows with the text alone."""
    todo = [i for i, line in enumerate(lines) if line.strip()]
    lengths = token_counts(translator.tokenizer, [lines[i] for i in todo])
    positions = translator.model.config.max_position_embeddings
    too_long = [index + 1 for index, length in zip(todo, lengths, strict=True) if length > positions]
    if too_long:
        logger.warning(
            "%d line(s) have more tokens than the model's %d positions; only their first %d are translated "
            "(line %s%s)",
            len(too_long), positions, positions, too_long[0], ", ..." if len(too_long) > 1 else "",
        )  # fmt: skip
    order = [todo[j] for j in sorted(range(len(todo)), key=lengths.__getitem__, reverse=True)]
    translations = [""] * len(lines)
    outputs = translator((lines[i] for i in order), batch_size=batch_size, **generate_kwargs)
    for index, output in tqdm(
        zip(order, outputs, strict=False), total=len(order), disable=not show_progress, unit="sentence", file=sys.stderr
    ):
        # a translation is one line of output whatever the model writes, or every later line would be misplaced
        translations[index] = " ".join(output[0]["translation_text"].splitlines())
    return translations


def token_counts(tokenizer, texts: list[str], chunk: int = 4096) -> list[int]:
    """The number of tokens of each text, tokenized a chunk at a time so that all the ids are never held at once."""
    return [
        len(ids)
        for start in range(0, len(texts), chunk)
        for ids in tokenizer(texts[start : start + chunk])["input_ids"]
    ]


def write_lines(path: str, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        return
    write_text_atomically(path, text)


if __name__ == "__main__":
    main()
