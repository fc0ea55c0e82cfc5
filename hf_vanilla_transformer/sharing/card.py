"""The Hub model card: `model_card.md` (a Jinja template) rendered with huggingface_hub's `ModelCard`.

The metadata (languages, license, tags, datasets, metrics and a `model-index` with the scores) is built as
`ModelCardData`, so huggingface_hub writes the YAML the Hub expects.
"""

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_vanilla_transformer.files import write_text_atomically
from hf_vanilla_transformer.formats import CARD_NAME, RUN_RECORD
from hf_vanilla_transformer.inspection.pictures import write_card_picture
from hf_vanilla_transformer.loading import load_model_and_tokenizer, read_json_object
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    max_new_tokens_over_source_of,
    paper_generation_config,
)
from hf_vanilla_transformer.sharing.markdown import code_literal, inline_code, markdown_text

# The template is the repository's top-level model_card.md; the package carries a link to it.
MODEL_CARD_TEMPLATE = Path(__file__).resolve().parent / "model_card.md"


def render_model_card(
    model,
    *,
    model_id: str,
    source_lang: str,
    target_lang: str,
    results: dict[str, dict],
    training: dict[str, str],
    dataset_id: str | None = None,
    dataset_name: str | None = None,
    example_source: str = "",
    example_translation: str = "",
    attention_picture: str | None = None,
    license: str = "apache-2.0",
) -> ModelCard:
    """A card for `model` with `results[split] = {"bleu", "chrf", "samples", "bleu_signature", "chrf_signature"}`.

    `model_id` is what the card's code loads: a path that loads the folder from where its users start (a run's
    `output_dir` as given), or a Hub id; a push renames it to the repository (`card_for`). Its base name titles
    the card. The template gets it, and the example and its translation, as `code_literal`s, and every other name
    or sentence as `markdown_text` (markdown.py), and calls `code` (`inline_code`) for its code spans.
    `example_source` is the sentence the card's code examples translate, and `example_translation` what the model
    gave for it (written in the pipeline example's output comment). `attention_picture`, a path relative to the
    card (so that it shows on the Hub too), is the picture of the example's encoder-decoder attention.
    """
    eval_results = [
        EvalResult(
            task_type="translation",
            task_name=f"Translation {source_lang}-{target_lang}",
            dataset_type=dataset_id or "custom",
            dataset_name=dataset_name or "custom",
            dataset_split=split,
            metric_type=metric,
            metric_name={"bleu": "sacreBLEU", "chrf": "chrF"}[metric],
            metric_value=round(scores[metric], 2),
            metric_config=scores.get(f"{metric}_signature"),
        )
        for split, scores in results.items()
        for metric in ("bleu", "chrf")
    ]
    card_data = ModelCardData(
        language=[source_lang, target_lang],
        license=license,
        library_name="transformers",
        tags=["translation", "vanilla-transformer", "attention-is-all-you-need"],
        datasets=[dataset_id] if dataset_id else None,
        metrics=["bleu", "chrf"],
        pipeline_tag="translation",
        model_name=model_id,
        eval_results=eval_results or None,
        widget=[{"text": example_source}] if example_source else None,  # the Hub's example input
    )
    config = model.config
    first = next(iter(results.values()), {})
    signatures = "; ".join(
        f"{name} {inline_code(first[f'{metric}_signature'])}"
        for metric, name in (("bleu", "BLEU"), ("chrf", "chrF"))
        if first.get(f"{metric}_signature")
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(MODEL_CARD_TEMPLATE),
        model_name=card_title(model_id),
        model_literal=code_literal(model_id),
        code=inline_code,
        source_language=markdown_text(source_lang),
        target_language=markdown_text(target_lang),
        dataset_name=dataset_name and markdown_text(dataset_name),
        architecture=[
            ("parameters", f"{model.num_parameters() / 1e6:.1f}M"),
            ("layers (encoder + decoder)", f"{config.encoder_layers} + {config.decoder_layers}"),
            ("d_model, d_ff, heads", f"{config.d_model}, {config.encoder_ffn_dim}, {config.encoder_attention_heads}"),
            ("shared vocabulary", f"{config.vocab_size} BPE tokens"),
            ("positions", config.position_embedding_type),
            ("layer norm", f"{config.layer_norm_position}-LN"),
            ("dropout", config.dropout),
        ],
        training=[(markdown_text(name), markdown_text(str(value))) for name, value in training.items()],
        num_beams=model.generation_config.num_beams,
        length_penalty=model.generation_config.length_penalty,
        max_new_tokens_over_source=max_new_tokens_over_source_of(model.generation_config),
        paper_decoding=paper_generation_config(model.config),
        results=[
            {
                "split": markdown_text(split),
                "samples": s.get("samples", ""),
                "bleu": f"{s['bleu']:.2f}",
                "chrf": f"{s['chrf']:.2f}",
            }
            for split, s in results.items()
        ],
        signatures=signatures,
        example_literal=code_literal(example_source),
        translation_literal=code_literal(example_translation or "..."),
        example_text=markdown_text(example_source),
        attention_picture=attention_picture,
    )


def card_title(model_id: str) -> str:
    """The title of the card of `model_id` (a path or a Hub id): its last part, as Markdown text."""
    return markdown_text(os.path.basename(model_id.rstrip("/")))


def write_export_card(
    model_path: str,
    folder: str,
    model_id: str,
    library_name: str,
    tags: list[str],
    usage: Callable[[str, str], str],
) -> None:
    """The card (README.md) of `folder`, an export of `model_path`: the source folder's card (its model, training
    and scores), with the export's `library_name` and tags, and its "How to use" section replaced by
    `usage(model_id, example_source)`, the example being the card's `widget` sentence. The pictures the card shows
    are copied with it."""
    card_path = os.path.join(model_path, CARD_NAME)
    card = (
        ModelCard.load(card_path)
        if os.path.isfile(card_path)
        else ModelCard(f"---\n{{}}\n---\n\n# {card_title(model_id)}\n")
    )
    card.data.library_name = library_name
    card.data.model_name = model_id  # the name the card's code loads; a push renames it (card_for)
    card.data.tags = [*(card.data.tags or []), *tags]
    widget = card.data.to_dict().get("widget") or [{}]
    section = usage(model_id, widget[0].get("text", "..."))
    card.text = replace_section(card.text, "How to use", section)
    card.save(os.path.join(folder, CARD_NAME))
    for picture in LOCAL_PICTURE.findall(card.text):
        if os.path.isfile(os.path.join(model_path, picture)):
            shutil.copy(os.path.join(model_path, picture), folder)


# ![description](name.png), in the card's folder; the description may hold escaped brackets (markdown_text)
LOCAL_PICTURE = re.compile(r"!\[(?:[^\]\\]|\\.)*\]\((?![a-z]+:)([^)/]+)\)")


def replace_section(text: str, title: str, section: str) -> str:
    """`text` (Markdown) with its `## title` section, up to the next `## ` heading, replaced by `section` (or with
    `section` appended where there is none)."""
    start = text.find(f"\n## {title}\n")
    if start < 0:
        return f"{text.rstrip()}\n\n{section.strip()}\n"
    end = text.find("\n## ", start + 1)
    rest = "" if end < 0 else text[end:]
    return f"{text[: start + 1]}{section.strip()}\n{rest}"


def write_model_card(folder: str, model=None, tokenizer=None) -> str:
    """Write the card (README.md) of a run's model folder from what the run recorded (`run_record.json`, written by
    training/run.py) and the model itself (loaded from the folder unless given), with the attention picture of the
    record's example sentence. Returns the card's path."""
    record = read_json_object(os.path.join(folder, RUN_RECORD))
    if model is None or tokenizer is None:
        model, tokenizer = load_model_and_tokenizer(folder, "cpu")
    example = record["example"]
    picture = write_card_picture(model, tokenizer, example["source"], folder)
    card = render_model_card(
        model,
        model_id=record["model_id"],
        source_lang=record["source_lang"],
        target_lang=record["target_lang"],
        results=record["scores"],
        training=record["training"],
        dataset_id=record["dataset_id"],
        dataset_name=record["dataset_name"],
        example_source=example["source"],
        example_translation=example["translation"],
        attention_picture=picture and os.path.basename(picture),
    )
    path = os.path.join(folder, CARD_NAME)
    write_text_atomically(path, str(card))
    return path
