"""Files: input read line by line, with errors that name the line; output written so that an interrupted or failed
command never leaves a file or folder that looks complete."""

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)


class InputError(ValueError):
    """Input that cannot be used: a file, a line, a row of data; the message says where and why."""


class OutputDirRefused(ValueError):
    """An output folder that no flag lets a command write (`check_output_dir_is_ours`): a refused argument."""


# Characters that would break a name's one line in a message or a card's Markdown title, or hide in it unseen:
# control characters (newline, tab, escape), format characters (zero-width, right-to-left marks), line and paragraph
# separators
UNPRINTABLE_IN_A_NAME = {"Cc", "Cf", "Zl", "Zp"}


def unprintable_character(name: str, categories: set[str] = UNPRINTABLE_IN_A_NAME) -> tuple[int, str] | None:
    """The first character of `name` of a Unicode category in `categories`, with its position (from 1); None."""
    found = (
        (position, character)
        for position, character in enumerate(name, 1)
        if unicodedata.category(character) in categories
    )
    return next(found, None)


def check_output_dir_is_ours(output_dir: str, reads: Iterable[str | None] = ()) -> None:
    """Refuse, whatever the flags say, an output folder the command does not own, before anything is touched: an
    empty name (which os.path makes the working folder), a name with a character of UNPRINTABLE_IN_A_NAME, and a
    folder that is or holds the working folder ("." and "/" among them), the home folder, or a path in `reads` (what
    the command reads; None and paths that do not exist, such as Hub ids, are skipped). A link counts as the folder
    it leads to."""
    if not output_dir:
        raise OutputDirRefused("output_dir is empty; give the name of the folder to write")
    if (found := unprintable_character(output_dir)) is not None:
        position, character = found
        raise OutputDirRefused(
            f"output_dir {output_dir!r} holds the unprintable character {character!r} (character {position}); "
            "give a name without it"
        )
    folder = Path(os.path.realpath(output_dir))
    cwd, home = os.getcwd(), os.path.expanduser("~")  # "~" where no home folder is known
    kept = [(cwd, f"the working folder {cwd}"), (home, f"the home folder {home}")]
    kept += [(path, f"{path}, which this command reads") for path in reads if path is not None and os.path.exists(path)]
    for path, what in kept:
        if Path(os.path.realpath(path)).is_relative_to(folder):
            raise OutputDirRefused(f"output_dir {output_dir} is or holds {what}; writing there would destroy it")


def check_output_dir(output_dir: str, overwrite_output_dir: bool, reads: Iterable[str | None] = ()) -> None:
    """Refuse, before any work is done, a folder the command does not own (`check_output_dir_is_ours`), a non-empty
    folder unless asked to replace it, and a file in the folder's place."""
    check_output_dir_is_ours(output_dir, reads)
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not overwrite_output_dir:
        raise ValueError(f"output_dir {output_dir} exists and is not empty; add overwrite_output_dir to replace it")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"output_dir {output_dir} exists and is not a folder")


def replace_atomically(path: str, write: Callable[[str], object]) -> None:
    """`write(temporary)`, flushed to disk, then renamed to `path`: a reader never sees half a file, a crash or a
    full disk leaves the old file or the new one whole, and an interrupted write (an error, Ctrl-C) removes what it
    wrote. The temporary file (`.NAME.XXXX.partial` beside `path`) has a name of its own, so that two writers of the
    same path never write into one file."""
    folder, name = os.path.split(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder)
    os.close(descriptor)
    try:
        os.chmod(temporary, 0o666 & ~current_umask())  # mkstemp's file is private; the result should not be
        write(temporary)
        flush_to_disk(temporary)
        os.replace(temporary, path)
    except OSError as error:  # a full disk, a file size limit: say which file could not be written
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        if error.filename is not None:
            raise
        raise OSError(error.errno, f"cannot write {path} ({error.strerror})") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def flush_to_disk(path: str) -> None:
    """Make the system write `path`'s data to the disk now: a rename is on disk before the data it names otherwise
    (ext4's delayed allocation), and a power cut would leave an empty file under the final name."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def current_umask() -> int:
    """The process's umask (reading it means setting it: it is set straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def write_text_atomically(path: str, text: str) -> None:
    """Write `text` to `path` as UTF-8, all or nothing (`replace_atomically`)."""

    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)

    replace_atomically(path, write)


# The folders atomic_output_dir keeps beside OUTPUT (hidden, so that none looks like a finished folder), each named
# with the process that made it: the folder being written, the replaced one set aside, and that one being deleted.
STAGING, REPLACED, DELETING = "partial", "replaced", "deleting"


@contextmanager
def atomic_output_dir(output_dir: str, overwrite_output_dir: bool = False) -> Iterator[str]:
    """Yield a temporary folder beside `output_dir`; on success it replaces `output_dir`, on error it is removed.

    The replacement is three renames, so that `output_dir` is always the old folder whole, the new one whole or (for
    the moment between the first two renames) absent: the old folder is set aside, the new one moved in, and the old
    one renamed for deletion and deleted. What a killed process left of this (its hidden folders) is cleaned up by
    the next call for the same `output_dir`, which first puts a set-aside old folder back where no folder took its
    place (`clean_up_after_killed_writers`). A link to a folder is written through: the folder it leads to is
    replaced, beside itself, and the link kept; a folder the command does not own is refused before anything is
    touched (`check_output_dir_is_ours`)."""
    check_output_dir_is_ours(output_dir)  # before the clean-up touches anything beside it
    target = os.path.realpath(output_dir)  # output_dir, or the folder a link leads to
    # beside the link given too: a writer that replaced the link itself, not what it leads to, left its folders there
    for place in {os.path.abspath(output_dir), target}:
        clean_up_after_killed_writers(place)
    check_output_dir(output_dir, overwrite_output_dir)
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.{STAGING}-{os.getpid()}-", dir=parent)
    os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's folder is private; the result should not be
    try:
        yield staging
        replaced = None
        if os.path.isdir(target):
            replaced = os.path.join(parent, f".{name}.{REPLACED}-{os.getpid()}")
            os.rename(target, replaced)
        os.rename(staging, target)
        if replaced is not None:
            deleting = os.path.join(parent, f".{name}.{DELETING}-{os.getpid()}")
            os.rename(replaced, deleting)  # from here on it is no longer whole: never put back
            shutil.rmtree(deleting)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def clean_up_after_killed_writers(output_dir: str) -> None:
    """Remove what killed `atomic_output_dir`s for `output_dir` left beside it: their unfinished folders and old
    folders being deleted; an old folder set aside is put back if nothing replaced it (a kill between the two
    renames), else deleted. Folders of a process still running are its own business and left alone. A link or a
    file of such a name (a writer that set a linked output folder aside by renaming the link) is removed, never
    what a link leads to."""
    parent, name = os.path.split(output_dir)
    if not os.path.isdir(parent):
        return
    left = re.compile(rf"\.{re.escape(name)}\.({STAGING}|{REPLACED}|{DELETING})-(\d+)(-.*)?")
    for entry in sorted(os.listdir(parent)):
        match = left.fullmatch(entry)
        if match is None or process_is_running(int(match[2])):
            continue
        path = os.path.join(parent, entry)
        if match[1] == REPLACED and not os.path.lexists(output_dir):
            os.rename(path, output_dir)
            logger.warning("%s: put back the folder a killed command had set aside to replace it", output_dir)
        elif os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def process_is_running(pid: int) -> bool:
    """Whether a process of this id exists (signal 0 checks without sending anything)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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


def json_value(line: str, where: str, what: str = "JSON") -> object:
    """One line's JSON value; errors name `where` (the file and line) and, where it can hold no JSON value we take,
    `what` it should be. Duplicate keys are an error (json keeps the last silently, so a value would vanish), and so
    are nesting too deep to read and integers of more than 4,300 digits."""
    try:
        return json.loads(line, object_pairs_hook=lambda pairs: object_without_duplicates(pairs, where))
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: not valid JSON ({error.msg.removesuffix(' at')} at column {error.colno})") from None
    except RecursionError:
        raise InputError(f"{where}: not {what} (JSON nested too deeply to read)") from None
    except InputError:
        raise
    except ValueError as error:  # integers of more than 4,300 digits
        raise InputError(f"{where}: not {what} ({error})") from None


def object_without_duplicates(pairs: list[tuple[str, object]], where: str) -> dict:
    row = {}
    for key, value in pairs:
        if key in row:
            raise InputError(f"{where}: the key {key!r} appears twice in one object")
        row[key] = value
    return row


def check_unicode(text: str, what: str) -> None:
    """JSON's \\ud800-style escapes can make strings that are not Unicode text (lone surrogates): the tokenizer and
    every UTF-8 writer would fail on them later, far from the line that holds them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InputError(
            f"{what} is not Unicode text (a lone surrogate {text[error.start]!r} at character {error.start + 1})"
        ) from None


def shortened(value, limit: int = 60) -> str:
    """`value`'s repr, cut to `limit` characters, for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
