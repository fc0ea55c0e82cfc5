"""The steering files (tools/steering_files.py) against hostile input: any file gives lists of usable phrases or one
line of error naming the file and line, never a traceback; what it gives is text a translation could hold."""

import tempfile
import unicodedata
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from hf_vanilla_transformer.decoding.request import SteeringError
from hf_vanilla_transformer.translation.steering_files import MARKUP, read_avoid, read_constraints, read_prefixes
from support.files import write_bytes_lines
from support.hostile import FUZZ_SETTINGS, HOSTILE_LINES, JSON_VALUES, RAW_LINES, assert_one_line_error

STEERING_LINES = st.one_of(
    RAW_LINES,
    st.sampled_from([*HOSTILE_LINES, b'["</s>"]', b'["\\u200b"]', b'["a\\nb"]', b'"<b>"', b'["\\ud800"]']),
    st.lists(st.text(max_size=12), max_size=3).map(lambda terms: repr(terms).replace("'", '"').encode()),
    JSON_VALUES.map(lambda value: repr([value]).encode()),
)


def usable(phrase: str) -> bool:
    """A phrase a translation could hold: Unicode text, something visible, no control character, no markup."""
    phrase.encode("utf-8")
    categories = {unicodedata.category(character) for character in phrase}
    return "Cc" not in categories and bool(categories - {"Cf", "Zs", "Zl", "Zp"}) and not MARKUP.search(phrase)


@FUZZ_SETTINGS
@given(lines=st.lists(STEERING_LINES, max_size=5), bom=st.booleans())
def test_any_constraints_avoid_or_prefix_file_is_read_or_refused_in_one_line(lines, bom):
    for reader in (read_constraints, read_avoid, read_prefixes):
        with tempfile.TemporaryDirectory() as folder:
            path = write_bytes_lines(Path(folder), "steer.txt", lines, bom)
            count = Path(path).read_bytes().count(b"\n")  # lines end at b"\n" only, and a line may hold one
            try:
                result = reader(path)
            except SteeringError as error:
                assert_one_line_error(error, f"{path}:")
                continue
        if reader is read_constraints:
            assert len(result) == count and all(usable(p) for phrases in result for p in phrases)
        elif reader is read_avoid:
            assert all(usable(phrase) for phrase in result)
        else:
            assert len(result) == count and not any(MARKUP.search(prefix) for prefix in result)
