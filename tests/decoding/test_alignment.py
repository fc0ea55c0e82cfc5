"""Word alignments from the encoder-decoder attention (decoding/alignment.py): the `i-j` format, the token -> word
mapping through the fast tokenizer's offsets, the word pooling and argmax on attention built by hand and on a real
forward pass, batching, the caller's model, and refused arguments. Tiny random models: the alignments are not good,
only computed as documented."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_vanilla_transformer.decoding.alignment import (
    align,
    format_alignment,
    grow_diag_final_and,
    most_attended,
    parse_alignment,
    token_words,
    word_attention,
    word_attentions,
)
from hf_vanilla_transformer.training.tokenizer import train_shared_bpe
from support.models import letter_tokenizer, tiny_model

CORPUS = [
    "A man is sleeping on a green couch.",
    "Two dogs play in the snow.",
    "Ein Mann schläft auf einem grünen Sofa.",
    "Zwei Hunde spielen im Schnee.",
]
SOURCES = ["A man sleeps.", "Two small dogs are playing together in the deep snow.", "Dogs  play"]
TARGETS = ["Ein Mann schläft.", "Zwei kleine Hunde spielen im Schnee.", "Hunde spielen gemeinsam draußen"]


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE as train_bpe.py builds (few merges: most words are several tokens) and a model for it."""
    tokenizer = train_shared_bpe(CORPUS, vocab_size=300, min_frequency=1)
    return tiny_model(3, vocab_size=len(tokenizer)), tokenizer


def test_format_and_parse():
    assert format_alignment([(0, 0), (2, 1), (1, 2)]) == "0-0 2-1 1-2"
    assert format_alignment([]) == ""
    assert parse_alignment(" 0-0  2-1\t1-2\n") == [(0, 0), (2, 1), (1, 2)]
    for bad in ("0-", "a-1", "1:2", "-1-2", "1-2-3"):
        with pytest.raises(ValueError, match="is not i-j"):
            parse_alignment(f"0-0 {bad}")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), max_size=30))
def test_parse_reads_what_format_writes(pairs):
    assert parse_alignment(format_alignment(pairs)) == pairs


def test_token_words_follow_the_offsets(bpe):
    _, tokenizer = bpe
    text = "A man  sleeping."  # two spaces: a token of whitespace alone
    encoded = tokenizer(text, return_offsets_mapping=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    words = token_words(text, encoded["offset_mapping"])
    assert tokens[-1] == "</s>" and words[-1] is None
    assert "Ġ" in tokens and all(word is None for token, word in zip(tokens, words, strict=True) if token == "Ġ")
    spelled = {}
    for token, word in zip(tokens, words, strict=True):
        if word is not None:
            spelled[word] = spelled.get(word, "") + token.replace("Ġ", "")
    assert spelled == dict(enumerate(text.split()))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=8), max_size=8))
def test_every_word_has_tokens_in_order(bpe, words):
    _, tokenizer = bpe
    text = "  ".join(words)
    token_word = token_words(text, tokenizer(text, return_offsets_mapping=True)["offset_mapping"])
    present = [word for word in token_word if word is not None]
    assert present == sorted(present) and set(present) == set(range(len(text.split())))


def test_pooling_sums_source_subwords_and_averages_target_subwords():
    # source: word 0 = tokens 0, 1; word 1 = token 2; token 3 is </s>. target: word 0 = token 0, word 1 = tokens
    # 1, 2; token 3 is </s>. One layer, one head.
    weights = torch.tensor(
        [
            [0.3, 0.3, 0.4, 0.0],  # word 0's two tokens together outweigh word 1's one: source word 0
            [0.5, 0.0, 0.5, 0.0],  # with the next row, the mean is (0.25, 0.3): source word 1
            [0.0, 0.0, 0.1, 0.9],  # although this row's largest weight is on </s>, which is no word
            [0.9, 0.0, 0.0, 0.1],  # </s> predicted: read only where it is the input after target word 1
        ]
    )[None, None]
    attention = word_attention(weights, [0, 0, 1, None], [0, 1, 1, None], (2, 2))
    torch.testing.assert_close(attention.predicting[0, 0], torch.tensor([[0.6, 0.4], [0.25, 0.3]]))
    assert most_attended(attention.of(0, None, "predicting"), "target") == [(0, 0), (1, 1)]
    # reading: target word 0 is read at position 1, word 1 at positions 2 and 3
    torch.testing.assert_close(attention.reading[0, 0], torch.tensor([[0.5, 0.5], [0.45, 0.05]]))
    assert most_attended(attention.of(0, None, "reading"), "target") == [(0, 0), (0, 1)]


def test_heads_are_averaged_as_chosen():
    # one layer, three heads; target token 0 is word 0, token 1 is </s>; source tokens are words 0 and 1
    heads = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])
    weights = torch.stack([heads, torch.full((3, 2), 0.5)], 1)[None]  # (1, 3, 2, 2)
    attention = word_attention(weights, [0, 1], [0, None], (2, 1))
    assert most_attended(attention.of(0, 0, "predicting"), "target") == [(0, 0)]
    assert most_attended(attention.of(0, 1, "predicting"), "target") == [(1, 0)]
    assert most_attended(attention.of(0, [1, 2], "predicting"), "target") == [(1, 0)]  # mean (0.45, 0.55)
    assert most_attended(attention.of(0, None, "predicting"), "target") == [(0, 0)]  # mean (0.6, 0.4)


def test_both_directions_intersected_or_grown():
    # 3 target words x 3 source words: target 0 -> source 0, target 1 -> 1, target 2 -> 1; source 0 -> target 0,
    # source 1 -> target 1, source 2 -> target 2
    attention = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.6, 0.3], [0.1, 0.5, 0.4]])
    assert most_attended(attention, "target") == [(0, 0), (1, 1), (1, 2)]
    assert most_attended(attention, "intersection") == [(0, 0), (1, 1)]
    # grown from (1, 1): (1, 2) and (2, 2) neighbour it and each aligns a word not yet aligned
    assert most_attended(attention, "grow-diag-final-and") == [(0, 0), (1, 1), (1, 2), (2, 2)]


def test_grow_diag_final_and():
    forward, reverse = {(0, 0), (1, 1), (3, 3), (4, 2)}, {(0, 0), (1, 1), (2, 1), (5, 4)}
    # grown: (2, 1) neighbours (1, 1) and aligns source word 2; final-and: (3, 3), (4, 2) and (5, 4) neighbour
    # nothing aligned, but align two words that are both still unaligned
    assert grow_diag_final_and(forward, reverse) == {(0, 0), (1, 1), (2, 1), (3, 3), (4, 2), (5, 4)}
    # (0, 2) neighbours no aligned link, and its source word is aligned already
    assert grow_diag_final_and({(0, 0), (2, 2), (0, 2)}, {(0, 0), (2, 2)}) == {(0, 0), (2, 2)}
    assert forward == {(0, 0), (1, 1), (3, 3), (4, 2)}  # the arguments are left as given


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 7), st.integers(1, 7), st.integers(0, 2**31))
def test_grown_links_lie_between_the_intersection_and_the_union(sources, targets, seed):
    attention = torch.rand(targets, sources, generator=torch.Generator().manual_seed(seed))
    each_target = set(most_attended(attention, "target"))
    intersection, grown = (
        set(most_attended(attention, "intersection")),
        set(most_attended(attention, "grow-diag-final-and")),
    )
    each_source = {(i, int(attention[:, i].argmax())) for i in range(sources)}
    assert intersection == each_target & each_source
    assert intersection <= grown <= each_target | each_source


def by_hand(model, tokenizer, source: str, target: str, layer: int, position: str) -> list[tuple[int, int]]:
    """The alignment computed another way: words from the tokens' `Ġ` marks (a word starts at the first token and
    at a token that begins with a space), attention from a plain forward pass, loops instead of matrices."""

    def words_of(ids):
        words, word, starts = [], -1, True
        for token in tokenizer.convert_ids_to_tokens(ids):
            if token in ("</s>", "Ġ"):  # `Ġ` alone: the space before a word the BPE has no `Ġ...` token for
                words.append(None)
                starts = token == "Ġ"
                continue
            word += starts or token.startswith("Ġ")
            words.append(word)
            starts = False
        return words

    source_ids = tokenizer(source)["input_ids"]
    target_ids = tokenizer(text_target=target)["input_ids"]
    with torch.no_grad():
        outputs = model(
            input_ids=torch.tensor([source_ids]),
            decoder_input_ids=model.prepare_decoder_input_ids_from_labels(torch.tensor([target_ids])),
            output_attentions=True,
        )
    attention = outputs.cross_attentions[layer][0].mean(0)  # (target tokens, source tokens)
    source_words, target_words = words_of(source_ids), words_of(target_ids)
    shift = 1 if position == "reading" else 0
    pairs = []
    for j in range(len(target.split())):
        rows = [t + shift for t, word in enumerate(target_words) if word == j]
        scores = [
            sum(float(attention[row, s]) for row in rows for s, word in enumerate(source_words) if word == i)
            / len(rows)
            for i in range(len(source.split()))
        ]
        pairs.append((scores.index(max(scores)), j))
    return sorted(pairs)


@pytest.mark.parametrize("position", ["predicting", "reading"])
@pytest.mark.parametrize("layer", [0, -1])
def test_alignment_follows_the_attention_of_a_forward_pass(bpe, layer, position):
    model, tokenizer = bpe
    source, target = SOURCES[1], TARGETS[1]
    assert len(tokenizer(text_target=target)["input_ids"]) > len(target.split()) + 2  # words of several tokens
    expected = by_hand(model, tokenizer, source, target, layer, position)
    assert align(model, tokenizer, [source], [target], layer=layer, position=position, method="target") == [expected]


@pytest.mark.parametrize("tokenizer_kind", ["bpe", "letters"])
def test_links_lie_within_the_words_and_each_target_word_is_aligned_once(bpe, tokenizer_kind):
    if tokenizer_kind == "bpe":
        model, tokenizer = bpe
        sources, targets = SOURCES, TARGETS
    else:  # a word-level tokenizer; "xyz" is <unk>, a word all the same
        model, tokenizer = tiny_model(1), letter_tokenizer()
        sources, targets = ["a b c d", "e f", "a xyz b"], ["d c b a j", "f", "xyz a"]
    each_target = align(model, tokenizer, sources, targets, method="target")
    for source, target, pairs in zip(sources, targets, each_target, strict=True):
        assert sorted(j for _, j in pairs) == list(range(len(target.split())))
        assert all(0 <= i < len(source.split()) for i, _ in pairs)
        assert pairs == sorted(pairs)
    for source, target, pairs in zip(sources, targets, align(model, tokenizer, sources, targets), strict=True):
        assert pairs and pairs == sorted(set(pairs))  # the largest weight is a link both ways: never empty
        assert all(0 <= i < len(source.split()) and 0 <= j < len(target.split()) for i, j in pairs)


def test_empty_sides_align_nothing(bpe):
    model, tokenizer = bpe
    assert align(model, tokenizer, ["", "A man sleeps.", "  "], ["Ein Mann.", "", "Hunde"]) == [[], [], []]


def test_a_pair_aligns_the_same_alone_and_in_a_padded_batch(bpe):
    model, tokenizer = bpe
    batched = list(word_attentions(model, tokenizer, SOURCES, TARGETS, batch_size=3))
    for index, (source, target) in enumerate(zip(SOURCES, TARGETS, strict=True)):
        (alone,) = word_attentions(model, tokenizer, [source], [target])
        torch.testing.assert_close(batched[index].predicting, alone.predicting)
        torch.testing.assert_close(batched[index].reading, alone.reading)
    assert align(model, tokenizer, SOURCES, TARGETS, batch_size=2) == [
        align(model, tokenizer, [source], [target])[0] for source, target in zip(SOURCES, TARGETS, strict=True)
    ]


def encoder_returns_attention(model, tokenizer) -> bool:
    with torch.no_grad():
        weights = model.get_encoder()(**tokenizer("A man", return_tensors="pt"), output_attentions=True).attentions
    return bool(weights) and all(layer is not None for layer in weights)  # sdpa: no weights, or None


def test_a_model_on_the_sdpa_path_is_left_there(bpe):
    model, tokenizer = bpe
    sdpa = tiny_model(3, attn_implementation="sdpa", vocab_size=len(tokenizer))
    before = {name: tensor.clone() for name, tensor in sdpa.state_dict().items()}
    with pytest.warns(UserWarning, match="eager copy"):
        pairs = align(sdpa, tokenizer, SOURCES, TARGETS)
    assert pairs == align(model, tokenizer, SOURCES, TARGETS)
    assert not encoder_returns_attention(sdpa, tokenizer) and not sdpa.training
    assert all(torch.equal(tensor, before[name]) for name, tensor in sdpa.state_dict().items())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the eager model itself is used: no copy, no warning
        align(model, tokenizer, SOURCES[:1], TARGETS[:1])
    assert encoder_returns_attention(model, tokenizer)


def test_bad_arguments_are_refused(bpe):
    model, tokenizer = bpe
    with pytest.raises(ValueError, match="3 sources but 2 targets"):
        align(model, tokenizer, SOURCES, TARGETS[:2])
    with pytest.raises(ValueError, match="layer 3: the decoder has 3 layers"):
        align(model, tokenizer, SOURCES, TARGETS, layer=3)
    with pytest.raises(ValueError, match="head 2: the decoder's layers have 2 heads"):
        align(model, tokenizer, SOURCES, TARGETS, heads=[0, 2])
    with pytest.raises(ValueError, match="give at least one head"):
        align(model, tokenizer, SOURCES, TARGETS, heads=[])
    with pytest.raises(ValueError, match="position 'input' must be one of predicting, reading"):
        align(model, tokenizer, SOURCES, TARGETS, position="input")
    with pytest.raises(ValueError, match="method 'union' must be one of target, intersection, grow-diag-final-and"):
        align(model, tokenizer, SOURCES, TARGETS, method="union")
    with pytest.raises(ValueError, match="batch_size 0"):
        align(model, tokenizer, SOURCES, TARGETS, batch_size=0)
    with pytest.raises(ValueError, match=r"targets\[3\]: 1\d\d tokens, more than the model's 128 positions"):
        align(model, tokenizer, ["a"] * 4, ["a"] * 3 + ["dog " * 60], batch_size=2)
    model.train()
    try:
        with pytest.raises(ValueError, match="training mode"):
            align(model, tokenizer, SOURCES, TARGETS)
    finally:
        model.eval()
