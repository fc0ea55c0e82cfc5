"""vanilla-export-ctranslate2: a model folder written as a CTranslate2 folder (export/ctranslate2.py)."""

import sys

from hf_vanilla_transformer.cli.flags import CommandParser
from hf_vanilla_transformer.errors import exit_refused
from hf_vanilla_transformer.files import OutputDirRefused


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    from hf_vanilla_transformer.export.ctranslate2 import QUANTIZATIONS, export

    parser = CommandParser(
        prog="vanilla-export-ctranslate2",
        description="Export a trained model folder to CTranslate2, OpenNMT's inference engine, for fast CPU "
        "translation (needs the [fast] extra).",
    )
    parser.add_export_flags("CTranslate2 model")
    parser.add_argument("--quantization", default="float32", choices=QUANTIZATIONS, help="Weight type.")
    args = parser.parse_args(argv)
    try:
        export(args.model, args.output_dir, args.quantization, args.overwrite_output_dir)
    except OutputDirRefused as error:
        exit_refused(parser.prog, error)
    except (OSError, ValueError, ImportError) as error:
        sys.exit(f"{parser.prog}: error: {error}")
    print(f"Wrote a CTranslate2 model ({args.quantization}) to {args.output_dir}")


if __name__ == "__main__":
    main()
