"""vanilla-average-checkpoints: a run's newest checkpoints averaged into a model folder (training/checkpoints.py), as
fairseq's scripts/average_checkpoints.py."""

import os
import sys

from hf_vanilla_transformer.cli.flags import CommandParser
from hf_vanilla_transformer.errors import exit_refused, one_line
from hf_vanilla_transformer.files import OutputDirRefused


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    from hf_vanilla_transformer.training.checkpoints import write_averaged_model

    parser = CommandParser(
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
    except OutputDirRefused as error:
        exit_refused(parser.prog, error)
    except (OSError, ValueError) as error:
        sys.exit(f"{parser.prog}: error: {one_line(error)}")
    print(f"Wrote the mean of {', '.join(os.path.basename(folder) for folder in folders)} to {args.output_dir}")


if __name__ == "__main__":
    main()
