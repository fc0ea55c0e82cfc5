"""vanilla-push-to-hub: a finished model folder, ours or an export, uploaded to the Hub in one commit
(sharing/hub.py)."""

import argparse
import os
import sys

from hf_vanilla_transformer.cli.flags import CommandParser, hub_repo_id
from hf_vanilla_transformer.errors import exit_refused, one_line
from hf_vanilla_transformer.files import InputError
from hf_vanilla_transformer.formats import CONFIG_NAME


class RefuseToken(argparse.Action):
    """--token, refused: a token on the command line shows in `ps` and the shell's history."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        why = "a token on the command line shows in `ps` and the shell's history"
        raise argparse.ArgumentError(self, f"{why}; set HF_TOKEN or log in with `hf auth login`")


def main(argv: list[str] | None = None) -> None:
    """The command: `argv` as on the command line (default: sys.argv[1:])."""
    from hf_vanilla_transformer.sharing.hub import (
        check_hub_login,
        human_size,
        model_files,
        paths_in_brief,
        push_model_folder,
    )

    parser = CommandParser(
        prog="vanilla-push-to-hub",
        description="Upload the model files of a finished folder (from run_translation.py or one of the exports) to "
        "a Hugging Face Hub repository in one commit: weights, configs, tokenizer, code, card, pictures and results; "
        "checkpoints, the trainer's state and arguments, hidden files and anything else stay local. The card's code "
        "then names the repository. The token is HF_TOKEN's, or the login of `hf auth login`.",
    )
    parser.add_argument("--model", required=True, help="The model folder to upload.")
    parser.add_argument(
        "--repo_id", type=hub_repo_id, required=True, help="The repository, for example your-name/multi30k-en-de."
    )
    parser.add_argument("--private", action="store_true", help="Create the repository private.")
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="List the files a push would upload, with their sizes, and those it leaves out; contact nothing.",
    )
    parser.add_argument("--token", action=RefuseToken)
    args = parser.parse_args(argv)
    try:
        uploaded, left_out = model_files(args.model)  # a name that would not print is refused before anything
        if not os.path.isfile(os.path.join(args.model, CONFIG_NAME)):
            raise ValueError(f"{args.model}: not a model folder (no config.json)")
        if args.dry_run:
            sizes = {path: os.path.getsize(os.path.join(args.model, path)) for path in uploaded}
            total = sum(sizes.values())
            print(
                f"Would upload {len(uploaded)} files of {args.model} to {args.repo_id}, "
                f"{human_size(total)} in all ({total:,} bytes):"
            )
            print("".join(f"  {path}  {human_size(size)} ({size:,} bytes)\n" for path, size in sizes.items()), end="")
            if left_out:
                print(f"Left out {len(left_out)} files: {paths_in_brief(left_out)}")
            return
        check_hub_login()
        url = push_model_folder(args.model, args.repo_id, private=args.private or None)
    except InputError as error:
        exit_refused(parser.prog, error)
    except (OSError, ValueError) as error:
        sys.exit(f"{parser.prog}: error: {one_line(error)}")
    print(f"Uploaded {args.model} to {url}")


if __name__ == "__main__":
    main()
