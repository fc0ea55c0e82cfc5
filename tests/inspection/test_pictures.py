import html
import json
import os
import re
import shutil
import subprocess
import warnings
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from matplotlib.colors import to_hex, to_rgb
from matplotlib.image import imread

from hf_vanilla_transformer.cli.attention import main as attention_main
from hf_vanilla_transformer.inspection.capture import (
    ATTENTION_KINDS,
    AttentionMaps,
    DecodingStep,
    PartialTranslation,
    TokensSoFar,
    attention_maps,
    decoding_steps,
    source_labels,
    token_labels,
)
from hf_vanilla_transformer.inspection.pictures import (
    AXIS_TITLES,
    COLOR_LEGEND,
    SO_FAR_CHARACTERS,
    WINNER,
    attention_figure,
    attention_page,
    axis_labels,
    cross_attention_figure,
    decoded_attention_figure,
    format_steps,
    kind_figure,
    save_figure,
    so_far_text,
    steps_table,
    warning_lines,
    write_attention_pictures,
)
from support.browser import headless_chromium
from support.models import SENTENCES, beam_search_example, generate_text
from support.paths import REPO_ROOT

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


def cell_colors(path, figure, cells: int) -> np.ndarray:
    """The mean colour (red, green, blue from 0 to 1) of each heat-map cell in the PNG at `path`, drawn with
    `figure`'s layout: rows x columns x 3."""
    image = imread(path)
    box = figure.axes[0].get_window_extent()  # pixels, origin at the bottom left
    height = image.shape[0]
    heat_map = image[round(height - box.y1) : round(height - box.y0), round(box.x0) : round(box.x1), :3]
    rows = np.array_split(np.arange(heat_map.shape[0]), cells)
    columns = np.array_split(np.arange(heat_map.shape[1]), cells)
    # the middle half of each cell, clear of the edges' antialiasing
    return np.array(
        [
            [heat_map[r[len(r) // 4 : -len(r) // 4]][:, c[len(c) // 4 : -len(c) // 4]].mean((0, 1)) for c in columns]
            for r in rows
        ]
    )


def cell_greens(path, figure, cells: int) -> np.ndarray:
    """In viridis green rises with the weight, from 0.0 (weight 0) to 0.9 (weight 1)."""
    return cell_colors(path, figure, cells)[..., 1]


def test_a_diagonal_attention_is_drawn_on_the_diagonal_with_the_tokens_as_labels(tmp_path):
    maps = diagonal_maps()
    paths = write_attention_pictures(maps, str(tmp_path))
    assert len(paths) == len(ATTENTION_KINDS) * 2 * (3 + 1)  # kinds x layers x (heads + mean)
    path = str(tmp_path / "encoder_decoder_attention_layer2_head3.png")
    assert path in paths
    weights = maps.weights["encoder_decoder_attention"][1, 2]
    title = "encoder-decoder attention, layer 2, head 3"
    figure = attention_figure(weights, TARGET_TOKENS, SOURCE_TOKENS, title, AXIS_TITLES["encoder_decoder_attention"])
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
    figure = attention_figure(weights, SOURCE_TOKENS, SOURCE_TOKENS, "a ramp", ("query", "key"))
    greens = cell_greens(save_figure(figure, str(tmp_path / "ramp.png")), figure, n).flatten()
    assert np.all(np.diff(greens) > 0)  # brighter where the weight is larger, cell by cell


def test_the_picture_of_the_longest_sentence_is_bounded_and_shows_every_token(tmp_path):
    """A model of 1,024 positions reads a source of 1,024 tokens and may write a translation as long: at 0.32 inch a
    token its picture was 33,000 pixels a side, 4 GB drawn, twice. It is at most 2,400 pixels a side; every token
    is still drawn (a diagonal map is bright along the diagonal), one in 21 labelled with its position, as the axis
    titles say."""
    n = 1024
    tokens = [f"w{i}" for i in range(n)]
    weights = torch.full((n, n), 0.1 / (n - 1)).fill_diagonal_(0.9)
    figure = attention_figure(weights, tokens, tokens, "a long sentence", ("query", "key"))
    assert max(figure.get_size_inches() * figure.dpi) <= 2400  # before it is drawn
    image = imread(save_figure(figure, str(tmp_path / "long.png")))
    assert max(image.shape[:2]) <= 2400
    axes = figure.axes[0]
    labelled = [f"{i + 1}: w{i}" for i in range(0, n, 21)]
    assert [label.get_text() for label in axes.get_xticklabels()] == labelled
    assert [label.get_text() for label in axes.get_yticklabels()] == labelled
    assert axes.get_xlabel() == "key (1,024 tokens, one in 21 labelled, with its position)"
    assert axes.get_ylabel() == "query (1,024 tokens, one in 21 labelled, with its position)"
    box = axes.get_window_extent()  # the heat map's pixels: row r's brightest column lies on the diagonal
    heat_map = image[round(image.shape[0] - box.y1) : round(image.shape[0] - box.y0), round(box.x0) : round(box.x1)]
    brightest = heat_map[..., 1].argmax(axis=1) / heat_map.shape[1]
    assert np.abs(brightest - np.linspace(0, 1, len(brightest))).max() < 0.02


def test_a_long_translation_of_a_short_source_keeps_its_rows_legible():
    """14 target tokens over 1,024 source tokens: the rows keep their full size and every label, the columns share
    the heat map's width."""
    rows, columns = [f"t{i}" for i in range(14)], [f"s{i}" for i in range(1024)]
    figure = attention_figure(torch.full((14, 1024), 1 / 1024), rows, columns, "wide", ("target", "source"))
    width, height = figure.get_size_inches() * figure.dpi
    assert width <= 2400 and 0.32 * 14 * 100 <= height <= 2400
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_yticklabels()] == rows and axes.get_ylabel() == "target"
    assert len(axes.get_xticklabels()) == 49 and axes.get_xlabel().startswith("source (1,024 tokens, one in 21")


def test_every_picture_says_what_its_rows_and_columns_are_and_has_a_colour_legend():
    maps = diagonal_maps()
    expected = {
        "encoder_self_attention": ("query ↓", "key →", SOURCE_TOKENS, SOURCE_TOKENS),
        "decoder_self_attention": (
            "query ↓",
            "key →",
            ["<s> → Ein", "Ein →  Mann", " Mann →  schl", " schl → äft", "äft → .", ". → </s>"],
            ["<s>", *TARGET_TOKENS[:-1]],  # row i starts with column i's token: the position's own input
        ),
        "encoder_decoder_attention": ("target ↓", "source →", TARGET_TOKENS, SOURCE_TOKENS),
    }
    for kind, (row_title, column_title, rows, columns) in expected.items():
        figure = kind_figure(maps, kind, maps.weights[kind][0, 0], "layer 1, head 1")
        axes, colour_bar = figure.axes
        assert axes.get_ylabel().startswith(row_title) and axes.get_xlabel().startswith(column_title)
        assert [label.get_text() for label in axes.get_yticklabels()] == rows
        assert [label.get_text() for label in axes.get_xticklabels()] == columns
        assert colour_bar.get_ylabel() == COLOR_LEGEND and colour_bar.get_ylim() == (0.0, 1.0)
        assert axes.get_title() == f"{ATTENTION_KINDS[kind]}, layer 1, head 1"


def test_pictures_go_into_folders_made_when_missing(tmp_path):
    folder = tmp_path / "not" / "yet"
    paths = write_attention_pictures(diagonal_maps(), str(folder), layer=1, head=1)
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{kind}_layer1_head1.png" for kind in ATTENTION_KINDS)
    assert all(imread(path).shape[0] > 100 for path in paths)


def test_warnings_of_characters_no_font_has_are_one_line(tmp_path):
    hieroglyphs = ["\U00013000", "\U00013001"]  # in no font that matplotlib or a CJK package brings
    tokens = [*hieroglyphs, "</s>"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ("one", "two"):  # two pictures: each warns again
            save_figure(attention_figure(torch.eye(3), tokens, tokens, "?", ("query", "key")), str(tmp_path / name))
    messages = [str(warning.message) for warning in caught]
    assert len(messages) >= 4 and all("missing from font" in message for message in messages)
    assert warning_lines([*messages, "a plain warning", "a plain warning"]) == [
        "a plain warning",
        "no installed font has \U00013000 \U00013001: drawn as boxes",
    ]


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
    figure = attention_figure(torch.eye(n), tokens, tokens, "中文", ("查询", "键"))
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
    data = page_data(page)["kinds"]
    assert set(data) == set(ATTENTION_KINDS)
    for kind, shown in data.items():
        assert torch.allclose(torch.tensor(shown["weights"]), maps.weights[kind], atol=1e-4)
        assert (shown["rows"], shown["columns"]) == axis_labels(maps, kind)
        assert (shown["row_title"], shown["column_title"]) == AXIS_TITLES[kind]
    assert len(data["encoder_self_attention"]["weights"]) == model.config.encoder_layers
    assert len(data["encoder_decoder_attention"]["weights"][0]) == model.config.decoder_attention_heads
    assert "<h2>Beam search, 2 beams</h2>" in page and len(tree_items(page)) == sum(len(s.hypotheses) for s in steps)
    assert maps.translation in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched from elsewhere


def test_the_page_opens_on_the_last_layers_cross_attention_in_the_pictures_colours(tmp_path):
    maps = diagonal_maps(layers=2, heads=3)
    data = page_data(attention_page(maps))
    assert data["view"] == {"kind": "encoder_decoder_attention", "layer": 1, "head": "mean"}  # layer 2, from 0
    viridis = colormaps["viridis"]
    assert data["colors"] == [to_hex(viridis(index)) for index in range(256)] and data["legend"] == COLOR_LEGEND
    # the PNG's cells have the page's colours: 0.9 on the diagonal, 0.02 elsewhere
    weights = maps.weights["encoder_decoder_attention"][1].mean(0)
    figure = kind_figure(maps, "encoder_decoder_attention", weights, "layer 2, mean over heads")
    colors = cell_colors(save_figure(figure, str(tmp_path / "mean.png")), figure, len(SOURCE_TOKENS))
    for weight, color in ((0.9, colors[0, 0]), (0.1 / 5, colors[0, 1])):
        assert color == pytest.approx(to_rgb(data["colors"][int(weight * 256)]), abs=2 / 255)


class TreeReader(HTMLParser):
    """The beam tree's items: data-id, data-parent, the data-id of the item it is nested in, classes and text."""

    def __init__(self):
        super().__init__()
        self.items, self.open = [], []

    def handle_starttag(self, tag, attributes):
        attributes = dict(attributes)
        if tag == "li":
            enclosing = self.open[-1]["id"] if self.open else ""
            item = {
                "id": attributes["data-id"],
                "parent": attributes["data-parent"],
                "nested_in": enclosing,
                "classes": attributes["class"].split(),
                "text": "",
            }
            self.items.append(item)
            self.open.append(item)

    def handle_endtag(self, tag):
        if tag == "li":
            self.open.pop()

    def handle_data(self, data):
        if self.open:
            self.open[-1]["text"] += data


def tree_items(page: str) -> list[dict]:
    reader = TreeReader()
    reader.feed(page)
    return reader.items


def test_the_beam_search_is_a_tree_with_one_winner_the_translation():
    model, tokenizer, source, settings = beam_search_example()
    maps = attention_maps(model, tokenizer, source, **settings)
    steps, translation = decoding_steps(model, tokenizer, source, **settings)
    items = tree_items(attention_page(maps, {"Beam search, 3 beams": steps}))
    assert [item["id"] for item in items if not item["parent"]] == ["1.1", "1.2", "1.3"]
    assert all(item["nested_in"] == item["parent"] for item in items)  # drawn under the one it extends
    assert {item["id"].split(".")[0] for item in items} == {str(step.step) for step in steps}
    (winner,) = [item for item in items if WINNER in item["text"]]
    with torch.no_grad():
        returned = model.generate(**tokenizer(source, return_tensors="pt"), **settings)[0]
    assert winner["text"].endswith(json.dumps("".join(token_labels(tokenizer, returned[1:]))))
    assert tokenizer.decode(returned, skip_special_tokens=True) == translation
    assert sum("✓ finished" in item["text"] for item in items) == 2 and any("✗ dropped" in i["text"] for i in items)
    # the winner's path: it and every hypothesis it grew from, back to step 1
    path = [item["id"] for item in items if "path" in item["classes"]]
    assert len(path) == int(winner["id"].split(".")[0]) and path[-1] == winner["id"]


def test_a_long_hypothesis_shows_its_end_and_says_it_is_cut():
    tokens = None
    for token in ["Ein", " Mann", *[" und"] * 30, "."]:
        tokens = TokensSoFar(tokens, token)
    assert list(reversed(tokens)) == list(tokens)[::-1]
    text = "".join(tokens)
    assert so_far_text(tokens) == "…" + json.dumps(text[-SO_FAR_CHARACTERS:], ensure_ascii=False)
    assert so_far_text(["Ein", " Mann", "."]) == '"Ein Mann."'
    exactly = ["x" * (SO_FAR_CHARACTERS - 1), "y"]
    assert so_far_text(exactly) == json.dumps("".join(exactly))


def test_tables_quote_tokens_so_that_spaces_and_commas_show():
    hypotheses = [
        PartialTranslation(["Ein"], "Ein", 0.9, -0.1, [("Ein", 0.9), (" ", 0.05)], "A", [1.0]),
        PartialTranslation(["Ein", ","], ",", 0.5, -0.8, [(",", 0.5), (" Mann", 0.3)], " man", [1.0], parent=0),
    ]
    steps = [DecodingStep(1, hypotheses[:1]), DecodingStep(2, hypotheses[1:])]
    assert steps_table(steps)[1][1:5] == ["1", "1", '"Ein,"', '","']
    assert steps_table(steps)[1][7:9] == ['"," 0.50, " Mann" 0.30', '" man"']
    assert '" " 0.05' in format_steps("Greedy", steps)
    page = html.unescape(attention_page(diagonal_maps(), {"Greedy": steps}))
    assert '<td>"Ein,"</td><td>","</td>' in page


def screenshot_color(screenshot: np.ndarray, browser, element) -> np.ndarray:
    """The colour (red, green, blue from 0 to 1) at the middle of `element` in a screenshot of `browser`."""
    box = browser.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return [r.x, r.y, r.width, r.height]", element
    )
    scale = browser.execute_script("return window.devicePixelRatio")
    x, y = round((box[0] + box[2] / 2) * scale), round((box[1] + box[3] / 2) * scale)
    return screenshot[y, x, :3]


@pytest.mark.slow
def test_the_page_draws_the_chosen_map_in_a_real_browser(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    maps = diagonal_maps(layers=2, heads=3)
    maps.weights["encoder_self_attention"] = torch.rand(2, 3, 6, 6).softmax(-1)
    model, tokenizer, source, settings = beam_search_example()
    steps, _ = decoding_steps(model, tokenizer, source, **settings)
    page = tmp_path / "attention.html"
    page.write_text(attention_page(maps, {"Beam search, 3 beams": steps}), encoding="utf-8")
    with headless_chromium() as browser:
        browser.get(page.as_uri())

        def shown():
            cells = browser.find_elements(By.CSS_SELECTOR, "#map tbody td")
            return [float(cell.get_attribute("title").rsplit(": ", 1)[1]) for cell in cells]

        # it opens on the view that shows the translation: the last layer's encoder-decoder attention, mean of heads
        assert browser.find_element(By.ID, "caption").text == "encoder-decoder attention, layer 2, mean of heads"
        assert shown() == pytest.approx(
            maps.weights["encoder_decoder_attention"][1].mean(0).flatten().tolist(), abs=1e-3
        )
        titles = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#map th.axis")]
        assert titles == list(reversed(AXIS_TITLES["encoder_decoder_attention"]))  # columns' above the rows'
        # drawn in the PNGs' colours: the screenshot's cells are viridis of their weights
        screenshot_file = tmp_path / "page.png"
        assert browser.save_screenshot(str(screenshot_file))
        screenshot = imread(screenshot_file)
        cells = browser.find_elements(By.CSS_SELECTOR, "#map tbody tr:first-child td")
        for cell, weight in zip(cells[:2], (0.9, 0.02), strict=True):
            expected = colormaps["viridis"](weight)[:3]
            assert screenshot_color(screenshot, browser, cell) == pytest.approx(expected, abs=2 / 255)
        Select(browser.find_element(By.ID, "kind")).select_by_value("encoder_self_attention")
        Select(browser.find_element(By.ID, "layer")).select_by_visible_text("1")
        Select(browser.find_element(By.ID, "head")).select_by_visible_text("1")
        assert browser.find_element(By.ID, "caption").text == "encoder self-attention, layer 1, head 1"
        keys = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#map thead tr:last-child th")][1:]
        assert keys == SOURCE_TOKENS  # spaces kept
        assert shown() == pytest.approx(maps.weights["encoder_self_attention"][0, 0].flatten().tolist(), abs=1e-3)
        Select(browser.find_element(By.ID, "kind")).select_by_value("decoder_self_attention")
        rows = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#map tbody th")]
        assert rows[:2] == ["<s> → Ein", "Ein →  Mann"]
        # the beam tree: each hypothesis drawn inside the one it extends
        parents = browser.execute_script(
            "return [...document.querySelectorAll('.tree li')].map(li => "
            "[li.dataset.parent, li.parentElement.closest('li') ? li.parentElement.closest('li').dataset.id : ''])"
        )
        assert len(parents) == sum(len(step.hypotheses) for step in steps)
        assert all(parent == enclosing for parent, enclosing in parents)
        assert browser.get_log("browser") == []  # no script errors


def test_tokens_cannot_break_out_of_the_page():
    maps = diagonal_maps()
    maps.source_tokens = ["</script><script>alert(1)</script>", *SOURCE_TOKENS[1:]]
    maps.source = "<b>bold</b>"
    page = attention_page(maps)
    assert page.count("<script") == 2 and "<b>bold</b>" not in page
    assert page_data(page)["kinds"]["encoder_self_attention"]["columns"][0] == maps.source_tokens[0]


def drawn(figure) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())


def test_the_picture_from_the_steps_is_the_picture_of_a_second_pass():
    """What the demo draws from one search's recorded rows is the picture `vanilla-attention` and the card draw from a
    second pass over the translation: same title, axes, labels and size, and the same colours."""
    model, tokenizer, source, settings = beam_search_example()
    model.set_attn_implementation("eager")
    steps, _ = decoding_steps(model, tokenizer, source, **settings)
    from_steps = decoded_attention_figure(steps, source_labels(tokenizer, model, source))
    second_pass = cross_attention_figure(attention_maps(model, tokenizer, source, **settings))
    for ours, theirs in zip(from_steps.axes, second_pass.axes, strict=True):
        assert ours.get_title() == theirs.get_title() and ours.get_xlabel() == theirs.get_xlabel()
        assert ours.get_ylabel() == theirs.get_ylabel()
        assert [t.get_text() for t in ours.get_yticklabels()] == [t.get_text() for t in theirs.get_yticklabels()]
        assert [t.get_text() for t in ours.get_xticklabels()] == [t.get_text() for t in theirs.get_xticklabels()]
    ours, theirs = drawn(from_steps), drawn(second_pass)
    assert ours.shape == theirs.shape
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1  # a rounding of the last bit at most


def test_format_steps_is_a_table_with_a_row_per_hypothesis(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    steps, _ = decoding_steps(model, tokenizer, SENTENCES[0], num_beams=1)
    lines = format_steps("Greedy decoding", steps).splitlines()
    assert lines[0] == "Greedy decoding" and lines[1].split()[:5] == ["step", "beam", "from", "so", "far"]
    assert len(lines) == 2 + len(steps)
    assert lines[-1].split()[0] == str(len(steps)) and lines[-1].endswith(WINNER) and '"</s>"' in lines[-1]


def vanilla_attention(*args) -> subprocess.CompletedProcess:
    command = shutil.which("vanilla-attention")
    assert command, "the vanilla-attention console script is not installed"
    # this checkout's package, not the one installed: they differ in a git worktree
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path}
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=300, env=env)


def test_the_command_writes_every_picture_and_the_page_and_prints_the_steps(trained_run, model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    output = tmp_path / "attention"
    result = vanilla_attention(
        "--model", str(trained_run.output), "--source", SENTENCES[0], "--steps", "--output_dir", str(output)
    )
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
    # it loads the model on the eager attention path, the one that returns attention weights: no warning, no copy
    assert "attention weights need the eager attention path" not in result.stderr
    assert "Warning" not in result.stderr
    page = (output / "attention.html").read_text(encoding="utf-8")
    assert "Greedy decoding" in page and translation in page


def test_the_command_with_a_target_shows_teacher_forcing(trained_run, tmp_path):
    output = tmp_path / "forced"
    result = vanilla_attention(
        "--model",
        str(trained_run.output),
        "--source",
        SENTENCES[0],
        "--target",
        "Ein Mann schläft.",
        "--steps",
        "--layer",
        "1",
        "--head",
        "2",
        "--output_dir",
        str(output),
    )
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
        (["--source", "a " * 3000], ": error: source: 3001 tokens, more than the model's 1024 positions"),  # and </s>
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


@pytest.mark.slow  # a fresh Python: 8 s of imports, too many for the quick tier
def test_the_command_exits_with_status_1_on_bad_input(tmp_path):
    result = vanilla_attention("--model", str(tmp_path), "--source", "A man.", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"vanilla-attention: error: {tmp_path}: not a model folder (no config.json)"
    )
