"""The Hugging Face Hub at its HTTP boundary: requests answered here, downloads laid out as huggingface_hub caches
them."""

import base64
import importlib
import json
import os
import re
from contextlib import contextmanager

import pytest

HUB_TOKEN = "hf_intercepted"  # the login within intercepted_hub where the test sets no HF_TOKEN of its own


@contextmanager
def intercepted_hub(commits: list, requests: list | None = None):
    """huggingface_hub (and transformers through it) as they are, with the Hub behind their HTTP client replaced:
    each request is answered here and none leaves the machine. A commit is recorded in `commits` as (repo_id,
    {path: bytes}); every request, headers and all, in `requests` when given.

    The Hub answers as to the user `someone` with a new repository: it creates any repository, has no file to
    download, and asks for every file of a commit inline ("regular", no LFS or Xet upload). It checks a README's
    metadata (`/api/validate-yaml`) with huggingface_hub's own `ModelCard`, which raises on YAML or `model-index`
    it cannot read. The tests' offline mode (conftest.py), which stops requests before they reach the client's
    transport, is lifted inside; HF_TOKEN is HUB_TOKEN unless the test set one.
    """
    from huggingface_hub import ModelCard, constants, get_session

    # the HTTP library of this huggingface_hub: httpx2 from 2.0, httpx before (transformers' floor release)
    http = importlib.import_module(type(get_session()).__module__.split(".")[0])

    def answer(request):
        request.read()
        if requests is not None:
            requests.append(request)
        path, body = request.url.path, request.content
        if path == "/api/whoami-v2":
            return http.Response(200, json={"type": "user", "name": "someone"})
        if path == "/api/repos/create":
            repo = json.loads(body)
            return http.Response(200, json={"url": f"{constants.ENDPOINT}/{repo['organization']}/{repo['name']}"})
        if path == "/api/validate-yaml":
            try:
                ModelCard(json.loads(body)["content"])
            except Exception as error:
                return http.Response(400, json={"errors": [{"message": str(error)}]})
            return http.Response(200, json={"errors": [], "warnings": []})
        if re.fullmatch(r"/api/models/.+/preupload/main", path):
            files = [
                {"path": file["path"], "uploadMode": "regular", "shouldIgnore": False}
                for file in json.loads(body)["files"]
            ]
            return http.Response(200, json={"files": files})
        if commit := re.fullmatch(r"/api/models/(.+)/commit/main", path):
            lines = [json.loads(line) for line in body.splitlines()]
            files = {
                line["value"]["path"]: base64.b64decode(line["value"]["content"])
                for line in lines
                if line["key"] == "file"
            }
            commits.append((commit[1], files))
            url = f"{constants.ENDPOINT}/{commit[1]}/commit/{'0' * 40}"
            return http.Response(200, json={"commitUrl": url, "commitOid": "0" * 40})
        return http.Response(404, headers={"X-Error-Code": "EntryNotFound"}, json={"error": "Entry not found"})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http.HTTPTransport, "handle_request", lambda self, request: answer(request))
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        if "HF_TOKEN" not in os.environ:
            patch.setenv("HF_TOKEN", HUB_TOKEN)
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
