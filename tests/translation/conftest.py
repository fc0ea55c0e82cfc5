"""The fixture translation's tests share with the command line's and the engines' (the same in cli/conftest.py and
engines/conftest.py, built by support/)."""

import pytest


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Two tiny model folders of different seeds, the first's CTranslate2 export, a folder taken for an ONNX export,
    and an input file (support/steering.py)."""
    from support.steering import steering_folders  # imported with the tests that use it

    return steering_folders(tmp_path_factory.mktemp("steering"))
