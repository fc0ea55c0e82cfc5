"""hf_vanilla_transformer.translation.lines: lines translated with any engine, one line of translation each
whatever the input, a line longer than the model's positions cut before it is tokenized, and the steering checked
against the input (a term or prefix that holds an avoided word is refused)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hf_vanilla_transformer.engines.registry import load_translator
from hf_vanilla_transformer.translation.lines import translate_lines, translate_lines_in_full
from support.hostile import FUZZ_SETTINGS
from support.models import german_tokenizer, tiny_model
from support.steering import SOURCES, translate_input
from support.tokenizing import LongestText


@pytest.fixture(scope="module")
def translator(trained_run):
    return load_translator(str(trained_run.output), "cpu")


@FUZZ_SETTINGS
@given(
    lines=st.lists(
        st.text(max_size=30) | st.sampled_from(["\u2028", "a\x85b", "\r", "\x00", " ", "🙂" * 40]), max_size=6
    )
)
def test_any_lines_give_one_line_of_translation_each(translator, lines):
    translations = translate_lines(translator, lines, 4, {"num_beams": 1, "max_new_tokens": 4}, show_progress=False)
    assert len(translations) == len(lines)
    for line, translation in zip(lines, translations, strict=True):
        assert len(translation.splitlines()) <= 1
        assert translation == "" if not line.strip() else isinstance(translation, str)


def test_a_10_mb_line_is_cut_before_it_is_tokenized_and_translated_from_its_start(folders, caplog):
    """Only its first max_positions tokens are translated: the line is cut to a start that holds them before the
    tokenizer sees it, and translates as that start does."""
    translator = load_translator(folders["first"], "cpu")
    translator.tokenizer = LongestText(translator.tokenizer)
    long_line = "a bc " * 2_000_000  # 10 MB, with words the cut could split
    start = " ".join(long_line.split()[:200])  # 300 tokens, more than the 128 positions
    found = translate_lines_in_full(translator, [SOURCES[0], long_line, start], 4, {"num_beams": 1}, False)
    assert found[1][0].text == found[2][0].text and found[0][0].text != found[1][0].text
    assert translator.tokenizer.longest <= 2 * 128 * len("<unk>")  # the positions times the longest token, doubled
    assert "2 line(s) have more tokens than the model's 128 positions" in caplog.text


def test_a_10_mb_word_is_cut_inside_before_it_is_tokenized_and_translated_from_its_start(tmp_path, caplog):
    """A word with no space near enough to cut at is cut inside: a byte-level BPE (the tokenizer this project
    trains) spells every character, so the cut holds the positions' tokens and the tokenizer never sees more than
    twice the positions times the longest token, whether the line is one word or a word after a short one."""
    tokenizer, _ = german_tokenizer()
    tiny_model(vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    translator = load_translator(str(tmp_path), "cpu")
    translator.tokenizer = LongestText(translator.tokenizer)
    word = "b" * 10_000_000
    starts = [word[:2000], "A " + word[:2000]]  # more than the 128 positions' tokens
    found = translate_lines_in_full(translator, [word, "A " + word, *starts, "Ein Hund"], 4, {"num_beams": 1}, False)
    texts = [hypotheses[0].text for hypotheses in found]
    assert texts[:2] == texts[2:4] and texts[0] != texts[1] != texts[4]
    assert translator.tokenizer.longest <= 2 * 128 * max(map(len, tokenizer.get_vocab()))
    assert "4 line(s) have more tokens than the model's 128 positions" in caplog.text


def test_a_term_or_prefix_that_holds_an_avoided_word_is_refused(folders, tmp_path, capsys):
    (tmp_path / "avoid.jsonl").write_text('"j"\n')
    (tmp_path / "terms.jsonl").write_text('["j i"]\n[]\n[]\n[]\n[]\n')
    (tmp_path / "prefix.txt").write_text("\n\n\nb j\n\n")
    avoid = ("--avoid", str(tmp_path / "avoid.jsonl"))
    status, _, err = translate_input(capsys, folders, *avoid, "--constraints", str(tmp_path / "terms.jsonl"))
    assert status == 2 and f"terms.jsonl:1: 'j i' holds 'j', which {tmp_path / 'avoid.jsonl'} bars" in err, err
    status, _, err = translate_input(capsys, folders, *avoid, "--prefix", str(tmp_path / "prefix.txt"))
    assert status == 2 and "prefix.txt:4: 'b j' holds 'j'" in err, err
