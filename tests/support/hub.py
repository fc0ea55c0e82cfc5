"""The Hugging Face Hub at its HTTP boundary: commits intercepted, downloads laid out as huggingface_hub caches them."""

from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def intercepted_hub(commits: list):
    """huggingface_hub with the network calls of an upload (and of the login check before it) replaced: the commit
    is recorded, not sent.

    The Hub checks a README's metadata server-side (`/api/validate-yaml`); here it is parsed by huggingface_hub's
    own `ModelCard`, which raises on YAML or `model-index` it cannot read.
    """
    from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl

    def create_repo(self, repo_id, *args, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, *args, **kwargs):
        files = {}
        for operation in operations:
            source = operation.path_or_fileobj
            files[operation.path_in_repo] = Path(source).read_bytes() if isinstance(source, (str, Path)) else source
        commits.append((repo_id, files))
        return CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/{'0' * 40}",
            commit_message=kwargs.get("commit_message", ""),
            commit_description="",
            oid="0" * 40,
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HfApi, "create_repo", create_repo)
        patch.setattr(HfApi, "create_commit", create_commit)
        patch.setattr(HfApi, "whoami", lambda self, *args, **kwargs: {"name": "someone"})
        patch.setattr(HfApi, "_validate_yaml", lambda self, content, **kwargs: ModelCard(content))
        yield


def hub_snapshot(cache, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay `files` out as huggingface_hub's cache holds a downloaded repository (refs/main -> snapshots/<sha>)."""
    repo = cache / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("1" * 40)
    for name, content in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(content)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("1" * 40)
