"""Attention pictures and step-by-step decoding of a trained model, as PNG files and one self-contained HTML page.

    vanilla-attention --model runs/multi30k-small --source "A man is sleeping." --output_dir attention
    vanilla-attention --model runs/multi30k-small --source "A man is sleeping." \\
        --target "Ein Mann schläft." --steps --output_dir attention

For the model's own translation of --source (or --target, read with teacher forcing) it draws the encoder
self-attention, the decoder's masked self-attention and the encoder-decoder attention of every layer and head, and
their mean over heads, as `KIND_layerL_headH.png` / `KIND_layerL_mean.png` (layers and heads counted from 1;
--layer and --head draw one only), and writes `attention.html`, where a reader picks the kind, layer and head; the
page needs no network. --steps adds the decoding step by step (greedy and beam search; with --target, the
probability the model gives each reference token), printed and on the page. Drawing needs matplotlib
(`pip install "hf-vanilla-transformer[pictures]"`); Chinese and Japanese tokens need a CJK font (Debian:
`apt-get install fonts-wqy-microhei`).
"""

import functools
import html
import importlib.util
import json
import logging
import os
import re
import warnings

import numpy as np

from .files import replace_atomically
from .inspection import (
    ATTENTION_KINDS,
    AttentionMaps,
    DecodingStep,
    attention_maps,
)

# fonts with CJK characters that matplotlib falls back to for labels DejaVu Sans cannot draw
CJK_FONTS = ("WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Noto Sans CJK SC", "Noto Sans CJK JP", "Droid Sans Fallback")
COLOR_MAP = "viridis"  # 0 dark purple, 1 yellow: readable in grey too
PAGE_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_page.html")
logger = logging.getLogger(__name__)


@functools.cache
def installed_cjk_fonts() -> tuple[str, ...]:
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return tuple(name for name in CJK_FONTS if name in installed)


def font_families(labels: list[str]) -> list[str]:
    """DejaVu Sans, then the installed CJK fonts; a warning when `labels` need one and none is installed."""
    cjk = installed_cjk_fonts()
    if not cjk and any(is_cjk(character) for label in labels for character in label):
        warnings.warn(
            "no CJK font installed: Chinese, Japanese or Korean labels are drawn as boxes "
            "(Debian: apt-get install fonts-wqy-microhei)",
            stacklevel=2,
        )
    return ["DejaVu Sans", *cjk]


def is_cjk(character: str) -> bool:
    code = ord(character)
    return 0x2E80 <= code <= 0x9FFF or 0xAC00 <= code <= 0xD7AF or 0xF900 <= code <= 0xFAFF or 0xFF00 <= code <= 0xFFEF


def attention_figure(weights, row_labels: list[str], column_labels: list[str], title: str):
    """A heat map of `weights` (queries x keys, each row summing to 1): rows are the queries, columns the keys,
    labelled with their tokens; 0 is dark purple and 1 yellow."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    weights = np.asarray(weights, dtype=np.float32)
    rows, columns = len(row_labels), len(column_labels)
    if weights.shape != (rows, columns):
        raise ValueError(f"weights of shape {tuple(weights.shape)} for {rows} row and {columns} column labels")
    # tokens are text, never TeX: "$5" must not start a formula
    with rc_context({"font.family": font_families(row_labels + column_labels), "text.parse_math": False}):
        width = max(1.8 + 0.32 * columns, 1.0 + 0.07 * len(title))  # wide enough for the title too
        figure = Figure(figsize=(width, 1.4 + 0.32 * rows), dpi=100, layout="constrained")
        axes = figure.add_subplot()
        image = axes.imshow(weights, cmap=COLOR_MAP, vmin=0.0, vmax=1.0, interpolation="nearest")
        axes.set_xticks(range(columns), column_labels, rotation=90)
        axes.set_yticks(range(rows), row_labels)
        axes.set_title(title, fontsize=9)
        figure.colorbar(image, ax=axes, shrink=0.8)
    return figure


def save_figure(figure, path: str) -> str:
    """Write `figure` as a PNG at `path`, all or nothing: a reader never sees half a picture."""
    replace_atomically(path, lambda temporary: figure.savefig(temporary, format="png"))
    return path


CARD_PICTURE = "attention.png"


def write_card_picture(model, tokenizer, source: str, output_dir: str) -> str | None:
    """The encoder-decoder attention (last layer, mean over heads) of the model's translation of `source`, as
    `attention.png` in `output_dir`: the picture the model card shows. None, and a log line, without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        logger.warning("matplotlib is not installed: no attention picture for the card (the [pictures] extra has it)")
        return None
    with warnings.catch_warnings():  # the switch to eager attention is expected here
        warnings.filterwarnings("ignore", message="attention weights need the eager attention path")
        try:
            maps = attention_maps(model.eval(), tokenizer, source)
        except ValueError as error:  # a picture is not worth failing a finished training run for
            logger.warning("no attention picture for the card: %s", error)
            return None
    return save_figure(cross_attention_figure(maps), os.path.join(output_dir, CARD_PICTURE))


def cross_attention_figure(maps: AttentionMaps):
    """The picture of where the decoder looked: the encoder-decoder attention of the last layer, mean over heads."""
    queries, keys = maps.queries_and_keys("encoder_decoder_attention")
    weights = maps.weights["encoder_decoder_attention"][-1].mean(0)
    return attention_figure(weights, queries, keys, "encoder-decoder attention, last layer, mean over heads")


def check_selection(maps: AttentionMaps, layer: int | None, head: int | None) -> None:
    """Refuse a layer or head (counted from 1) that the model does not have."""
    layers = min(weights.shape[0] for weights in maps.weights.values())
    heads = min(weights.shape[1] for weights in maps.weights.values())
    if layer is not None and not 1 <= layer <= layers:
        raise ValueError(f"layer {layer}: the model has layers 1 to {layers}")
    if head is not None and not 1 <= head <= heads:
        raise ValueError(f"head {head}: the model has heads 1 to {heads}")


def write_attention_pictures(
    maps: AttentionMaps, output_dir: str, layer: int | None = None, head: int | None = None
) -> list[str]:
    """PNG files of every kind of attention, for each layer and head and the mean over heads (or only `layer` and
    `head`, counted from 1). Returns their paths."""
    check_selection(maps, layer, head)
    paths = []
    for kind, title in ATTENTION_KINDS.items():
        queries, keys = maps.queries_and_keys(kind)
        weights = maps.weights[kind]
        for layer_index in [layer - 1] if layer else range(weights.shape[0]):
            per_layer = weights[layer_index]
            heads = [head - 1] if head else range(per_layer.shape[0])
            pictures = [(f"head{h + 1}", f"head {h + 1}", per_layer[h]) for h in heads]
            if head is None:
                pictures.append(("mean", "mean over heads", per_layer.mean(0)))
            for name, caption, picture in pictures:
                figure = attention_figure(picture, queries, keys, f"{title}, layer {layer_index + 1}, {caption}")
                paths.append(save_figure(figure, os.path.join(output_dir, f"{kind}_layer{layer_index + 1}_{name}.png")))
    return paths


def steps_table(steps: list[DecodingStep]) -> list[list[str]]:
    """Rows of a table of the decoding: step, hypothesis so far, token added, its probability, the log-probability
    of the hypothesis, the top alternatives and where the encoder-decoder attention looked."""
    rows = []
    for step in steps:
        for hypothesis in step.hypotheses:
            rows.append(
                [
                    str(step.step),
                    "".join(hypothesis.tokens),
                    hypothesis.token + (" (end)" if hypothesis.finished else ""),
                    f"{hypothesis.probability:.3f}",
                    f"{hypothesis.log_probability:.2f}",
                    ", ".join(f"{token} {probability:.2f}" for token, probability in hypothesis.alternatives),
                    hypothesis.looked_at,
                ]
            )
    return rows


STEP_COLUMNS = ["step", "so far", "token", "p", "log p (all)", "top alternatives", "attention on"]


def format_steps(title: str, steps: list[DecodingStep]) -> str:
    """The table as plain text, for a terminal."""
    rows = [STEP_COLUMNS, *steps_table(steps)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(STEP_COLUMNS))]
    lines = [title] + ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def attention_page(maps: AttentionMaps, step_tables: dict[str, list[DecodingStep]] | None = None) -> str:
    """One HTML page, scripts and data inline (no network): pick the kind, layer and head (or the mean) of the
    attention to show as a heat map of the tokens; then the decoding tables, if any."""
    data = {}
    for kind, title in ATTENTION_KINDS.items():
        queries, keys = maps.queries_and_keys(kind)
        data[kind] = {
            "title": title,
            "queries": queries,
            "keys": keys,
            "weights": maps.weights[kind].round(decimals=4).tolist(),
        }
    tables = ""
    for title, steps in (step_tables or {}).items():
        head = "".join(f"<th>{html.escape(column)}</th>" for column in STEP_COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in steps_table(steps)
        )
        tables += f"<h2>{html.escape(title)}</h2>\n<table class=steps><tr>{head}</tr>{body}</table>\n"
    translation_kind = "target (teacher-forced)" if maps.teacher_forced else "translation (the model's)"
    values = {
        "SOURCE": html.escape(maps.source),
        "TRANSLATION_KIND": translation_kind,
        "TRANSLATION": html.escape(maps.translation),
        "OPTIONS": "".join(f'<option value="{kind}">{title}</option>' for kind, title in ATTENTION_KINDS.items()),
        # "<" written as \u003c: no token can end the script element or start a comment in it
        "DATA": json.dumps(data, ensure_ascii=False).replace("<", "\\u003c"),
        "TABLES": tables,
    }
    with open(PAGE_TEMPLATE, encoding="utf-8") as file:
        return re.sub(r"__([A-Z_]+)__", lambda match: values[match.group(1)], file.read())
