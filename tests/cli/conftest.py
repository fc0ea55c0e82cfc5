"""Fixtures the command-line tests share with the engines' and translation's (the same in engines/conftest.py and
translation/conftest.py, built by support/)."""

import pytest


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Two tiny model folders of different seeds, the first's CTranslate2 export, a folder taken for an ONNX export,
    and an input file (support/steering.py)."""
    from support.steering import steering_folders  # imported with the tests that use it

    return steering_folders(tmp_path_factory.mktemp("steering"))


@pytest.fixture
def work(tmp_path, monkeypatch) -> dict:
    """A working folder (the current one) with an input file, a model folder and a CTranslate2 folder, both broken,
    and each command's flags for them (support/commands.py)."""
    from support.commands import broken_work

    monkeypatch.chdir(tmp_path)
    return broken_work(tmp_path)
