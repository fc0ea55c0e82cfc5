"""vanilla-export-onnx: a model folder written as ONNX graphs for transformers.js and ONNX Runtime
(export/onnx.py)."""

import sys

from hf_vanilla_transformer.cli.flags import CommandParser
from hf_vanilla_transformer.errors import exit_refused
from hf_vanilla_transformer.files import OutputDirRefused


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    from hf_vanilla_transformer.export.onnx import export

    parser = CommandParser(
        prog="vanilla-export-onnx",
        description="Export a trained model folder to ONNX (float32 and int8) in the layout transformers.js and "
        "ONNX Runtime load: the model through its exact MarianMTModel form, decoded greedily.",
    )
    parser.add_export_flags("ONNX")
    args = parser.parse_args(argv)
    try:
        export(args.model, args.output_dir, args.overwrite_output_dir)
    except OutputDirRefused as error:
        exit_refused(parser.prog, error)
    except (OSError, ValueError, ImportError) as error:
        sys.exit(f"{parser.prog}: error: {error}")
    print(f"Wrote ONNX graphs (float32 and int8) to {args.output_dir}")


if __name__ == "__main__":
    main()
