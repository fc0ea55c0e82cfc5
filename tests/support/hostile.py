"""Hostile input for the property tests (hypothesis): strategies, settings, and what a refusal must look like."""

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from support.files import write_bytes_lines

# Hostile input, for the property tests of every reader (hypothesis). Each entry point must give a result or one
# line of error naming the file. Every run of the suite tries the same 150 inputs per entry point (derandomized, so
# that CI cannot fail by chance); FUZZ_EXAMPLES=2000 FUZZ_RANDOM=1 tries more, and new ones each run.
FUZZ_SETTINGS = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 150)),
    deadline=None,
    derandomize=os.environ.get("FUZZ_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow],
)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)


HOSTILE_LINES = [
    b"\xef\xbb\xbf",  # a byte-order mark
    b"\x00",  # NUL
    b"\xff\xfe\xed\xa0\x80",  # not UTF-8; an encoded surrogate
    b"[" * 50_000,  # nesting deeper than the JSON reader's recursion
    b"9" * 5_000,  # an integer too long for int()
    b'{"translation": {"en": "a", "en": "b", "de": "c"}}',  # a duplicate key
    b'{"translation": {"en": "\\ud800", "de": "c"}}',  # a lone surrogate
    b'{"translation": {"en": "a\\u2028b", "de": "c\\u0085d"}}',  # line separators inside a sentence
    b"\r",
]


RAW_LINES = st.one_of(
    st.sampled_from(HOSTILE_LINES),
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.tuples(JSON_VALUES, JSON_VALUES).map(
        lambda pair: json.dumps({"translation": {"en": pair[0], "de": pair[1]}}).encode()
    ),
    st.tuples(st.text(min_size=1), st.text(min_size=1)).map(
        lambda pair: json.dumps({"translation": {"en": pair[0], "de": pair[1]}}).encode()
    ),
)


def assert_one_line_error(error: BaseException, *names: str) -> None:
    """An error a user sees: one line that names the file (or field) it is about."""
    message = str(error)
    assert message and "\n" not in message and "Traceback" not in message, message
    assert any(name in message for name in names), (message, names)


def read_fuzzed_file(reader, lines: list[bytes], bom: bool, name: str):
    """`reader(path)` on a file of `lines`: (its result, the file's text) or, when it refuses the file, None once its
    error is checked to be one line naming the file."""
    from hf_vanilla_transformer.files import InputError

    with tempfile.TemporaryDirectory() as folder:
        path = write_bytes_lines(Path(folder), name, lines, bom)
        try:
            result = reader(path)
        except InputError as error:
            assert_one_line_error(error, f"{path}:")
            return None
        return result, Path(path).read_bytes().decode("utf-8-sig")
