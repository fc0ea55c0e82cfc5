"""vanilla-attention: attention pictures and step-by-step decoding of one sentence (inspection/capture.py and
inspection/pictures.py)."""

import io
import os
import sys

from hf_vanilla_transformer.cli.flags import CommandParser, device_name, positive_int
from hf_vanilla_transformer.errors import exit_refused
from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.files import OutputDirRefused, atomic_output_dir, check_output_dir, write_text_atomically


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    import warnings

    from hf_vanilla_transformer.inspection.capture import attention_maps, decoding_steps, teacher_forced_steps
    from hf_vanilla_transformer.inspection.pictures import (
        attention_page,
        check_selection,
        format_steps,
        warning_lines,
        write_attention_pictures,
    )
    from hf_vanilla_transformer.loading import load_model_and_tokenizer

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
            check_output_dir(args.output_dir, args.overwrite_output_dir, reads=[args.model])
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
        except OutputDirRefused as error:
            exit_refused(parser.prog, error)
        except (OSError, ValueError, ImportError) as error:
            sys.exit(f"{parser.prog}: error: {error}")
        finally:
            for line in warning_lines([str(warning.message) for warning in caught]):
                print(f"{parser.prog}: {line}", file=sys.stderr)
    print(f"{'target' if maps.teacher_forced else 'translation'}: {maps.translation}")
    for title, steps in step_tables.items():
        print(format_steps(title, steps))
    print(f"wrote {len(paths)} pictures and attention.html to {args.output_dir}")


if __name__ == "__main__":
    main()
