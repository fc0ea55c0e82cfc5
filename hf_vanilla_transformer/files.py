"""Files: input read line by line, with errors that name the line; output written so that an interrupted or failed
command never leaves a file or folder that looks complete."""

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


class InputError(ValueError):
    """Input that cannot be used: a file, a line, a row of data; the message says where and why."""


def check_output_dir(output_dir: str, overwrite_output_dir: bool, source: str | None = None) -> None:
    """Refuse to replace a non-empty folder unless asked to, or one that is or holds `source` (the folder the
    command reads, which replacing it would delete), before any work is done."""
    if (
        source is not None
        and os.path.exists(source)
        and Path(source).resolve().is_relative_to(Path(output_dir).resolve())
    ):
        raise ValueError(f"output_dir {output_dir} is or holds the model folder {source}; replacing it would delete it")
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not overwrite_output_dir:
        raise ValueError(f"output_dir {output_dir} exists and is not empty; add overwrite_output_dir to replace it")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"output_dir {output_dir} exists and is not a folder")


def replace_atomically(path: str, write: Callable[[str], object]) -> None:
    """`write(PATH.partial)`, then rename it to `path`: a reader never sees half a file, and an interrupted write
    (an error, Ctrl-C) removes what it wrote."""
    temporary = f"{path}.partial"
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def write_text_atomically(path: str, text: str) -> None:
    """Write `text` to `path` as UTF-8, all or nothing (`replace_atomically`)."""

    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)

    replace_atomically(path, write)


@contextmanager
def atomic_output_dir(output_dir: str, overwrite_output_dir: bool = False) -> Iterator[str]:
    """Yield a temporary folder beside `output_dir`; on success it replaces `output_dir`, on error it is removed."""
    check_output_dir(output_dir, overwrite_output_dir)
    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(output_dir))}.", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is private; the result should not be
    try:
        yield staging
        if os.path.isdir(output_dir):
            shutil.rmtree(output_dir)
        os.rename(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def numbered_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 file, its line end kept; errors name the file and line."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    with open(path, "rb") as file:
        yield from decoded_lines(file, path)


def decoded_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[tuple[int, str]]:
    """`raw_lines` (a binary file or stream) decoded as UTF-8 line by line, not by the text layer's chunks, so that
    an error names the line it is on. Lines end at b"\\n" only: str.splitlines would also split at U+2028 or
    U+0085 inside a sentence, and a translation would no longer be on its source's line."""
    for line_number, raw in enumerate(raw_lines, 1):
        try:
            # a byte-order mark (Windows editors write one) is not part of the first line's text
            text = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
            if text:  # empty only for a file that holds a byte-order mark and nothing else
                yield line_number, text
        except UnicodeDecodeError as error:
            raise InputError(
                f"{name}:{line_number}: not UTF-8 text ({error.reason} at byte {error.start + 1} of the line)"
            ) from None
