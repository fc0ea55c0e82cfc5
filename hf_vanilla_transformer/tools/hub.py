"""The Hub: checking a login and pushing a finished model folder, ours or an export, in one commit."""

from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, ModelCard
from huggingface_hub.utils import filter_repo_objects

from hf_vanilla_transformer.errors import one_line

# What run_translation.py's output folder holds that is not part of the model: the Trainer's own state.
NOT_UPLOADED = ["checkpoint-*", "checkpoint-*/**", "runs/**", "training_args.bin", "*.partial"]


def check_hub_login(token: str | None = None) -> str:
    """The Hub user that `token` (or the saved login) is, or a one-line ValueError: before a run trains for hours
    and then fails to upload, or before a push starts."""
    try:
        return HfApi(token=token).whoami()["name"]
    # whoami makes one request and nothing else: whatever fails (no token and offline mode are OSErrors, a refused
    # token or an unreachable Hub come from huggingface_hub's HTTP library, httpx or httpx2 by version) means no push
    except Exception as error:
        raise ValueError(
            f"cannot push to the Hugging Face Hub ({one_line(error)}); log in with `hf auth login` or give a token, "
            "or push the finished folder later with vanilla-push-to-hub"
        ) from None


def push_model_folder(
    folder: str, repo_id: str, token: str | None = None, private: bool | None = None, commit_message: str = ""
) -> str:
    """Upload a finished model folder (ours, or an export of it: weights, config, code, tokenizer, card, results)
    as one commit. The card's code names the model by the card's `model_name` (a local path until now): in the
    upload it names `repo_id`."""
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    root = Path(folder)
    paths = sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file())
    operations = [
        CommitOperationAdd(path_in_repo=path, path_or_fileobj=card_for(root / path, repo_id) or str(root / path))
        for path in filter_repo_objects(paths, ignore_patterns=NOT_UPLOADED)
    ]
    commit = api.create_commit(
        repo_id, operations, commit_message=commit_message or "Upload model trained with hf-vanilla-transformer"
    )
    return commit.commit_url


def card_for(path: Path, repo_id: str) -> bytes | None:
    """The model card at `path` as it reads in repository `repo_id`; None for any other file."""
    if path.name != "README.md":
        return None
    card = ModelCard.load(path)
    old_id = card.data.model_name
    if old_id and old_id != repo_id:
        card.text = card.text.replace(f'"{old_id}"', f'"{repo_id}"').replace(f"--model {old_id}", f"--model {repo_id}")
        card.data.model_name = repo_id  # also the model-index's name
    return str(card).encode("utf-8")
