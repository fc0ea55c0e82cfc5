"""vanilla-export-marian: a model folder written as transformers' own MarianMTModel (export/marian.py)."""

import sys

from hf_vanilla_transformer.cli.flags import CommandParser
from hf_vanilla_transformer.errors import exit_refused
from hf_vanilla_transformer.files import OutputDirRefused


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    from hf_vanilla_transformer.export.marian import export

    parser = CommandParser(
        prog="vanilla-export-marian",
        description="Export a trained model folder to transformers' own MarianMTModel: the same model, loaded by "
        "plain transformers with no code of ours and no trust_remote_code.",
    )
    parser.add_export_flags("MarianMTModel")
    args = parser.parse_args(argv)
    try:
        export(args.model, args.output_dir, args.overwrite_output_dir)
    except OutputDirRefused as error:
        exit_refused(parser.prog, error)
    except (OSError, ValueError) as error:
        sys.exit(f"{parser.prog}: error: {error}")
    print(f"Wrote a MarianMTModel to {args.output_dir}")


if __name__ == "__main__":
    main()
