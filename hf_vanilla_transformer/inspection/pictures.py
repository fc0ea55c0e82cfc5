"""Attention pictures and step-by-step decoding of a trained model, as PNG files and one self-contained HTML page.

    vanilla-attention --model runs/multi30k-small --source "A man is sleeping." --output_dir attention
    vanilla-attention --model runs/multi30k-small --source "A man is sleeping." \\
        --target "Ein Mann schläft." --steps --output_dir attention

For the model's own translation of --source (or --target, read with teacher forcing) it draws the encoder
self-attention, the decoder's masked self-attention and the encoder-decoder attention of every layer and head, and
their mean over heads, as `KIND_layerL_headH.png` / `KIND_layerL_mean.png` (layers and heads counted from 1;
--layer and --head draw one only), each with its axes titled and a colour bar, and writes `attention.html`, which
opens on the last layer's encoder-decoder attention (mean over heads) and lets a reader pick the kind, layer and
head; the page needs no network. --steps adds the decoding step by step (greedy and beam search, the beams as a
tree on the page; with --target, the probability the model gives each reference token), printed and on the page.
Drawing needs matplotlib (the [pictures] extra, or `pip install matplotlib`); Chinese and Japanese tokens need a
CJK font (Debian: `apt-get install fonts-wqy-microhei`).
"""

import functools
import html
import json
import logging
import math
import os
import re
import warnings
from collections.abc import Sequence

import numpy as np

from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.files import replace_atomically
from hf_vanilla_transformer.inspection.capture import (
    ATTENTION_KINDS,
    AttentionMaps,
    DecodingStep,
    PartialTranslation,
    attention_maps,
    winning_path,
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


# what the rows and the columns of each kind's map are, in the PNGs and on the page
AXIS_TITLES = {
    "encoder_self_attention": ("query ↓ (source token)", "key → (source token)"),
    "decoder_self_attention": (
        "query ↓ (decoder input → predicted token)",
        "key → (decoder input: <s>, then the target)",
    ),
    "encoder_decoder_attention": ("target ↓ (the token being predicted)", "source →"),
}
COLOR_LEGEND = "attention weight (each row sums to 1)"


def axis_labels(maps: AttentionMaps, kind: str) -> tuple[list[str], list[str]]:
    """The tokens of `kind`'s rows and columns. The decoder's self-attention rows read `input → predicted`: row i
    starts with column i's token, the position's own input, and the arrow says what that position predicts."""
    queries, keys = maps.queries_and_keys(kind)
    if kind == "decoder_self_attention":
        queries = [f"{given} → {predicted}" for given, predicted in zip(keys, queries, strict=True)]
    return queries, keys


# A picture's size, and the work to draw it, are bounded whatever the sentence: each token gets TOKEN_INCHES of its
# axis up to LABELLED_TOKENS tokens; past that the tokens share LABELLED_TOKENS * TOKEN_INCHES, every one still
# drawn, and one in k is labelled, with its position, as the axis title says; no figure is more than
# MAX_FIGURE_INCHES a side at DPI.
DPI = 100
TOKEN_INCHES = 0.32
LABELLED_TOKENS = 50
MAX_FIGURE_INCHES = 24


def labelled_ticks(labels: list[str], axis_title: str) -> tuple[list[int], list[str], str]:
    """The positions to label on an axis of `labels`, their labels and the axis title: every token's up to
    LABELLED_TOKENS, else one in k, numbered from 1, with the title saying so."""
    every = math.ceil(len(labels) / LABELLED_TOKENS)
    if every <= 1:
        return list(range(len(labels))), labels, axis_title
    positions = list(range(0, len(labels), every))
    shown = [f"{position + 1}: {labels[position]}" for position in positions]
    return positions, shown, f"{axis_title} ({len(labels):,} tokens, one in {every} labelled, with its position)"


def attention_figure(
    weights, row_labels: list[str], column_labels: list[str], title: str, axis_titles: tuple[str, str]
):
    """A heat map of `weights` (queries x keys, each row summing to 1): rows are the queries, columns the keys,
    labelled with their tokens (past LABELLED_TOKENS, one in k, as the axis title says), the axes titled with
    `axis_titles` (rows, columns); 0 is dark purple and 1 yellow, as the colour bar shows. At most
    MAX_FIGURE_INCHES a side at DPI, whatever the tokens."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    weights = np.asarray(weights, dtype=np.float32)
    rows, columns = len(row_labels), len(column_labels)
    if weights.shape != (rows, columns):
        raise ValueError(f"weights of shape {tuple(weights.shape)} for {rows} row and {columns} column labels")
    row_ticks, row_tick_labels, row_title = labelled_ticks(row_labels, axis_titles[0])
    column_ticks, column_tick_labels, column_title = labelled_ticks(column_labels, axis_titles[1])
    # tokens are text, never TeX: "$5" must not start a formula
    with rc_context({"font.family": font_families(row_labels + column_labels), "text.parse_math": False}):
        # wide and tall enough for the row labels, the colour bar and the titles too
        labels_width = 0.07 * max(map(len, row_tick_labels), default=0)
        width = max(
            2.6 + labels_width + TOKEN_INCHES * min(columns, LABELLED_TOKENS),
            1.0 + 0.07 * max(len(title), len(column_title)),
        )
        height = max(1.9 + TOKEN_INCHES * min(rows, LABELLED_TOKENS), 1.0 + 0.07 * len(row_title))
        size = (min(width, MAX_FIGURE_INCHES), min(height, MAX_FIGURE_INCHES))
        figure = Figure(figsize=size, dpi=DPI, layout="constrained")
        axes = figure.add_subplot()
        # square cells while every token has its TOKEN_INCHES; past that, each axis shares its length out.
        # "antialiased": exact cells where they are 3 pixels or more, smoothed (not dropped) where less
        full_size = max(rows, columns) <= LABELLED_TOKENS
        image = axes.imshow(
            weights,
            cmap=COLOR_MAP,
            vmin=0.0,
            vmax=1.0,
            interpolation="antialiased",
            # smoothing the weights, then colouring: smoothing the colours holds four channels at the picture's
            # size, several times over (matplotlib's choice for a picture under 3 pixels a cell)
            interpolation_stage="data",
            aspect="equal" if full_size else "auto",
        )
        axes.set_xticks(column_ticks, column_tick_labels, rotation=90)
        axes.set_yticks(row_ticks, row_tick_labels)
        axes.set_title(title, fontsize=9)
        axes.set_ylabel(row_title, fontsize=9)
        axes.set_xlabel(column_title, fontsize=9)
        figure.colorbar(image, ax=axes, shrink=0.8).set_label(COLOR_LEGEND, fontsize=8)
    return figure


def kind_figure(maps: AttentionMaps, kind: str, weights, which: str):
    """`weights` (one layer's head or mean) of attention `kind`, labelled with its tokens; `which` says the layer
    and head in the title."""
    rows, columns = axis_labels(maps, kind)
    return attention_figure(weights, rows, columns, kind_title(kind, which), AXIS_TITLES[kind])


def kind_title(kind: str, which: str) -> str:
    return f"{ATTENTION_KINDS[kind]}, {which}"


# matplotlib's warning for each character its fonts cannot draw
MISSING_GLYPH = re.compile(r"Glyph (\d+) \(.*\) missing from font\(s\) .*")


def warning_lines(messages: list[str]) -> list[str]:
    """Warnings as a reader wants them: each once, and matplotlib's one per character no font has as one line."""
    lines, missing = [], []
    for message in dict.fromkeys(messages):
        glyph = MISSING_GLYPH.fullmatch(message)
        if glyph:
            missing.append(chr(int(glyph.group(1))))
        else:
            lines.append(message)
    if missing:
        lines.append(f"no installed font has {' '.join(missing)}: drawn as boxes")
    return lines


def save_figure(figure, path: str) -> str:
    """Write `figure` as a PNG at `path`, all or nothing: a reader never sees half a picture."""
    replace_atomically(path, lambda temporary: figure.savefig(temporary, format="png"))
    return path


CARD_PICTURE = "attention.png"


def write_card_picture(model, tokenizer, source: str, output_dir: str) -> str | None:
    """The encoder-decoder attention (last layer, mean over heads) of the model's translation of `source`, as
    `attention.png` in `output_dir`: the picture the model card shows. None, and a log line, without matplotlib."""
    try:
        require("matplotlib", "the card's attention picture")
    except ImportError as error:
        logger.warning("%s; the card goes without one", error)
        return None
    with warnings.catch_warnings():  # the switch to eager attention is expected here
        warnings.filterwarnings("ignore", message="attention weights need the eager attention path")
        try:
            maps = attention_maps(model.eval(), tokenizer, source)
        except ValueError as error:  # a picture is not worth failing a finished training run for
            logger.warning("no attention picture for the card: %s", error)
            return None
    return save_figure(cross_attention_figure(maps), os.path.join(output_dir, CARD_PICTURE))


# what the picture of where the decoder looked shows (the card's, the demo's)
WHERE_THE_DECODER_LOOKED = "last layer, mean over heads"


def cross_attention_figure(maps: AttentionMaps):
    """The picture of where the decoder looked: the encoder-decoder attention of the last layer, mean over heads."""
    weights = maps.weights["encoder_decoder_attention"][-1].mean(0)
    return kind_figure(maps, "encoder_decoder_attention", weights, WHERE_THE_DECODER_LOOKED)


def decoded_attention_figure(steps: list[DecodingStep], source_tokens: list[str]):
    """`cross_attention_figure` of the translation `decoding_steps` found, from the rows its steps recorded
    (`winning_path`), without a second pass over the model; `source_tokens`: `source_labels`'."""
    path = winning_path(steps)
    weights = np.stack([hypothesis.attention.numpy() for hypothesis in path])
    kind = "encoder_decoder_attention"
    title = kind_title(kind, WHERE_THE_DECODER_LOOKED)
    return attention_figure(weights, list(path[-1].tokens), source_tokens, title, AXIS_TITLES[kind])


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
    `head`, counted from 1), in `output_dir`, made if missing. Returns their paths."""
    check_selection(maps, layer, head)
    os.makedirs(output_dir, exist_ok=True)
    paths = []
    for kind in ATTENTION_KINDS:
        weights = maps.weights[kind]
        for layer_index in [layer - 1] if layer else range(weights.shape[0]):
            per_layer = weights[layer_index]
            heads = [head - 1] if head else range(per_layer.shape[0])
            pictures = [(f"head{h + 1}", f"head {h + 1}", per_layer[h]) for h in heads]
            if head is None:
                pictures.append(("mean", "mean over heads", per_layer.mean(0)))
            for name, caption, picture in pictures:
                figure = kind_figure(maps, kind, picture, f"layer {layer_index + 1}, {caption}")
                paths.append(save_figure(figure, os.path.join(output_dir, f"{kind}_layer{layer_index + 1}_{name}.png")))
    return paths


def quoted(text: str) -> str:
    """`text` in double quotes, so that a leading space, a comma or a lone space shows."""
    return json.dumps(text, ensure_ascii=False)


# what became of a hypothesis after its step (nothing said: it was extended)
WINNER, FINISHED, DROPPED, STOPPED = "★ returned", "✓ finished", "✗ dropped", "search ended"
OUTCOMES_LEGEND = (
    f"{WINNER}: the translation generate() returned (the best finished score after the length penalty); "
    f"{FINISHED}: ended with </s>; {DROPPED}: not among the best beams of the next step; "
    f"{STOPPED}: still running when the search stopped"
)


TREE_LEGEND = (
    "Each line is a hypothesis that beam search kept after a step, under the one it extends (a level per step, the "
    "best first): its last token, that token's probability p, the log-probability of the whole hypothesis and the "
    "source token the encoder-decoder attention weighed most; hover for the top alternatives. The path to the "
    "translation is highlighted."
)


def outcomes(steps: list[DecodingStep]) -> list[list[str]]:
    """For each step, what became of each of its hypotheses: one of WINNER, FINISHED, DROPPED, STOPPED, or ""
    when a hypothesis of the next step extends it."""
    result = []
    for index, step in enumerate(steps):
        later = steps[index + 1].hypotheses if index + 1 < len(steps) else []
        extended = {hypothesis.parent for hypothesis in later}
        search_went_on = any(not hypothesis.finished for hypothesis in later)
        result.append(
            [
                WINNER
                if hypothesis.winner
                else FINISHED
                if hypothesis.finished
                else ""
                if number in extended
                else DROPPED
                if search_went_on
                else STOPPED
                for number, hypothesis in enumerate(step.hypotheses)
            ]
        )
    return result


# The tables and the tree show a hypothesis so far whole up to SO_FAR_CHARACTERS characters, else its end after
# "…": what a decoding's steps show then grows with their number, not with its square
SO_FAR_CHARACTERS = 60


def so_far_text(tokens: Sequence[str]) -> str:
    """The text of `tokens`, quoted: whole up to SO_FAR_CHARACTERS characters, else `…` and its last ones. Reads the
    tokens from the last, as far as it shows."""
    tail, length = [], 0
    for token in reversed(tokens):
        tail.append(token)
        length += len(token)
        if length > SO_FAR_CHARACTERS:
            return "…" + quoted("".join(reversed(tail))[-SO_FAR_CHARACTERS:])
    return quoted("".join(reversed(tail)))


def alternatives_text(hypothesis: PartialTranslation) -> str:
    return ", ".join(f"{quoted(token)} {probability:.2f}" for token, probability in hypothesis.alternatives)


def steps_table(steps: list[DecodingStep]) -> list[list[str]]:
    """Rows of a table of the decoding, one per hypothesis (STEP_COLUMNS): step, its number among the step's
    hypotheses (best first) and that of the one it extends in the step before, the hypothesis so far
    (`so_far_text`), the token added, its probability, the log-probability of the hypothesis, the top alternatives,
    where the encoder-decoder attention looked and what became of it. Tokens are quoted."""
    rows = []
    for step, step_outcomes in zip(steps, outcomes(steps), strict=True):
        for number, (hypothesis, outcome) in enumerate(zip(step.hypotheses, step_outcomes, strict=True), start=1):
            rows.append(
                [
                    str(step.step),
                    str(number),
                    "" if hypothesis.parent is None else str(hypothesis.parent + 1),
                    so_far_text(hypothesis.tokens),
                    quoted(hypothesis.token),
                    f"{hypothesis.probability:.3f}",
                    f"{hypothesis.log_probability:.2f}",
                    alternatives_text(hypothesis),
                    quoted(hypothesis.looked_at),
                    outcome,
                ]
            )
    return rows


STEP_COLUMNS = [
    "step",
    "beam",
    "from",
    "so far",
    "token",
    "p",
    "log p (all)",
    "top alternatives",
    "attention on",
    "outcome",
]


def format_steps(title: str, steps: list[DecodingStep]) -> str:
    """The table as plain text, for a terminal."""
    rows = [STEP_COLUMNS, *steps_table(steps)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(STEP_COLUMNS))]
    lines = [title] + ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def steps_html(title: str, steps: list[DecodingStep]) -> str:
    """A decoding on the page: a beam search as a tree, a single hypothesis per step (greedy decoding, teacher
    forcing) as a table."""
    if any(len(step.hypotheses) > 1 for step in steps):
        body = f"<p class=legend>{html.escape(TREE_LEGEND)}<br>{html.escape(OUTCOMES_LEGEND)}</p>\n{beam_tree(steps)}"
    else:
        head = "".join(f"<th>{html.escape(column)}</th>" for column in STEP_COLUMNS)
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in steps_table(steps)
        )
        body = f"<table class=steps><tr>{head}</tr>{rows}</table>"
    return f"<h2>{html.escape(title)}</h2>\n{body}\n"


def beam_tree(steps: list[DecodingStep]) -> str:
    """Nested lists: each hypothesis under the one it extends, `<s>` at the root, the best first at each step;
    each item says its token, probabilities and outcome, and its `data-id` and `data-parent` (step.number) link it.
    The winner and the hypotheses it grew from are marked as its path."""
    marks = outcomes(steps)
    children: dict[tuple[int, int] | None, list[tuple[int, int]]] = {}
    on_path = set()
    for index, step in enumerate(steps):
        for number, hypothesis in enumerate(step.hypotheses):
            parent = None if hypothesis.parent is None else (index - 1, hypothesis.parent)
            children.setdefault(parent, []).append((index, number))
            if hypothesis.winner:
                on_path.add((index, number))
    for index in range(len(steps) - 1, 0, -1):  # the winner's ancestors, back to step 1
        on_path |= {(index - 1, steps[index].hypotheses[number].parent) for i, number in on_path if i == index}

    def item(key: tuple[int, int]) -> str:
        index, number = key
        hypothesis, outcome = steps[index].hypotheses[number], marks[index][number]
        parent = "" if hypothesis.parent is None else f"{index}.{hypothesis.parent + 1}"
        classes = " ".join(name for name, on in (("path", key in on_path), ("leaf", key not in children)) if on)
        ending = f" <b class=outcome>{html.escape(outcome)}</b> {html.escape(so_far_text(hypothesis.tokens))}"
        return (
            f'<li data-id="{index + 1}.{number + 1}" data-parent="{parent}" class="{classes}" '
            f'title="top alternatives: {html.escape(alternatives_text(hypothesis))}">'
            f"<span class=token>{html.escape(quoted(hypothesis.token))}</span> "
            f"<span class=stats>p {hypothesis.probability:.3f} · log p {hypothesis.log_probability:.2f} · "
            f"looked at {html.escape(quoted(hypothesis.looked_at))}</span>"
            f"{ending if outcome else ''}{branches(key)}</li>"
        )

    def branches(parent: tuple[int, int] | None) -> str:
        return f"<ul>{''.join(map(item, children[parent]))}</ul>" if parent in children else ""

    return f'<div class=tree><span class=token>"&lt;s&gt;"</span>{branches(None)}</div>'


def color_stops() -> list[str]:
    """The PNGs' colour map as the 256 colours matplotlib draws weights 0 to 1 with, for the page to use the same."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    colormap = colormaps[COLOR_MAP]
    return [to_hex(colormap(index)) for index in range(colormap.N)]


KIND_EXPLANATIONS = {
    "encoder_self_attention": "Each source token (a row) is rebuilt from the source tokens (the columns), in the "
    "shares shown.",
    "decoder_self_attention": "Row i is the decoder at position i: its input is column i's token (<s>, then the "
    "target shifted right), and it predicts the token after the arrow. The mask lets it look at its own and "
    "earlier positions only: nothing right of the diagonal.",
    "encoder_decoder_attention": "Each row is the decoder predicting one target token, looking at the source "
    "tokens (the columns): a word and its translation light up together.",
}


def page_data(maps: AttentionMaps) -> dict:
    """What the page's script draws: every kind's weights with its labels and titles, the colour map, and the view
    it opens on: the last layer's encoder-decoder attention, mean over heads, the one that shows the translation."""
    kinds = {}
    for kind, title in ATTENTION_KINDS.items():
        rows, columns = axis_labels(maps, kind)
        kinds[kind] = {
            "title": title,
            "explanation": KIND_EXPLANATIONS[kind],
            "rows": rows,
            "columns": columns,
            "row_title": AXIS_TITLES[kind][0],
            "column_title": AXIS_TITLES[kind][1],
            "weights": maps.weights[kind].round(decimals=4).tolist(),
        }
    last_layer = maps.weights["encoder_decoder_attention"].shape[0] - 1
    return {
        "kinds": kinds,
        "colors": color_stops(),
        "legend": COLOR_LEGEND,
        "view": {"kind": "encoder_decoder_attention", "layer": last_layer, "head": "mean"},
    }


def attention_page(maps: AttentionMaps, step_tables: dict[str, list[DecodingStep]] | None = None) -> str:
    """One HTML page, scripts and data inline (no network): pick the kind, layer and head (or the mean) of the
    attention to show as a heat map of the tokens, in the PNGs' colours; then the decodings, if any (needs
    matplotlib for its colour map)."""
    translation_kind = "target (teacher-forced)" if maps.teacher_forced else "translation (the model's)"
    values = {
        "SOURCE": html.escape(maps.source),
        "TRANSLATION_KIND": translation_kind,
        "TRANSLATION": html.escape(maps.translation),
        "OPTIONS": "".join(f'<option value="{kind}">{title}</option>' for kind, title in ATTENTION_KINDS.items()),
        # "<" written as \u003c: no token can end the script element or start a comment in it
        "DATA": json.dumps(page_data(maps), ensure_ascii=False).replace("<", "\\u003c"),
        "TABLES": "".join(steps_html(title, steps) for title, steps in (step_tables or {}).items()),
    }
    with open(PAGE_TEMPLATE, encoding="utf-8") as file:
        return re.sub(r"__([A-Z_]+)__", lambda match: values[match.group(1)], file.read())
