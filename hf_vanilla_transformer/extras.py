"""The optional packages and the extras of setup.cfg that install them: what a command that needs a missing one says,
in one line, before any work."""

import importlib

from hf_vanilla_transformer.errors import one_line

EXTRAS = {"ctranslate2": "fast", "matplotlib": "pictures", "onnx": "onnx", "onnxruntime": "onnx", "onnxscript": "onnx"}


def missing_package(package: str, purpose: str) -> str:
    """The one line that says `purpose` needs `package`, and how to install it."""
    extra = EXTRAS[package]
    return (
        f'{purpose} needs the {package} package, which the [{extra}] extra installs: pip install -e ".[{extra}]" '
        f"in this repository (or pip install {package})"
    )


def require(package: str, purpose: str):
    """The module `package`, imported; where it cannot be, an ImportError of one line (`missing_package`), with the
    reason where the package is there but fails to import."""
    try:
        return importlib.import_module(package)
    except ImportError as error:
        reason = "" if isinstance(error, ModuleNotFoundError) and error.name == package else f" ({one_line(error)})"
        raise ImportError(missing_package(package, purpose) + reason) from None
