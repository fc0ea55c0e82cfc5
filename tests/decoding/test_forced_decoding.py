"""Scores of translations: `sequence_scores` of generate()'s own output, the pipeline's `return_scores`, the model's
score of given translations (decoding/forced_decoding.py, on our model and on its CTranslate2 export) and
vanilla-score."""

import json

import pytest
import torch

from hf_vanilla_transformer.cli.score import main as score_main
from hf_vanilla_transformer.decoding.alignment import align, format_alignment
from hf_vanilla_transformer.decoding.forced_decoding import score_translations
from hf_vanilla_transformer.engines.registry import load_translator
from hf_vanilla_transformer.export.ctranslate2 import export
from hf_vanilla_transformer.model.modeling_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.model.pipeline_translation import TranslationPipeline, length_normalized, sequence_scores
from support.files import write_lines
from support.models import EOS, beam_search_example, german_tokenizer, letter_tokenizer, tiny_model
from support.tokenizing import LongestText

SOURCES = ["a b c d e", "j", "c a f f e b d"]  # of different lengths: a padded batch
# Decoding that ends every hypothesis with `</s>` and writes only letters, so that each decodes to a text that
# tokenizes back to the same ids: Section 6.1's limit, cut to source length + 3 tokens (`</s>` forced there), and
# the special tokens other than `</s>` never generated (a suppressed token keeps the others' own scores).
DECODING = {"max_new_tokens_over_source": 3, "suppress_tokens": [0, 1, 3]}
SEARCHES = {
    "greedy": {"num_beams": 1},
    "beam": {"num_beams": 3, "num_return_sequences": 3},
    "sampling": {"do_sample": True, "num_beams": 1, "top_k": 5, "num_return_sequences": 2},
    "beam sampling": {"do_sample": True, "num_beams": 3, "num_return_sequences": 2},
}


def generated(model, tokenizer, sources, **settings):
    """generate()'s output with what `sequence_scores` reads, and each returned row's source."""
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    with torch.no_grad():
        output = model.generate(
            **batch, **DECODING, **settings, return_dict_in_generate=True, output_logits=True, output_scores=True
        )
    rows_per_source = output.sequences.shape[0] // len(sources)
    return output, [source for source in sources for _ in range(rows_per_source)]


def loss(model, tokenizer, source: str, target: str) -> float:
    """The model's training loss on one pair: the mean cross-entropy of the target's tokens."""
    batch = tokenizer([source], text_target=[target], return_tensors="pt")
    with torch.no_grad():
        return model(**batch).loss.item()


@pytest.mark.parametrize("search", SEARCHES)
def test_generated_scores_are_the_models_own_and_those_of_the_same_given_translations(search):
    """n-best scores == compute_transition_scores summed == score_translations of the same outputs, for each search,
    on a batch of different lengths; beam search's own sequences_scores == log-probability / |y|^0.6."""
    model, tokenizer, _, _ = beam_search_example()  # the paper's length penalty, 0.6
    output, sources = generated(model, tokenizer, SOURCES, **SEARCHES[search])
    scores = sequence_scores(model, output)
    assert len(scores) == output.sequences.shape[0]
    for score in scores:
        assert score.token_ids[-1] == EOS and EOS not in score.token_ids[:-1]  # cut at `</s>`, nothing after it
        assert score.log_probability == pytest.approx(sum(score.token_log_probs), abs=1e-9)
        assert score.score == pytest.approx(
            length_normalized(score.log_probability, len(score.token_ids), 0.6), abs=1e-5
        )
    if search.startswith("beam"):  # what beam search ranked by
        torch.testing.assert_close(torch.tensor([s.score for s in scores]), output.sequences_scores)
    texts = tokenizer.batch_decode([score.token_ids for score in scores], skip_special_tokens=True)
    kept = [i for i, text in enumerate(texts) if text]  # an empty translation is no line to score
    assert len(kept) >= len(scores) // 2
    given = score_translations(model, tokenizer, [sources[i] for i in kept], [texts[i] for i in kept], batch_size=2)
    for i, score in zip(kept, given, strict=True):
        assert score.token_ids == scores[i].token_ids
        torch.testing.assert_close(torch.tensor(score.token_log_probs), torch.tensor(scores[i].token_log_probs))
        assert score.score == pytest.approx(scores[i].score, abs=1e-5)


def test_a_hypothesis_ended_at_the_length_limit_carries_the_models_own_score_for_its_end():
    """The source-length limit forces `</s>` where the model would go on; that `</s>` keeps its own log-probability,
    in our scores and in the score beam search ranked the hypothesis by."""
    model, tokenizer, _, _ = beam_search_example()
    source = "a b"  # two of its three hypotheses run to the limit, one ends before it
    output, _ = generated(model, tokenizer, [source], num_beams=3, num_return_sequences=3)
    scores = sequence_scores(model, output)
    limit = len(tokenizer(source)["input_ids"]) + DECODING["max_new_tokens_over_source"]
    at_limit = [score for score in scores if len(score.token_ids) == limit]
    assert 0 < len(at_limit) < len(scores)
    for score in at_limit:
        decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, *score.token_ids[:-1]]])
        with torch.no_grad():
            logits = model(**tokenizer([source], return_tensors="pt"), decoder_input_ids=decoder_input_ids).logits
        own = logits[0, -1].log_softmax(-1)
        assert own.argmax() != EOS  # forced: the model would have gone on
        assert score.token_log_probs[-1] == pytest.approx(own[EOS].item(), abs=1e-5)
    torch.testing.assert_close(torch.tensor([s.score for s in scores]), output.sequences_scores)


def test_the_score_of_a_given_translation_is_the_training_loss_alone_and_in_a_padded_batch():
    model, tokenizer = tiny_model(vocab_size=14), letter_tokenizer()
    targets = ["j i h", "b", "f f a c e d g"]
    (alone,) = score_translations(model, tokenizer, SOURCES[:1], targets[:1])
    assert alone.token_ids == tokenizer(text_target=targets[0])["input_ids"] and alone.token_ids[-1] == EOS
    assert -alone.log_probability / len(alone.token_ids) == pytest.approx(
        loss(model, tokenizer, SOURCES[0], targets[0])
    )
    batched = score_translations(model, tokenizer, SOURCES, targets, batch_size=3)  # sorted by length inside
    for source, target, score in zip(SOURCES, targets, batched, strict=True):
        mean = -sum(score.token_log_probs) / len(score.token_log_probs)
        assert mean == pytest.approx(loss(model, tokenizer, source, target), abs=1e-6)
    assert batched[0].token_ids == alone.token_ids
    assert batched[0].token_log_probs == pytest.approx(alone.token_log_probs, abs=1e-5)  # padding moves the last bits
    with_penalty = score_translations(model, tokenizer, SOURCES[:1], targets[:1], length_penalty=0.6)[0]
    assert with_penalty.score == pytest.approx(alone.log_probability / 4**0.6)


def test_pairs_that_cannot_be_scored_are_a_value_error_naming_the_line():
    model, tokenizer = tiny_model(vocab_size=14, max_position_embeddings=8), letter_tokenizer()
    with pytest.raises(ValueError, match=r"^sources has 2 lines and targets has 1: each target is the translation"):
        score_translations(model, tokenizer, ["a", "b"], ["c"])
    with pytest.raises(ValueError, match=r"^sources:2: an empty line"):
        score_translations(model, tokenizer, ["a", " "], ["c", "d"])
    with pytest.raises(ValueError, match=r"^targets:1: an empty line"):
        score_translations(model, tokenizer, ["a", "b"], ["", "d"])
    with pytest.raises(ValueError, match=r"^targets:2: 9 tokens, more than the model's 8 positions"):
        score_translations(model, tokenizer, ["a", "b"], ["c", "a b c d e f g h"])
    model.train()
    with pytest.raises(ValueError, match="training mode"):
        score_translations(model, tokenizer, ["a"], ["b"])


def test_a_10_mb_side_is_refused_from_its_start_without_being_tokenized_whole():
    """A line whose start already holds more tokens than the model's positions is refused from that start, naming
    its file and line: a byte-level BPE (the tokenizer this project trains) takes seconds and gigabytes to tokenize
    all of a 10 MB line, one word or a word after a short one, source or target. Many characters alone refuse
    nothing: a word-level tokenizer makes no token of spaces."""
    tokenizer, _ = german_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer))  # 128 positions
    word = "b" * 10_000_000
    refused = r"\d+ tokens in its first [\d,]+ characters, more than the model's 128 positions$"
    for line in (word, "A " + word):
        recording = LongestText(tokenizer)
        with pytest.raises(ValueError, match=rf"^sources:2: {refused}"):
            score_translations(model, recording, ["Ein Hund", line], ["Ein Hund", "Ein Hund"])
        with pytest.raises(ValueError, match=rf"^targets:1: {refused}"):
            score_translations(model, recording, ["Ein Hund"], [line])
        assert recording.longest <= 2 * 128 * max(map(len, tokenizer.get_vocab()))
    letters = tiny_model(vocab_size=14, max_position_embeddings=8)
    spaced = "a" + " " * 100 + "b"  # more characters than 8 positions of "<unk>", and 3 tokens
    (score,) = score_translations(letters, letter_tokenizer(), [spaced], [spaced])
    assert len(score.token_ids) == 3


def test_the_pipeline_adds_scores_to_each_translation_only_when_asked():
    model, tokenizer, _, _ = beam_search_example()
    translator = TranslationPipeline(model=model, tokenizer=tokenizer)
    settings = {**DECODING, "num_beams": 3}
    plain = translator([SOURCES[0], "", SOURCES[1]], batch_size=2, **settings)
    assert all(set(item) == {"translation_text"} for item in plain)

    found = translator(
        [SOURCES[0], "", SOURCES[1]], batch_size=2, return_scores=True, num_return_sequences=2, **settings
    )
    output, _ = generated(model, tokenizer, SOURCES[:1], num_beams=3, num_return_sequences=2)
    expected = sequence_scores(model, output)
    assert [len(items) for items in found] == [2, 2, 2]
    for item, score in zip(found[0], expected, strict=True):
        assert set(item) == {"translation_text", "score", "log_probability", "token_log_probs"}
        assert item["score"] == pytest.approx(score.score, abs=1e-5)
        assert item["log_probability"] == pytest.approx(score.log_probability, abs=1e-5)
        assert item["token_log_probs"] == pytest.approx(score.token_log_probs, abs=1e-5)
    assert found[1] == [{"translation_text": "", "score": None, "log_probability": None, "token_log_probs": None}] * 2
    assert [item["translation_text"] for item in found[2]][:1] == [plain[2]["translation_text"]]
    single = translator(SOURCES[1], return_scores=True, **settings)  # a string: a batch of one, not unbatched
    assert single[0]["translation_text"] == found[2][0]["translation_text"]
    assert single[0]["token_log_probs"] == pytest.approx(found[2][0]["token_log_probs"], abs=1e-5)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny model folder with the paper's decoding (length penalty 0.6), and its CTranslate2 export."""
    folder = tmp_path_factory.mktemp("scoring")
    model = tiny_model(decoder_attention_heads=4, vocab_size=14)  # one head count, as CTranslate2 needs
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(folder / "model")
    letter_tokenizer().save_pretrained(folder / "model")
    return str(folder / "model"), export(str(folder / "model"), str(folder / "ct2"))


def test_ctranslate2_scores_given_translations_as_the_model_does(folders):
    model_folder, ctranslate2_folder = folders
    targets = ["j i h", "b", "f f a c e d g"]
    ours = load_translator(model_folder, "cpu", "float32").score(SOURCES, targets, batch_size=2)
    theirs = load_translator(ctranslate2_folder, "cpu").score(SOURCES, targets, batch_size=2)
    for mine, other in zip(ours, theirs, strict=True):
        assert other.token_ids == mine.token_ids
        assert other.token_log_probs == pytest.approx(mine.token_log_probs, abs=1e-4)
        assert other.score == pytest.approx(mine.score, abs=1e-4)


def test_vanilla_score_writes_each_pairs_log_probability_or_its_whole_score(folders, tmp_path):
    model_folder, _ = folders
    targets = ["j i h", "b", "f f a c e d g"]
    source, target = write_lines(tmp_path / "src.txt", SOURCES), write_lines(tmp_path / "tgt.txt", targets)
    common = ["--model", model_folder, "--source", source, "--target", target, "--device", "cpu", "--dtype", "float32"]
    expected = load_translator(model_folder, "cpu", "float32").score(SOURCES, targets, batch_size=32)
    score_main([*common, "--output", str(tmp_path / "plain.txt"), "--batch_size", "2"])
    plain = (tmp_path / "plain.txt").read_text().splitlines()
    # batches of 2 pad differently from the default's one batch: float32 sums of about 10 differ in the last bits
    assert [float(line) for line in plain] == pytest.approx([score.log_probability for score in expected], abs=1e-5)
    score_main([*common, "--output", str(tmp_path / "scores.jsonl"), "--format", "jsonl"])
    rows = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert [row["tokens"] for row in rows][1] == ["b", "</s>"]
    for row, score in zip(rows, expected, strict=True):
        assert set(row) == {"log_probability", "score", "tokens", "token_log_probs"}
        assert row["score"] == pytest.approx(row["log_probability"] / len(row["tokens"]) ** 0.6)  # the model's α
        assert row["token_log_probs"] == pytest.approx(score.token_log_probs, abs=1e-6)
    # --alignments: `align`'s pairs of each given pair, after the log-probability and in the JSON
    translator = load_translator(model_folder, "cpu", "float32")
    expected_alignments = [
        format_alignment(p) for p in align(translator.aligner, translator.tokenizer, SOURCES, targets)
    ]
    score_main([*common, "--alignments", "--output", str(tmp_path / "aligned.txt")])
    aligned = [line.split(" ||| ") for line in (tmp_path / "aligned.txt").read_text().splitlines()]
    assert [alignment for _, alignment in aligned] == expected_alignments
    assert [float(log_probability) for log_probability, _ in aligned] == pytest.approx([float(p) for p in plain])
    score_main([*common, "--alignments", "--format", "jsonl", "--output", str(tmp_path / "aligned.jsonl")])
    rows = [json.loads(line) for line in (tmp_path / "aligned.jsonl").read_text().splitlines()]
    assert [row["alignment"] for row in rows] == expected_alignments


@pytest.mark.parametrize(
    "source_lines, target_lines, message",
    [
        (["a", "b"], ["c"], "{source} has 2 lines and {target} has 1"),
        (["a", "b"], ["c", "  "], "{target}:2: an empty line"),
        (["", "b"], ["c", "d"], "{source}:1: an empty line"),
    ],
)
def test_vanilla_score_refuses_pairs_that_do_not_line_up_in_one_line(
    folders, tmp_path, capsys, source_lines, target_lines, message
):
    source, target = write_lines(tmp_path / "src.txt", source_lines), write_lines(tmp_path / "tgt.txt", target_lines)
    with pytest.raises(SystemExit) as stop:
        score_main(
            ["--model", folders[0], "--source", source, "--target", target, "--output", str(tmp_path / "out.txt")]
        )
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"vanilla-score: error: {message.format(source=source, target=target)}")
    assert len(error.splitlines()) == 1 and not (tmp_path / "out.txt").exists()
