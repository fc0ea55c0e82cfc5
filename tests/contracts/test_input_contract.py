"""One input contract for every way in — vanilla-translate, the pipeline, vanilla-attention (the demo's is tested
with it served, in system/test_demo_app.py): whitespace around a sentence is not translated, an empty sentence gets an
empty translation, a folder or a Hub id names the model, and the decoding flags reach generate()."""

import signal

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla_transformer.cli.attention import main as attention_main
from hf_vanilla_transformer.cli.translate import main as translate_main
from hf_vanilla_transformer.model.pipeline_translation import TranslationPipeline
from hf_vanilla_transformer.training.tokenizer import train_shared_bpe
from support.files import write_lines
from support.models import tiny_model

SENTENCE = "A man is sleeping."
PADDED = f"   {SENTENCE}  "


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny model with a byte-level BPE, for which a leading space changes the tokens. Its output projection's
    `</s>` row points along the decoder's mean output, so that beams end at different lengths (an untrained model's
    never end, and then no length penalty could change a translation)."""
    sentences = ["A man is sleeping.", "Two dogs play.", "Ein Mann schläft.", "Zwei Hunde spielen."] * 20
    tokenizer = train_shared_bpe(sentences, vocab_size=300, min_frequency=1)
    assert tokenizer(PADDED)["input_ids"] != tokenizer(SENTENCE)["input_ids"]  # else the tests could not fail
    model = tiny_model(vocab_size=len(tokenizer), max_position_embeddings=40, tie_word_embeddings=False)
    batch = tokenizer([SENTENCE], return_tensors="pt")
    with torch.no_grad():
        decoder_output = model.model(**batch, decoder_input_ids=torch.arange(16)[None]).last_hidden_state[0]
        typical_logit = model.lm_head(decoder_output).max(-1).values.mean()
        direction = decoder_output.mean(0)
        # 0.9 of a typical winning logit: some beams end within a few tokens, greedy decoding does not
        model.lm_head.weight[tokenizer.eos_token_id] = 0.9 * typical_logit * direction / direction.norm() ** 2
    model.generation_config.update(num_beams=1, length_penalty=1.0)  # greedy by default: 40 tokens, never empty
    folder = tmp_path_factory.mktemp("contract") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def generated(folder, sentence: str, **decoding) -> str:
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        output = model.generate(**tokenizer([sentence], return_tensors="pt"), **decoding)
    return tokenizer.decode(output[0], skip_special_tokens=True)


def vanilla_translate(folder, lines: list[str], tmp_path, *flags) -> list[str]:
    output = tmp_path / "out.txt"
    handlers = {stop: signal.getsignal(stop) for stop in (signal.SIGINT, signal.SIGTERM)}
    translate_main(
        [
            "--model",
            str(folder),
            "--input",
            write_lines(tmp_path / "in.txt", lines),
            "--output",
            str(output),
            "--dtype",
            "float32",
            *flags,
        ]
    )
    # the command's Ctrl-C handling is its own: the caller's handlers are back
    assert {stop: signal.getsignal(stop) for stop in handlers} == handlers
    return output.read_text(encoding="utf-8").splitlines()


def test_whitespace_around_a_sentence_and_empty_sentences_alike_everywhere(folder, tmp_path, capsys):
    expected = generated(folder, SENTENCE)
    assert expected  # an empty translation would pass as one of an empty line
    assert vanilla_translate(folder, [PADDED, "", " \t", SENTENCE], tmp_path) == [expected, "", "", expected]
    translator = TranslationPipeline(
        model=AutoModelForSeq2SeqLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder)
    )
    assert translator(PADDED) == translator(SENTENCE) == [{"translation_text": expected}]
    assert translator("") == translator("  ") == [{"translation_text": ""}]
    assert translator(["", PADDED, " "]) == [{"translation_text": t} for t in ("", expected, "")]
    attention_main(
        [
            "--model",
            str(folder),
            "--source",
            PADDED,
            "--output_dir",
            str(tmp_path / "pictures"),
            "--layer",
            "1",
            "--head",
            "1",
        ]
    )  # one picture of each kind: quick
    assert capsys.readouterr().out.splitlines()[0] == f"translation: {expected}"
    with pytest.raises(SystemExit, match=r"^vanilla-attention: error: source: the sentence is empty$"):
        attention_main(["--model", str(folder), "--source", " ", "--output_dir", str(tmp_path / "none")])


def test_each_blank_text_gets_translations_of_its_own(folder):
    """A caller may edit what it is given: one blank text's translations are not another's, nor each other."""
    translator = TranslationPipeline(
        model=AutoModelForSeq2SeqLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder)
    )
    results = translator(["", " ", SENTENCE], num_beams=2, num_return_sequences=2)
    results[0][0]["translation_text"] = "edited"
    assert [[hypothesis["translation_text"] for hypothesis in result] for result in results[:2]] == [
        ["edited", ""],
        ["", ""],
    ]


def test_a_hub_id_is_read_from_the_cache_like_a_folder(folder, tmp_path, monkeypatch, capsys):
    """The cache as huggingface_hub lays out a download (offline: the tests never reach the Hub)."""
    from support.hub import hub_snapshot

    files = {path.name: path.read_bytes() for path in folder.iterdir()}
    hub_snapshot(tmp_path / "home", "someone/tiny", files)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "home" / "hub"))
    expected = generated(folder, SENTENCE)
    assert vanilla_translate("someone/tiny", [SENTENCE], tmp_path) == [expected]
    attention_main(
        [
            "--model",
            "someone/tiny",
            "--source",
            SENTENCE,
            "--output_dir",
            str(tmp_path / "pictures"),
            "--layer",
            "1",
            "--head",
            "1",
        ]
    )  # one picture of each kind: quick
    assert capsys.readouterr().out.splitlines()[0] == f"translation: {expected}"
    with pytest.raises(SystemExit) as exit_info:
        vanilla_translate("someone/missing", [SENTENCE], tmp_path)
    assert str(exit_info.value.code).startswith(
        "vanilla-translate: error: someone/missing: not a model folder, nor a model on the Hub ("
    )


def test_num_beams_and_length_penalty_reach_generate(folder, tmp_path):
    """A strongly negative α prefers the shortest finished beam, a strongly positive one the longest."""
    short, long = (generated(folder, SENTENCE, num_beams=4, length_penalty=alpha) for alpha in (-3.0, 3.0))
    assert len(short) < len(long)  # so that each value is seen to arrive
    for alpha, translation in (("-3", short), ("3", long)):
        flags = ["--num_beams", "4", "--length_penalty", alpha]
        assert vanilla_translate(folder, [SENTENCE], tmp_path, *flags) == [translation]


def test_threads_sets_torchs_threads_one_by_default_and_refuses_zero(folder, tmp_path, capsys):
    try:
        vanilla_translate(folder, [SENTENCE], tmp_path, "--threads", "2")
        assert torch.get_num_threads() == 2
        vanilla_translate(folder, [SENTENCE], tmp_path)
        assert torch.get_num_threads() == 1  # the default: fastest idle and beside another job (BENCHMARKS.md)
    finally:
        torch.set_num_threads(1)  # the tests' own setting (conftest.py)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # more such values: cli/test_console_scripts.py
        vanilla_translate(folder, [SENTENCE], tmp_path, "--threads", "0")
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err == "vanilla-translate: error: argument --threads: 0 must be at least 1 (see --help)\n"
    )
