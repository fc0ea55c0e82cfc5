"""The Hub: checking a login and pushing a finished model folder, ours or an export, in one commit."""

import os
import shlex
from collections import Counter
from fnmatch import fnmatchcase
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, ModelCard

from hf_vanilla_transformer.errors import one_line
from hf_vanilla_transformer.files import UNPRINTABLE_IN_A_NAME, InputError, unprintable_character
from hf_vanilla_transformer.formats import CARD_NAME, UPLOADED
from hf_vanilla_transformer.sharing.markdown import code_literal


def check_hub_login(token: str | None = None) -> str:
    """The Hub user that `token` (or HF_TOKEN, or the saved login) is, or a one-line ValueError: before a run
    trains for hours and then fails to upload, or before a push starts."""
    try:
        return HfApi(token=token).whoami()["name"]
    # whoami makes one request and nothing else: whatever fails (no token and offline mode are OSErrors, a refused
    # token or an unreachable Hub come from huggingface_hub's HTTP library, httpx or httpx2 by version) means no push
    except Exception as error:
        raise ValueError(
            f"cannot push to the Hugging Face Hub ({one_line(error)}); log in with `hf auth login` or set HF_TOKEN, "
            "or push the finished folder later with vanilla-push-to-hub"
        ) from None


def model_files(folder: str) -> tuple[list[str], list[str]]:
    """The files under `folder` that a push uploads (UPLOADED) and those it leaves out, as sorted paths relative to
    it. A link is judged by the file it leads to: uploaded (as that file) where that is a model file of the folder,
    left out where it is hidden, not a model file (a checkpoint's state), not a file, or outside the folder.
    A name that does not print on one line, the folder's own or one in it, is refused (`check_printable`)."""
    check_printable(folder, "the model folder")
    root = Path(os.path.realpath(folder))
    uploaded, left_out = [], []
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        check_printable(name, f"{folder}: the name")
        if path.is_dir() and not path.is_symlink():
            continue
        target = Path(os.path.realpath(path))  # the path itself, but for a link (a loop: a path that is no file)
        is_model_file = (
            is_model_file_name(name)
            and target.is_file()
            and target.is_relative_to(root)
            and is_model_file_name(target.relative_to(root).as_posix())
        )
        (uploaded if is_model_file else left_out).append(name)
    return uploaded, left_out


def is_model_file_name(name: str) -> bool:
    """Whether `name`, a path relative to a model folder, is a model file's: it matches a pattern of UPLOADED at the
    pattern's depth, and no part of it is hidden."""
    return any(
        name.count("/") == pattern.count("/") and fnmatchcase(name, pattern) for pattern in UPLOADED
    ) and not any(part.startswith(".") for part in name.split("/"))


# What a name may not hold (files.py's UNPRINTABLE_IN_A_NAME), and the stand-ins for bytes that are not UTF-8 which
# os.fsdecode gives (surrogates): such a name neither prints nor is a path on the Hub
UNPRINTABLE_IN_A_FILE_NAME = UNPRINTABLE_IN_A_NAME | {"Cs"}


def check_printable(name: str, what: str) -> None:
    """Refuse `name` (an InputError naming it as `what`) if it holds a character that would break its line in a
    listing or a message (`--dry_run`'s, where a line break in a name forges the next line), hide in it, or that
    is not UTF-8."""
    if (found := unprintable_character(name, UNPRINTABLE_IN_A_FILE_NAME)) is not None:
        position, character = found
        raise InputError(
            f"{what} {name!r} holds the unprintable character {character!r} (character {position}); rename it"
        )


def human_size(size: int) -> str:
    """`size` bytes in the largest binary unit it reaches: `512 B`, `1.5 KiB`, `2.0 GiB`."""
    if size < 1024:
        return f"{size} B"
    power = min((size.bit_length() - 1) // 10, 5)
    return f"{size / 1024**power:.1f} {'KMGTP'[power - 1]}iB"


def paths_in_brief(paths: list[str]) -> str:
    """`paths` on one line, the files of a folder as the folder and their count: `checkpoint-5/ (9), .env`."""
    entries = Counter(path.split("/")[0] + ("/" if "/" in path else "") for path in paths)
    return ", ".join(f"{entry} ({count})" if entry.endswith("/") else entry for entry, count in entries.items())


def push_model_folder(
    folder: str, repo_id: str, token: str | None = None, private: bool | None = None, commit_message: str = ""
) -> str:
    """Upload the model files of a finished folder (`model_files`: ours, or an export of it) as one commit. The
    card's code names the model by the card's `model_name` (a local path until now): in the upload it names
    `repo_id`. `token` defaults to HF_TOKEN or the saved login."""
    uploaded = model_files(folder)[0]  # a name refused before the repository is made
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    root = Path(folder)
    operations = [
        CommitOperationAdd(path_in_repo=path, path_or_fileobj=card_for(root / path, repo_id) or str(root / path))
        for path in uploaded
    ]
    commit = api.create_commit(
        repo_id, operations, commit_message=commit_message or "Upload model trained with hf-vanilla-transformer"
    )
    return commit.commit_url


def card_for(path: Path, repo_id: str) -> bytes | None:
    """The model card at `path` as it reads in repository `repo_id`; None for any other file."""
    if path.name != CARD_NAME:
        return None
    card = ModelCard.load(path)
    old_id = card.data.model_name
    if old_id and old_id != repo_id:
        # the cards write an id as a code literal, and as a shell word (card.py): the same forms are looked for
        card.text = card.text.replace(code_literal(old_id), code_literal(repo_id))
        card.text = card.text.replace(f"--model {shlex.quote(old_id)}", f"--model {shlex.quote(repo_id)}")
        card.data.model_name = repo_id  # also the model-index's name
    return str(card).encode("utf-8")
