"""vanilla-push-to-hub: a finished model folder, ours or an export, uploaded to the Hub in one commit (tools/hub.py)."""

import os
import sys

from hf_vanilla_transformer.cli.flags import CommandParser, hub_repo_id
from hf_vanilla_transformer.errors import one_line


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    from hf_vanilla_transformer.tools.hub import check_hub_login, push_model_folder

    parser = CommandParser(
        prog="vanilla-push-to-hub",
        description="Upload a finished model folder (from run_translation.py, vanilla-export-ctranslate2 or "
        "vanilla-export-marian) to a Hugging Face Hub repository in one commit, checkpoints and trainer state left "
        "out; the card's code then names the repository.",
    )
    parser.add_argument("--model", required=True, help="The model folder to upload.")
    parser.add_argument(
        "--repo_id", type=hub_repo_id, required=True, help="The repository, for example your-name/multi30k-en-de."
    )
    parser.add_argument("--private", action="store_true", help="Create the repository private.")
    parser.add_argument("--token", default=None, help="A Hub token (default: the saved login, `hf auth login`).")
    args = parser.parse_args(argv)
    try:
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            raise ValueError(f"{args.model}: not a model folder (no config.json)")
        check_hub_login(args.token)
        url = push_model_folder(args.model, args.repo_id, token=args.token, private=args.private or None)
    except (OSError, ValueError) as error:
        sys.exit(f"{parser.prog}: error: {one_line(error)}")
    print(f"Uploaded {args.model} to {url}")


if __name__ == "__main__":
    main()
