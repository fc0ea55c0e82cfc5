"""The Hub model card: `model_card.md` (a Jinja template) rendered with huggingface_hub's `ModelCard`.

The metadata (languages, license, tags, datasets, metrics and a `model-index` with the scores) is built as
`ModelCardData`, so huggingface_hub writes the YAML the Hub expects.
"""

import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from huggingface_hub import CommitOperationAdd, EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.utils import filter_repo_objects

from .loading import one_line
from .modeling_vanilla_transformer import paper_generation_config, source_length_margin
from .training import paper_learning_rate

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
    the card.
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
    signatures = next(
        ({"bleu": s.get("bleu_signature"), "chrf": s.get("chrf_signature")} for s in results.values()), None
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(MODEL_CARD_TEMPLATE),
        model_name=os.path.basename(model_id.rstrip("/")),
        model_id=model_id,
        source_language=source_lang,
        target_language=target_lang,
        dataset_name=dataset_name,
        architecture=[
            ("parameters", f"{model.num_parameters() / 1e6:.1f}M"),
            ("layers (encoder + decoder)", f"{config.encoder_layers} + {config.decoder_layers}"),
            ("d_model, d_ff, heads", f"{config.d_model}, {config.encoder_ffn_dim}, {config.encoder_attention_heads}"),
            ("shared vocabulary", f"{config.vocab_size} BPE tokens"),
            ("positions", config.position_embedding_type),
            ("layer norm", f"{config.layer_norm_position}-LN"),
            ("dropout", config.dropout),
        ],
        training=list(training.items()),
        num_beams=model.generation_config.num_beams,
        length_penalty=model.generation_config.length_penalty,
        source_length_margin=source_length_margin(model.generation_config),
        paper_decoding=paper_generation_config(model.config),
        results=[
            {"split": split, "samples": s.get("samples", ""), "bleu": f"{s['bleu']:.2f}", "chrf": f"{s['chrf']:.2f}"}
            for split, s in results.items()
        ],
        signatures=signatures,
        example_source=example_source.replace('"', '\\"'),
        example_translation=example_translation.replace('"', '\\"'),
        attention_picture=attention_picture,
    )


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
    card_path = os.path.join(model_path, "README.md")
    card = ModelCard.load(card_path) if os.path.isfile(card_path) else ModelCard(f"---\n{{}}\n---\n\n# {model_id}\n")
    card.data.library_name = library_name
    card.data.model_name = model_id  # the name the card's code loads; a push renames it (card_for)
    card.data.tags = [*(card.data.tags or []), *tags]
    widget = card.data.to_dict().get("widget") or [{}]
    section = usage(model_id, widget[0].get("text", "..."))
    card.text = replace_section(card.text, "How to use", section)
    card.save(os.path.join(folder, "README.md"))
    for picture in LOCAL_PICTURE.findall(card.text):
        if os.path.isfile(os.path.join(model_path, picture)):
            shutil.copy(os.path.join(model_path, picture), folder)


LOCAL_PICTURE = re.compile(r"!\[[^\]]*\]\((?![a-z]+:)([^)/]+)\)")  # ![...](name.png), in the card's folder


def replace_section(text: str, title: str, section: str) -> str:
    """`text` (Markdown) with its `## title` section, up to the next `## ` heading, replaced by `section` (or with
    `section` appended where there is none)."""
    start = text.find(f"\n## {title}\n")
    if start < 0:
        return f"{text.rstrip()}\n\n{section.strip()}\n"
    end = text.find("\n## ", start + 1)
    rest = "" if end < 0 else text[end:]
    return f"{text[: start + 1]}{section.strip()}\n{rest}"


def training_table(
    args, d_model: int, steps: int, training_pairs: int | None, training_seconds: float | None, data: str
) -> dict[str, str]:
    """The card's "Training" list, from the run's `TranslationTrainingArguments`."""
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    scale = args.learning_rate_scale
    from_equation_3 = (
        args.warmup_steps >= 1
        and float(args.warmup_steps).is_integer()
        and math.isclose(args.learning_rate, paper_learning_rate(d_model, args.warmup_steps, scale))
    )
    equation = f" (Equation 3 × {scale:g})" if from_equation_3 else ""
    max_tokens = args.max_tokens_per_batch
    averaged = args.average_last_checkpoints
    return {
        "data": data,
        "training pairs": "—" if training_pairs is None else training_pairs,
        "optimizer": f"Adam (β1={args.adam_beta1}, β2={args.adam_beta2}, ε={args.adam_epsilon})",
        "learning rate": f"{schedule}, peak {args.learning_rate:.3g}{equation}, {args.warmup_steps:g} warmup steps",
        "batches": f"about {max_tokens} tokens" if max_tokens else f"{args.per_device_train_batch_size} sentence pairs",
        "gradient accumulation": args.gradient_accumulation_steps,
        "label smoothing": args.label_smoothing_factor,
        "checkpoint averaging": f"last {averaged}" if averaged > 1 else "none",
        "steps": steps,
        "training time": "—" if training_seconds is None else f"{training_seconds / 60:.1f} minutes",
        "hardware": describe_hardware(),
    }


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ("CPU" where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return "CPU"


def describe_hardware() -> str:
    """The accelerators or the CPU that trained the model, for the card."""
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


# What run_translation.py's output folder holds that is not part of the model: the Trainer's own state.
NOT_UPLOADED = ["checkpoint-*", "checkpoint-*/**", "runs/**", "training_args.bin", "*.partial"]


def check_hub_login(token: str | None = None) -> str:
    """The Hub user that `token` (or the saved login) is, or a one-line ValueError: before a run trains for hours
    and then fails to upload, or before a push starts."""
    try:
        return HfApi(token=token).whoami()["name"]
    # whoami makes one request and nothing else: whatever fails (no token and offline mode are OSErrors, a refused
    # token or an unreachable Hub come from huggingface_hub's HTTP library, httpx or httpx2 by version) means no push
    except Exception as error:
        raise ValueError(
            f"cannot push to the Hugging Face Hub ({one_line(error)}); log in with `hf auth login` or give a token, "
            "or push the finished folder later with vanilla-push-to-hub"
        ) from None


def push_model_folder(
    folder: str, repo_id: str, token: str | None = None, private: bool | None = None, commit_message: str = ""
) -> str:
    """Upload a finished model folder (ours, or an export of it: weights, config, code, tokenizer, card, results)
    as one commit. The card's code names the model by the card's `model_name` (a local path until now): in the
    upload it names `repo_id`."""
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    root = Path(folder)
    paths = sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file())
    operations = [
        CommitOperationAdd(path_in_repo=path, path_or_fileobj=card_for(root / path, repo_id) or str(root / path))
        for path in filter_repo_objects(paths, ignore_patterns=NOT_UPLOADED)
    ]
    commit = api.create_commit(
        repo_id, operations, commit_message=commit_message or "Upload model trained with hf-vanilla-transformer"
    )
    return commit.commit_url


def card_for(path: Path, repo_id: str) -> bytes | None:
    """The model card at `path` as it reads in repository `repo_id`; None for any other file."""
    if path.name != "README.md":
        return None
    card = ModelCard.load(path)
    old_id = card.data.model_name
    if old_id and old_id != repo_id:
        card.text = card.text.replace(f'"{old_id}"', f'"{repo_id}"').replace(f"--model {old_id}", f"--model {repo_id}")
        card.data.model_name = repo_id  # also the model-index's name
    return str(card).encode("utf-8")
