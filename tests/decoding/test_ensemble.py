"""Ensembles (decoding/ensemble.py): models that decode together through generate(), each step scored by the mean of
the members' log-probabilities. An ensemble of one model, or of a model with itself, decodes as that model."""

import pytest
import torch

from hf_vanilla_transformer.decoding.ensemble import TranslationEnsemble, load_ensemble
from support.models import BOS, EOS, PAD, beam_search_example, letter_tokenizer, tiny_model

SOURCES = ["a b c d e", "a b", "c d e f g h i j a b"]  # of different lengths: a padded batch
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, EOS], [11, 12, 13, EOS, PAD, PAD, PAD]])
MASK = (IDS != PAD).long()


def two_sizes(**overrides) -> list:
    """Two models of one vocabulary whose architectures differ in size."""
    return [tiny_model(1, **overrides), tiny_model(2, d_model=48, decoder_layers=2, encoder_ffn_dim=64, **overrides)]


def ensemble_generate(ensemble, batch, **settings):
    """generate() with Section 6.1's length rule, as our model's own generate() applies it."""
    return ensemble.generate(**batch, logits_processor=ensemble.length_limit_processors(batch), **settings)


@pytest.mark.parametrize("copies", [1, 2], ids=["one model", "a model with itself"])
@pytest.mark.parametrize("sources", [SOURCES[:1], SOURCES], ids=["one sentence", "padded batch"])
def test_an_ensemble_of_one_model_beam_searches_as_that_model(copies, sources):
    model, tokenizer, _, settings = beam_search_example()
    ensemble = TranslationEnsemble([model] * copies)
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    settings = {**settings, "num_return_sequences": 2, "return_dict_in_generate": True, "output_scores": True}
    alone = model.generate(**batch, **settings)
    together = ensemble_generate(ensemble, batch, **settings)
    assert together.sequences.tolist() == alone.sequences.tolist()
    torch.testing.assert_close(together.sequences_scores, alone.sequences_scores, rtol=0, atol=1e-5)


@pytest.mark.parametrize("copies", [1, 2], ids=["one model", "a model with itself"])
def test_an_ensemble_of_one_model_decodes_greedily_as_that_model(copies):
    model, tokenizer, _, _ = beam_search_example()
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    settings = {"num_beams": 1, "max_new_tokens": 8, "return_dict_in_generate": True, "output_scores": True}
    alone = model.generate(**batch, **settings)
    ensemble = TranslationEnsemble([model] * copies)
    together = ensemble_generate(ensemble, batch, **settings)
    assert together.sequences.tolist() == alone.sequences.tolist()
    # greedy search's scores are the logits: the model's raw ones, the ensemble's log-probabilities
    expected = model.compute_transition_scores(alone.sequences, alone.scores, normalize_logits=True)
    got = ensemble.compute_transition_scores(together.sequences, together.scores, normalize_logits=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_a_step_scores_by_the_mean_of_the_members_log_probabilities(padded_batch):
    members = two_sizes()
    logits = TranslationEnsemble(members)(**padded_batch).logits
    expected = torch.stack([member(**padded_batch).logits.log_softmax(-1) for member in members]).mean(0)
    torch.testing.assert_close(logits, expected)


def test_section_6_1s_length_rule_holds_for_the_ensemble_as_for_one_model():
    """An untrained model never chooses </s>: each sentence runs to its own limit, source length + the margin
    (here 10 rather than the paper's 50, to be quick)."""
    model = tiny_model()
    model.generation_config.max_new_tokens_over_source = 10
    alone = model.generate(IDS, attention_mask=MASK, num_beams=3)
    together = ensemble_generate(TranslationEnsemble([model]), {"input_ids": IDS, "attention_mask": MASK}, num_beams=3)
    assert together.tolist() == alone.tolist()
    pair = TranslationEnsemble([model, tiny_model(0, d_model=48)])
    for num_beams in (1, 3):
        sequences = ensemble_generate(pair, {"input_ids": IDS, "attention_mask": MASK}, num_beams=num_beams)
        generated = [[token for token in sequence[1:] if token != PAD] for sequence in sequences.tolist()]
        assert [len(tokens) for tokens in generated] == [7 + 10, 4 + 10]
        assert [tokens[-1] for tokens in generated] == [EOS, EOS]


@pytest.mark.parametrize("settings", [{"num_beams": 3, "num_return_sequences": 2}, {}], ids=["beam", "greedy"])
def test_each_members_cache_is_continued_from_and_decodes_as_without_one(settings):
    ensemble = TranslationEnsemble(two_sizes(vocab_size=14))
    tokenizer = letter_tokenizer()
    batch = dict(tokenizer(SOURCES, return_tensors="pt", padding=True))
    batch["decoder_input_ids"] = torch.tensor([[BOS, 5]] * len(SOURCES))  # a two-token prompt, then one at a time
    settings = {**settings, "max_new_tokens": 6, "return_dict_in_generate": True, "output_scores": True}

    def decode(use_cache: bool):
        lengths = {index: [] for index in range(len(ensemble.members))}
        hooks = [
            member.model.decoder.register_forward_pre_hook(
                lambda module, args, kwargs, index=index: lengths[index].append(kwargs["input_ids"].shape[1]),
                with_kwargs=True,
            )
            for index, member in enumerate(ensemble.members)
        ]
        try:
            return ensemble_generate(ensemble, batch, use_cache=use_cache, **settings), lengths
        finally:
            for hook in hooks:
                hook.remove()

    cached, cached_lengths = decode(use_cache=True)
    uncached, uncached_lengths = decode(use_cache=False)
    assert cached.sequences.tolist() == uncached.sequences.tolist()
    for with_cache, without in zip(cached.scores, uncached.scores, strict=True):
        torch.testing.assert_close(with_cache, without)
    steps = len(cached.scores)
    assert steps == 6
    for index in range(len(ensemble.members)):
        assert cached_lengths[index] == [2] + [1] * (steps - 1)
        assert uncached_lengths[index] == list(range(2, 2 + steps))


def test_beam_search_outputs_scores_logits_and_transition_scores_of_the_ensemble():
    ensemble = TranslationEnsemble(two_sizes(vocab_size=14))
    batch = letter_tokenizer()(SOURCES, return_tensors="pt", padding=True)
    output = ensemble_generate(
        ensemble,
        batch,
        num_beams=3,
        num_return_sequences=2,
        max_new_tokens=8,
        length_penalty=0.6,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    assert output.sequences.shape[0] == 2 * len(SOURCES)
    # the first step's logits: the ensemble's log-probabilities after `<s>`, once per beam
    first = ensemble(**batch, decoder_input_ids=torch.full((len(SOURCES), 1), BOS)).logits[:, -1]
    torch.testing.assert_close(output.logits[0], first.repeat_interleave(3, dim=0))
    # the sequence scores are rebuilt from the transition scores, as transformers documents
    transitions = ensemble.compute_transition_scores(output.sequences, output.scores, output.beam_indices)
    lengths = (output.beam_indices >= 0).sum(-1)
    torch.testing.assert_close(transitions.sum(-1) / lengths**0.6, output.sequences_scores, rtol=0, atol=1e-5)


def test_a_seeded_sample_is_the_same_twice():
    ensemble = TranslationEnsemble(two_sizes(vocab_size=14))
    batch = letter_tokenizer()(SOURCES, return_tensors="pt", padding=True)

    def sample():
        torch.manual_seed(7)
        return ensemble_generate(ensemble, batch, do_sample=True, num_return_sequences=2, max_new_tokens=8)

    first = sample()
    assert first.shape[0] == 2 * len(SOURCES)
    assert first.tolist() == sample().tolist()


def test_the_ensemble_takes_the_first_members_decoding_and_leaves_the_members_as_they_were():
    first, second = tiny_model(1), tiny_model(2, max_position_embeddings=64)
    first.generation_config.num_beams = 4
    ensemble = TranslationEnsemble([first, second])
    assert ensemble.generation_config.num_beams == 4 and ensemble.generation_config is not first.generation_config
    assert ensemble.config.max_position_embeddings == 64 and first.config.max_position_embeddings == 128
    with pytest.raises(ValueError, match="no attentions or hidden states of its own"):
        ensemble.generate(IDS, attention_mask=MASK, max_new_tokens=2, output_attentions=True)


def save(folder, model, tokenizer) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_load_ensemble_loads_each_folder_and_the_first_tokenizer(tmp_path):
    members = two_sizes(vocab_size=14)
    folders = [save(tmp_path / f"model{i}", member, letter_tokenizer()) for i, member in enumerate(members)]
    ensemble, tokenizer = load_ensemble(folders, device="cpu")
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    expected = ensemble_generate(TranslationEnsemble(members), batch, num_beams=3, max_new_tokens=6)
    assert ensemble_generate(ensemble, batch, num_beams=3, max_new_tokens=6).tolist() == expected.tolist()


def tokenizer_with_one_more_token():
    tokenizer = letter_tokenizer()
    tokenizer.add_tokens(["k"])
    return tokenizer


@pytest.mark.parametrize(
    "other, difference",
    [
        ((tiny_model, {"vocab_size": 50}, letter_tokenizer), "vocab_size (99 vs 50)"),
        ((tiny_model, {"eos_token_id": 3}, letter_tokenizer), "eos_token_id (2 vs 3)"),
        ((tiny_model, {}, tokenizer_with_one_more_token), "tokenizer vocab (14 vs 15 tokens"),
    ],
    ids=["vocab_size", "special token", "tokenizer"],
)
def test_members_without_one_vocabulary_are_refused_naming_both_folders(tmp_path, other, difference):
    first = save(tmp_path / "first", tiny_model(1), letter_tokenizer())
    make_model, overrides, make_tokenizer = other
    second = save(tmp_path / "second", make_model(2, **overrides), make_tokenizer())
    with pytest.raises(ValueError) as error:
        load_ensemble([first, second], device="cpu")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{first} and {second} differ in {difference}")
