"""The releases the package supports: setup.cfg's floors are the ones the code checks and records, and below the
transformers floor, importing the package or loading a saved folder as remote code fails in one line naming both
versions. `.ci/run` runs the quick tier a second time at the transformers floor."""

import configparser
import re
import subprocess
import sys

import pytest

from hf_vanilla_transformer.model.configuration_vanilla_transformer import REQUIRED_VERSIONS
from support.models import tiny_model
from support.paths import REPO_ROOT

BELOW_THE_FLOOR = "5.15.1"  # the release before the floor (a venv over the installed packages)


def test_setup_cfg_asks_for_the_releases_the_code_checks():
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg")
    requirements = dict(
        re.fullmatch(r"([\w-]+)(.*)", line.strip()).groups()
        for line in setup["options"]["install_requires"].strip().splitlines()
    )
    assert requirements["transformers"] == f">={REQUIRED_VERSIONS['transformers'].removesuffix('.0')},<6"
    assert requirements["torch"] == f">={REQUIRED_VERSIONS['torch'].removesuffix('.0')}"


@pytest.fixture(scope="module")
def below_the_floor(tmp_path_factory):
    """A Python whose transformers is the release before the floor, everything else as installed."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", f"transformers=={BELOW_THE_FLOOR}"],  # with the releases it needs
        check=True,
        capture_output=True,
        timeout=600,
    )
    return python


def failure_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_below_the_floor_the_package_does_not_import_and_says_why_in_one_line(below_the_floor):
    result = subprocess.run(
        [below_the_floor, "-c", "import hf_vanilla_transformer"], capture_output=True, text=True, timeout=300
    )
    floor = REQUIRED_VERSIONS["transformers"]
    assert failure_line(result) == (
        f"ImportError: hf-vanilla-transformer needs transformers >= {floor}; this Python has transformers "
        f"{BELOW_THE_FLOOR} (pip install -U 'transformers>={floor}')"
    )


@pytest.mark.slow
def test_below_the_floor_a_saved_folder_loaded_as_remote_code_says_why_in_one_line(below_the_floor, tmp_path):
    tiny_model().save_pretrained(tmp_path / "model")
    code = (
        'import sys; sys.modules["hf_vanilla_transformer"] = None\n'  # as where the package is not installed
        "from transformers import AutoModelForSeq2SeqLM\n"
        f"AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / 'model')!r}, trust_remote_code=True)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([below_the_floor, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert failure_line(result).startswith(
        f"ImportError: hf-vanilla-transformer needs transformers >= {REQUIRED_VERSIONS['transformers']}; this Python "
        f"has transformers {BELOW_THE_FLOOR}"
    )
