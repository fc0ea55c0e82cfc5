import gc
import itertools
import math
import subprocess
import sys
import warnings

import pytest
import torch

from hf_vanilla_transformer.inspection.capture import (
    ATTENTION_KINDS,
    StepRows,
    attention_maps,
    decoding_steps,
    source_labels,
    teacher_forced_steps,
    token_labels,
    winning_path,
)
from hf_vanilla_transformer.inspection.pictures import steps_table
from support.models import SENTENCES, beam_search_example, generate_text, letter_tokenizer, tiny_model
from support.paths import REPO_ROOT
from support.processes import peak_growth

TARGET = "Ein Mann schläft."


def plain_forward(model, tokenizer, source: str, target: str):
    encoded = tokenizer(source, return_tensors="pt")
    labels = tokenizer(text_target=target, return_tensors="pt")["input_ids"]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        outputs = model(
            **encoded, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels), output_attentions=True
        )
    return outputs, labels


def test_the_weights_are_output_attentions_of_a_plain_forward(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    maps = attention_maps(model, tokenizer, SENTENCES[0], target=TARGET)
    outputs, labels = plain_forward(model, tokenizer, SENTENCES[0], TARGET)
    expected = (outputs.encoder_attentions, outputs.decoder_attentions, outputs.cross_attentions)
    for kind, layers in zip(ATTENTION_KINDS, expected, strict=True):
        assert torch.equal(maps.weights[kind], torch.stack([layer[0] for layer in layers])), kind
    config = model.config
    source_length, target_length = len(tokenizer(SENTENCES[0])["input_ids"]), labels.shape[1]
    heads, layers = config.encoder_attention_heads, config.encoder_layers
    assert maps.weights["encoder_self_attention"].shape == (layers, heads, source_length, source_length)
    heads, layers = config.decoder_attention_heads, config.decoder_layers
    assert maps.weights["decoder_self_attention"].shape == (layers, heads, target_length, target_length)
    assert maps.weights["encoder_decoder_attention"].shape == (layers, heads, target_length, source_length)
    # the decoder's masked self-attention never looks ahead
    assert torch.all(maps.weights["decoder_self_attention"].triu(diagonal=1) == 0)
    probabilities = outputs.logits[0].softmax(-1).gather(-1, labels[0, :, None])[:, 0]
    assert maps.target_probabilities == pytest.approx(probabilities.tolist(), abs=1e-6)
    assert maps.teacher_forced and maps.translation == TARGET
    assert maps.source_tokens == token_labels(tokenizer, tokenizer(SENTENCES[0])["input_ids"])
    assert maps.decoder_input_tokens[0] == "<s>" and maps.decoder_input_tokens[1:] == maps.target_tokens[:-1]
    assert maps.target_tokens[-1] == "</s>"


def test_without_a_target_the_maps_are_of_the_models_own_translation(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    maps = attention_maps(model, tokenizer, SENTENCES[1])
    assert not maps.teacher_forced
    assert maps.translation == generate_text(model, tokenizer, SENTENCES[1:2])[0]
    assert "".join(maps.target_tokens).removesuffix("</s>").strip() == maps.translation
    for kind, weights in maps.weights.items():
        assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5), kind
    # the model chose each of its tokens among its top choices (beam search need not take the very first)
    for token, alternatives in zip(maps.target_tokens, maps.target_alternatives, strict=True):
        assert token in [alternative for alternative, _ in alternatives]


def test_an_sdpa_model_runs_as_an_eager_copy_with_a_warning_and_stays_as_it_was(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    model.set_attn_implementation("eager")
    expected = attention_maps(model, tokenizer, SENTENCES[0], target=TARGET)
    model.set_attn_implementation("sdpa")
    with pytest.warns(UserWarning, match="attention weights need the eager attention path, which the model is not on"):
        maps = attention_maps(model, tokenizer, SENTENCES[0], target=TARGET)
    assert model.config._attn_implementation == "sdpa"  # the caller's model as it was
    for kind, weights in maps.weights.items():
        torch.testing.assert_close(weights, expected.weights[kind], msg=kind)
    with pytest.warns(UserWarning, match="this call runs an eager copy"):
        decoding_steps(model, tokenizer, SENTENCES[0], num_beams=2)
    model.set_attn_implementation("eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attention_maps(model, tokenizer, SENTENCES[0], target=TARGET)


def test_labels_are_text_with_spaces_and_partial_characters_as_bytes(chinese_run):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chinese_run.output)
    english = token_labels(tokenizer, tokenizer("A man is sleeping.")["input_ids"])
    assert "".join(english) == "A man is sleeping.</s>"
    assert " man" in english or " m" in english[1]  # Ġ is shown as a space
    chinese = token_labels(tokenizer, tokenizer("我喜欢吃苹果。")["input_ids"])
    assert "".join(chinese) == "我喜欢吃苹果。</s>"
    rare = token_labels(tokenizer, tokenizer("龘")["input_ids"])[:-1]  # not in a 1,500-token vocabulary
    assert all(label.startswith("<") and label.endswith(">") for label in rare)
    assert b"".join(bytes.fromhex(label[1:-1]) for label in rare) == "龘".encode()


def test_greedy_steps_replay_generate(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    steps, translation = decoding_steps(model, tokenizer, SENTENCES[2], num_beams=1, top_k=3)
    assert translation == generate_text(model, tokenizer, SENTENCES[2:3], num_beams=1)[0]
    log_probability = 0.0
    for number, step in enumerate(steps, start=1):
        (hypothesis,) = step.hypotheses
        assert step.step == number and len(hypothesis.tokens) == number
        assert hypothesis.alternatives[0] == (hypothesis.token, pytest.approx(hypothesis.probability, abs=1e-6))
        assert len(hypothesis.alternatives) == 3
        log_probability += math.log(hypothesis.probability)
        assert hypothesis.log_probability == pytest.approx(log_probability, abs=1e-4)
        assert len(hypothesis.attention) == len(tokenizer(SENTENCES[2])["input_ids"])
        assert (
            hypothesis.looked_at
            == token_labels(tokenizer, tokenizer(SENTENCES[2])["input_ids"])[
                max(range(len(hypothesis.attention)), key=hypothesis.attention.__getitem__)
            ]
        )
    assert (
        steps[-1].hypotheses[0].finished and steps[-1].hypotheses[0].winner and steps[-1].hypotheses[0].token == "</s>"
    )
    assert "".join(steps[-1].hypotheses[0].tokens).removesuffix("</s>").strip() == translation


def test_beam_steps_are_the_beams_generate_kept(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    source = SENTENCES[2]
    steps, translation = decoding_steps(model, tokenizer, source, num_beams=4)
    batch = tokenizer([source], return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**batch, num_beams=4, return_dict_in_generate=True, output_scores=True)
    assert translation == tokenizer.decode(output.sequences[0], skip_special_tokens=True)
    for earlier, later in itertools.pairwise(steps):
        running = [h for h in later.hypotheses if not h.finished]
        assert len(running) <= 4 and (running or later is steps[-1])  # the last may hold finished ones only
        # each beam extends one kept at the step before, and beams come best first
        assert all(h.tokens[:-1] == earlier.hypotheses[h.parent].tokens for h in later.hypotheses)
        scores = [h.log_probability for h in running]
        assert scores == sorted(scores, reverse=True)
    (best,) = [h for step in steps for h in step.hypotheses if h.winner]  # generate() returned this one
    assert best.finished and "".join(best.tokens).removesuffix("</s>").strip() == translation
    # generate()'s score is the log-probability over the length to the power of the length penalty
    length_penalty = model.generation_config.length_penalty
    expected = best.log_probability / len(best.tokens) ** length_penalty
    assert output.sequences_scores[0].item() == pytest.approx(expected, abs=1e-4)


def test_the_beams_form_a_tree_whose_finished_hypotheses_are_those_generate_returns():
    model, tokenizer, source, settings = beam_search_example()
    steps, translation = decoding_steps(model, tokenizer, source, **settings)
    assert [h.parent for h in steps[0].hypotheses] == [None] * 3
    for earlier, later in itertools.pairwise(steps):
        assert all(h.tokens[:-1] == earlier.hypotheses[h.parent].tokens for h in later.hypotheses)
    batch = tokenizer(source, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(
            **batch, **settings, num_return_sequences=3, return_dict_in_generate=True, output_scores=True
        )
    returned = [
        "".join(token_labels(tokenizer, sequence[1:])).split("</s>")[0] + "</s>" for sequence in output.sequences
    ]
    finished = [h for step in steps for h in step.hypotheses if h.finished]
    assert sorted("".join(h.tokens) for h in finished) == sorted(returned)
    assert len({len(h.tokens) for h in finished}) == 3  # they ended at three different steps
    length_penalty = model.generation_config.length_penalty
    scores = sorted((h.log_probability / len(h.tokens) ** length_penalty for h in finished), reverse=True)
    assert scores == pytest.approx(output.sequences_scores.tolist(), abs=1e-4)
    (winner,) = [h for step in steps for h in step.hypotheses if h.winner]
    assert "".join(winner.tokens) == returned[0] and translation == tokenizer.decode(
        output.sequences[0], skip_special_tokens=True
    )


def check_the_winning_path_is_the_translation_as_a_second_pass_reads_it(model, tokenizer, source, **settings):
    steps, translation = decoding_steps(model, tokenizer, source, **settings)
    path = winning_path(steps)
    assert [hypothesis.tokens for hypothesis in path] == [
        list(path[-1].tokens[:length]) for length in range(1, len(path) + 1)
    ]
    assert path[-1].winner and not any(hypothesis.winner for hypothesis in path[:-1])
    maps = attention_maps(model, tokenizer, source, **settings)
    assert maps.translation == translation and list(path[-1].tokens) == maps.target_tokens
    assert source_labels(tokenizer, model, source) == maps.source_tokens
    rows = torch.stack([hypothesis.attention for hypothesis in path])
    torch.testing.assert_close(rows, maps.weights["encoder_decoder_attention"][-1].mean(0), atol=1e-5, rtol=0)
    return steps, path


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_winning_path_holds_the_attention_of_the_translation(model_and_tokenizer, num_beams):
    model, tokenizer = model_and_tokenizer
    check_the_winning_path_is_the_translation_as_a_second_pass_reads_it(
        model, tokenizer, SENTENCES[2], num_beams=num_beams
    )


def test_the_winning_path_ends_where_the_winner_finished_before_the_search_stopped():
    model, tokenizer, source, settings = beam_search_example()
    steps, path = check_the_winning_path_is_the_translation_as_a_second_pass_reads_it(
        model, tokenizer, source, **settings
    )
    assert len(path) < len(steps)  # finished hypotheses went on being searched after the winner ended
    with pytest.raises(ValueError, match="the steps hold no winner"):
        winning_path(steps[: len(path) - 1])


def test_teacher_forced_steps_give_each_reference_token_its_probability(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    maps = attention_maps(model, tokenizer, SENTENCES[0], target=TARGET, top_k=4)
    steps = teacher_forced_steps(maps)
    outputs, labels = plain_forward(model, tokenizer, SENTENCES[0], TARGET)
    probabilities = outputs.logits[0].softmax(-1)
    assert [step.hypotheses[0].token for step in steps] == token_labels(tokenizer, labels[0])
    assert [step.hypotheses[0].parent for step in steps] == [None] + [0] * (len(steps) - 1)  # a chain
    for position, step in enumerate(steps):
        hypothesis = step.hypotheses[0]
        assert hypothesis.probability == pytest.approx(probabilities[position, labels[0, position]].item(), abs=1e-6)
        top = probabilities[position].topk(4)
        assert [p for _, p in hypothesis.alternatives] == pytest.approx(top.values.tolist(), abs=1e-6)


@pytest.mark.parametrize(
    "source, message",
    [("", "source: the sentence is empty"), ("   ", "source: the sentence is empty"), ("a " * 3000, "positions")],
)
def test_bad_sources_are_refused(model_and_tokenizer, source, message):
    model, tokenizer = model_and_tokenizer
    for call in (attention_maps, decoding_steps):
        with pytest.raises(ValueError, match=message):
            call(model, tokenizer, source)


def retained_bytes(root) -> int:
    """The bytes of the objects reachable from `root`, each counted once, a tensor's storage with it."""
    seen, storages, total, stack = set(), set(), 0, [root]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, type):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
            continue
        stack.extend(gc.get_referents(item))
    return total


def test_what_the_steps_of_a_long_decoding_hold_grows_with_its_length_not_its_square():
    # every hypothesis holds its tokens so far: copied, they would grow with the square of the length
    model, tokenizer = tiny_model(vocab_size=14, max_position_embeddings=512), letter_tokenizer()

    def held(length: int) -> int:
        lengths = {"min_new_tokens": length, "max_new_tokens": length, "max_new_tokens_over_source": None}
        steps, _ = decoding_steps(model, tokenizer, "a b c", num_beams=2, **lengths)
        assert len(steps) == length and len(steps[-1].hypotheses[0].tokens) == length
        return retained_bytes(steps)

    assert held(400) < 2.2 * held(200)


def test_the_rows_of_a_thousand_steps_are_kept_in_a_few_allocations():
    rows, buffers = StepRows(), set()
    for step in range(1000):
        rows.append(torch.full((4, 3), float(step)))
        buffers.add(rows.buffer.data_ptr())
    assert len(buffers) <= 7  # 16 rows, then twice as many each time it is full: 1,024 after six doublings
    kept = rows.on_cpu()
    assert kept.shape == (1000, 4, 3) and torch.equal(kept[:, 0, 0], torch.arange(1000, dtype=torch.float32))
    assert StepRows().on_cpu().numel() == 0


@pytest.mark.slow  # two processes, a thousand-token search in each
def test_recording_a_long_search_takes_little_more_memory_than_the_search():
    """Every step's rows, kept as small tensors of their own, sat between the key-value cache's growing blocks and
    kept the allocator from reusing their space: recording a search took 2.4 to 4.6 times the search's memory."""
    setup = f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT / "tests")!r})
        from support.models import letter_tokenizer, tiny_model
        from hf_vanilla_transformer.inspection.capture import decoding_steps
        import torch
        model, tokenizer = tiny_model(vocab_size=14, d_model=256, max_position_embeddings=2048), letter_tokenizer()
        source, lengths = " ".join(["a"] * 500), dict(min_new_tokens=600, max_new_tokens=600)
        decoding_steps(model, tokenizer, "a b", num_beams=4, max_new_tokens=3, max_new_tokens_over_source=None)
    """
    recorded = peak_growth(
        setup, "decoding_steps(model, tokenizer, source, num_beams=4, max_new_tokens_over_source=None, **lengths)"
    )
    searched = peak_growth(
        setup, "with torch.no_grad(): model.generate(**tokenizer(source, return_tensors='pt'), num_beams=4, **lengths)"
    )
    assert recorded < 2 * searched, (recorded / 2**20, searched / 2**20)


def test_what_the_table_of_a_long_decoding_shows_grows_with_its_length_not_its_square():
    # the table showed each hypothesis whole: 4,000 rows of up to 5,000 characters for the demo's longest request
    model, tokenizer = tiny_model(vocab_size=14, max_position_embeddings=512), letter_tokenizer()

    def shown(length: int) -> int:
        lengths = {"min_new_tokens": length, "max_new_tokens": length, "max_new_tokens_over_source": None}
        steps, _ = decoding_steps(model, tokenizer, "a b c", num_beams=2, **lengths)
        return sum(len(cell) for row in steps_table(steps) for cell in row)

    assert shown(400) < 2.2 * shown(200)


SDPA_MAPS = """
import sys
import warnings
sys.path.insert(0, {tests!r})
from hf_vanilla_transformer.inspection.capture import attention_maps
from support.models import letter_tokenizer, tiny_model

warnings.simplefilter("ignore")  # ours, that an eager copy runs, is tested above
tokenizer = letter_tokenizer()
maps = attention_maps(tiny_model(vocab_size=len(tokenizer), attn_implementation="sdpa"), tokenizer, "a b c")
print("LAYERS", len(maps.weights["encoder_self_attention"]))
"""


@pytest.mark.slow  # a Python process of its own: torch and transformers imported again
def test_the_attention_of_an_sdpa_model_prints_no_line_of_transformers():
    """Asking an sdpa model whether it returns attention weights made transformers log, once a process, that sdpa
    does not support them: on a healthy run (the card's picture of a float32 run, the demo). A process of its own,
    as transformers logs it once a process."""
    script = SDPA_MAPS.format(tests=str(REPO_ROOT / "tests"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LAYERS 2" in result.stdout and result.stderr == "", result.stderr
