import json
import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from helpers import SENTENCES, generate_text, headless_chromium
from hf_vanilla_transformer.commands import attention_main
from hf_vanilla_transformer.inspection import ATTENTION_KINDS, AttentionMaps, attention_maps, decoding_steps
from hf_vanilla_transformer.visualize import (
    attention_figure,
    attention_page,
    format_steps,
    save_figure,
    write_attention_pictures,
)

SOURCE_TOKENS = ["A", " man", " is", " sleeping", ".", "</s>"]
TARGET_TOKENS = ["Ein", " Mann", " schl", "äft", ".", "</s>"]


def diagonal_maps(layers: int = 2, heads: int = 3) -> AttentionMaps:
    """Maps whose every attention looks at the key in the query's own position (0.9 there, the rest shared)."""
    n = len(SOURCE_TOKENS)
    diagonal = torch.full((n, n), 0.1 / (n - 1)).fill_diagonal_(0.9)
    weights = diagonal.expand(layers, heads, n, n).clone()
    return AttentionMaps(
        source="A man is sleeping.",
        translation="Ein Mann schläft.",
        teacher_forced=True,
        source_tokens=SOURCE_TOKENS,
        target_tokens=TARGET_TOKENS,
        decoder_input_tokens=["<s>", *TARGET_TOKENS[:-1]],
        weights=dict.fromkeys(ATTENTION_KINDS, weights),
        target_probabilities=[0.5] * n,
        target_alternatives=[[(token, 0.5)] for token in TARGET_TOKENS],
    )


def cell_greens(path, figure, cells: int) -> np.ndarray:
    """The mean green of each heat-map cell in the PNG at `path`, drawn with `figure`'s layout. In viridis green
    rises with the weight, from 0.0 (weight 0) to 0.9 (weight 1)."""
    image = imread(path)
    box = figure.axes[0].get_window_extent()  # pixels, origin at the bottom left
    height = image.shape[0]
    heat_map = image[round(height - box.y1) : round(height - box.y0), round(box.x0) : round(box.x1), 1]
    rows = np.array_split(np.arange(heat_map.shape[0]), cells)
    columns = np.array_split(np.arange(heat_map.shape[1]), cells)
    # the middle half of each cell, clear of the edges' antialiasing
    return np.array(
        [
            [heat_map[r[len(r) // 4 : -len(r) // 4]][:, c[len(c) // 4 : -len(c) // 4]].mean() for c in columns]
            for r in rows
        ]
    )


def test_a_diagonal_attention_is_drawn_on_the_diagonal_with_the_tokens_as_labels(tmp_path):
    maps = diagonal_maps()
    paths = write_attention_pictures(maps, str(tmp_path))
    assert len(paths) == len(ATTENTION_KINDS) * 2 * (3 + 1)  # kinds x layers x (heads + mean)
    path = str(tmp_path / "encoder_decoder_attention_layer2_head3.png")
    assert path in paths
    weights = maps.weights["encoder_decoder_attention"][1, 2]
    title = "encoder-decoder attention, layer 2, head 3"
    figure = attention_figure(weights, TARGET_TOKENS, SOURCE_TOKENS, title)
    save_figure(figure, str(tmp_path / "again.png"))
    assert np.array_equal(imread(path), imread(tmp_path / "again.png"))  # the picture is this figure
    greens = cell_greens(path, figure, len(SOURCE_TOKENS))
    on_diagonal = np.eye(len(SOURCE_TOKENS), dtype=bool)
    assert greens[on_diagonal].min() > 0.8 and greens[~on_diagonal].max() < 0.1
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()] == SOURCE_TOKENS
    assert [label.get_text() for label in axes.get_yticklabels()] == TARGET_TOKENS
    assert axes.get_title() == title


def test_the_colours_follow_the_weights(tmp_path):
    n = len(SOURCE_TOKENS)
    weights = torch.linspace(0, 1, n * n).reshape(n, n)
    figure = attention_figure(weights, SOURCE_TOKENS, SOURCE_TOKENS, "a ramp")
    greens = cell_greens(save_figure(figure, str(tmp_path / "ramp.png")), figure, n).flatten()
    assert np.all(np.diff(greens) > 0)  # brighter where the weight is larger, cell by cell


def test_one_layer_and_head_can_be_drawn_and_others_are_refused(tmp_path):
    maps = diagonal_maps(layers=2, heads=3)
    paths = write_attention_pictures(maps, str(tmp_path), layer=2, head=1)
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == sorted(f"{kind}_layer2_head1.png" for kind in ATTENTION_KINDS)
    for layer, head, message in ((3, None, "layer 3: the model has layers 1 to 2"), (None, 0, "head 0: the model")):
        with pytest.raises(ValueError, match=message):
            write_attention_pictures(maps, str(tmp_path), layer=layer, head=head)


def test_chinese_labels_are_drawn_with_a_cjk_font(tmp_path):
    tokens = ["我", "喜欢", "吃", "苹果", "。", "</s>"]
    n = len(tokens)
    figure = attention_figure(torch.eye(n), tokens, tokens, "中文")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_figure(figure, str(tmp_path / "chinese.png"))
    assert not [str(w.message) for w in caught if "missing from" in str(w.message) or "CJK" in str(w.message)]


def page_data(page: str) -> dict:
    script = re.search(r'<script id="attention-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(script.group(1))


def test_the_page_holds_every_kind_layer_and_head_and_needs_no_network(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    maps = attention_maps(model, tokenizer, SENTENCES[0])
    steps, _ = decoding_steps(model, tokenizer, SENTENCES[0], num_beams=2)
    page = attention_page(maps, {"Beam search, 2 beams": steps})
    data = page_data(page)
    assert set(data) == set(ATTENTION_KINDS)
    for kind, shown in data.items():
        assert torch.allclose(torch.tensor(shown["weights"]), maps.weights[kind], atol=1e-4)
        assert (shown["queries"], shown["keys"]) == maps.queries_and_keys(kind)
    assert len(data["encoder_self_attention"]["weights"]) == model.config.encoder_layers
    assert len(data["encoder_decoder_attention"]["weights"][0]) == model.config.decoder_attention_heads
    assert "<h2>Beam search, 2 beams</h2>" in page and page.count("<tr>") >= len(steps) + 1
    assert maps.translation in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched from elsewhere


@pytest.mark.slow
def test_the_page_draws_the_chosen_map_in_a_real_browser(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    maps = diagonal_maps(layers=2, heads=3)
    maps.weights["encoder_self_attention"] = torch.rand(2, 3, 6, 6).softmax(-1)
    page = tmp_path / "attention.html"
    page.write_text(attention_page(maps), encoding="utf-8")
    with headless_chromium() as browser:
        browser.get(page.as_uri())

        def shown():
            cells = browser.find_elements(By.CSS_SELECTOR, "#map tbody td")
            return [float(cell.get_attribute("title").rsplit(": ", 1)[1]) for cell in cells]

        assert browser.find_element(By.ID, "caption").text == "encoder self-attention, layer 1, head 1"
        keys = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#map thead th")][1:]
        assert keys == SOURCE_TOKENS  # spaces kept
        assert shown() == pytest.approx(maps.weights["encoder_self_attention"][0, 0].flatten().tolist(), abs=1e-3)
        Select(browser.find_element(By.ID, "layer")).select_by_visible_text("2")
        Select(browser.find_element(By.ID, "head")).select_by_visible_text("mean of heads")
        mean = maps.weights["encoder_self_attention"][1].mean(0)
        assert shown() == pytest.approx(mean.flatten().tolist(), abs=1e-3)
        Select(browser.find_element(By.ID, "kind")).select_by_value("encoder_decoder_attention")
        assert browser.find_element(By.ID, "caption").text == "encoder-decoder attention, layer 2, mean of heads"
        assert len(browser.find_elements(By.CSS_SELECTOR, "#map tbody tr")) == len(TARGET_TOKENS)
        assert browser.get_log("browser") == []  # no script errors


def test_tokens_cannot_break_out_of_the_page():
    maps = diagonal_maps()
    maps.source_tokens = ["</script><script>alert(1)</script>", *SOURCE_TOKENS[1:]]
    maps.source = "<b>bold</b>"
    page = attention_page(maps)
    assert page.count("<script") == 2 and "<b>bold</b>" not in page
    assert page_data(page)["encoder_self_attention"]["keys"][0] == maps.source_tokens[0]


def test_format_steps_is_a_table_with_a_row_per_hypothesis(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    steps, _ = decoding_steps(model, tokenizer, SENTENCES[0], num_beams=1)
    lines = format_steps("Greedy decoding", steps).splitlines()
    assert lines[0] == "Greedy decoding" and lines[1].split()[:3] == ["step", "so", "far"]
    assert len(lines) == 2 + len(steps)
    assert lines[-1].split()[0] == str(len(steps)) and "</s> (end)" in lines[-1]


def vanilla_attention(*args) -> subprocess.CompletedProcess:
    command = shutil.which("vanilla-attention")
    assert command, "the vanilla-attention console script is not installed"
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=300)


def test_the_command_writes_every_picture_and_the_page_and_prints_the_steps(trained_run, model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    output = tmp_path / "attention"
    result = vanilla_attention("--model", str(trained_run.output), "--source", SENTENCES[0], "--steps",
                               "--output_dir", str(output))  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = model.config
    layers_and_heads = {
        "encoder_self_attention": (config.encoder_layers, config.encoder_attention_heads),
        "decoder_self_attention": (config.decoder_layers, config.decoder_attention_heads),
        "encoder_decoder_attention": (config.decoder_layers, config.decoder_attention_heads),
    }
    expected = {
        f"{kind}_layer{layer}_{head}.png"
        for kind, (layers, heads) in layers_and_heads.items()
        for layer in range(1, layers + 1)
        for head in [*(f"head{h}" for h in range(1, heads + 1)), "mean"]
    }
    assert {p.name for p in output.iterdir()} == expected | {"attention.html"}
    translation = generate_text(model, tokenizer, SENTENCES[:1])[0]
    assert result.stdout.startswith(f"translation: {translation}\n")
    assert "Greedy decoding" in result.stdout and "Beam search, 4 beams" in result.stdout
    assert "'sdpa' to 'eager'" in result.stderr  # it says that it switched the attention path
    page = (output / "attention.html").read_text(encoding="utf-8")
    assert "Greedy decoding" in page and translation in page


def test_the_command_with_a_target_shows_teacher_forcing(trained_run, tmp_path):
    output = tmp_path / "forced"
    result = vanilla_attention("--model", str(trained_run.output), "--source", SENTENCES[0], "--target",
                               "Ein Mann schläft.", "--steps", "--layer", "1", "--head", "2",
                               "--output_dir", str(output))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("target: Ein Mann schläft.\n")
    assert "Teacher forcing" in result.stdout and "Greedy" not in result.stdout
    assert sorted(p.name for p in output.iterdir()) == sorted(
        [*(f"{kind}_layer1_head2.png" for kind in ATTENTION_KINDS), "attention.html"]
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--model", "{missing}"], ": error: {missing}: not a model folder (no config.json)"),
        (["--source", ""], ": error: source: the sentence is empty"),
        (["--source", "a " * 3000], ": error: source: 3002 tokens, more than the model's 1024 positions"),
        (["--layer", "7"], ": error: layer 7: the model has layers 1 to 2"),
        (["--head", "9"], ": error: head 9: the model has heads 1 to 4"),
        (["--target", " "], ": error: target: the sentence is empty"),
    ],
)
def test_bad_input_is_one_clear_line_and_writes_nothing(trained_run, tmp_path, arguments, message):
    values = {"--model": str(trained_run.output), "--source": SENTENCES[0], "--output_dir": str(tmp_path / "out")}
    missing = str(tmp_path / "no-model")
    for flag, value in zip(arguments[::2], arguments[1::2], strict=True):
        values[flag] = value.format(missing=missing)
    with pytest.raises(SystemExit) as exit:  # sys.exit(message): Python prints it and exits with status 1
        attention_main([item for pair in values.items() for item in pair])
    assert str(exit.value.code).startswith("vanilla-attention: error: ")
    assert message.format(missing=missing) in str(exit.value.code) and "\n" not in str(exit.value.code)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_the_command_exits_with_status_1_on_bad_input(tmp_path):
    result = vanilla_attention("--model", str(tmp_path), "--source", "A man.", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"vanilla-attention: error: {tmp_path}: not a model folder (no config.json)"
    )
