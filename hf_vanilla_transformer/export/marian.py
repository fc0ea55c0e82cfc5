"""Export a trained model folder to transformers' own `MarianMTModel`: a folder that plain transformers loads, with
no code of ours and no `trust_remote_code` — for the Hub's widgets and inference services, organisations that
forbid remote code, and tools that know transformers' architectures (converters, serving stacks).

    vanilla-export-marian --model runs/multi30k-small --output_dir runs/multi30k-small-marian
    python -m hf_vanilla_transformer.cli.export_marian --model runs/multi30k-small --output_dir ...   # the same

Our default model is Marian's architecture exactly — post-LN layers, sinusoidal positions from 0, embeddings scaled
by √d_model, one vocabulary with tied embeddings — up to three differences of storage, which the export undoes:
- the order of the residual stream's features. Our sinusoids interleave sine and cosine (Section 3.5: sine on the
  even features, cosine on the odd ones); Marian's put all the sines first. So feature 2i of ours is Marian's
  feature i, and 2i+1 is d_model/2 + i: every matrix that reads the stream has its input columns permuted, every
  one that writes it its output rows, and the embeddings, layer norms and feed-forward output biases follow;
- our `kv_proj` holds W^K above W^V; Marian has `k_proj` and `v_proj`;
- ours has no biases in the attention projections (the paper's Equation 1) and no bias on the logits; Marian's are
  set to zero.
The logits agree within float rounding (the quick tests check 1e-5) and so do the translations, except where the
per-sentence length limit applies: Marian has no such rule, so the generation config's fixed `max_length` takes its
place (the card says so). What Marian cannot express is refused, naming the attribute: pre-LN, learned positions,
head sizes other than d_model / heads, another LayerNorm epsilon. The folder gets the tokenizer files, the
generation config and a model card, and is written to a temporary folder renamed when complete.
"""

import json
import os
from collections.abc import Callable

import torch
from transformers import GenerationConfig, MarianConfig, MarianMTModel

from hf_vanilla_transformer.files import atomic_output_dir, check_output_dir
from hf_vanilla_transformer.formats import CONFIG_NAME, GENERATION_CONFIG_NAME
from hf_vanilla_transformer.loading import load_ours
from hf_vanilla_transformer.model.modeling_vanilla_transformer import max_new_tokens_over_source_of
from hf_vanilla_transformer.sharing.card import write_export_card
from hf_vanilla_transformer.sharing.markdown import code_literal

MARIAN_LAYER_NORM_EPS = 1e-5  # Marian's nn.LayerNorm(d_model), PyTorch's default


def marian_feature_order(d_model: int) -> torch.LongTensor:
    """`ours[..., marian_feature_order(d)]` is the residual stream in Marian's order: sines (our even features)
    first, then cosines (our odd ones)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_config(config) -> MarianConfig:
    """The `MarianConfig` of the same model; refuses, in one line naming the attribute, what Marian cannot run."""
    check_marian_expressible(config)
    return MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim,
        activation_function=config.activation_function,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        init_std=config.init_std,
        scale_embedding=config.scale_embedding,
        share_encoder_decoder_embeddings=config.tie_word_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        forced_eos_token_id=None,  # Marian's default (0) would force token 0, our <s>, at max_length
        architectures=["MarianMTModel"],
    )


def check_marian_expressible(config) -> None:
    """Refuse, naming the attribute, a variant of ours that Marian's architecture cannot compute."""
    config_file = os.path.join(config.name_or_path, CONFIG_NAME)
    problems = [
        ("layer_norm_position", config.layer_norm_position != "post", "Marian's layers are post-LN"),
        (
            "position_embedding_type",
            config.position_embedding_type != "sinusoidal",
            "Marian's positions are sinusoidal, computed and never saved",
        ),
        (
            "layer_norm_eps",
            config.layer_norm_eps != MARIAN_LAYER_NORM_EPS,
            f"Marian's LayerNorms use {MARIAN_LAYER_NORM_EPS}",
        ),
    ]
    for stack in ("encoder", "decoder"):
        heads = getattr(config, f"{stack}_attention_heads")
        if config.attention_head_dims(heads) != (config.d_model // heads,) * 2 or config.d_model % heads:
            problems.append(
                (
                    f"{stack}_attention_heads",
                    True,
                    f"with head_dim={config.head_dim}, v_head_dim={config.v_head_dim}: Marian's heads are "
                    "d_model / heads wide",
                )
            )
    for name, failed, why in problems:
        if failed:
            raise ValueError(f"{config_file}: {name}={getattr(config, name)!r}, but {why}; cannot export to Marian")


def marian_model(model) -> MarianMTModel:
    """A `MarianMTModel` computing what `model` (ours) computes."""
    order = marian_feature_order(model.config.d_model)
    marian = MarianMTModel(marian_config(model.config)).eval()
    ours, theirs = model.model, marian.model
    with torch.no_grad():
        for our_stack, their_stack in ((ours.encoder, theirs.encoder), (ours.decoder, theirs.decoder)):
            their_stack.embed_tokens.weight.copy_(our_stack.embeddings.embed_tokens.weight[:, order])
            for our_layer, their_layer in zip(our_stack.layers, their_stack.layers, strict=True):
                copy_layer(our_layer, their_layer, order)
        marian.lm_head.weight.copy_(model.lm_head.weight[:, order])
        marian.final_logits_bias.zero_()
    return marian


def copy_layer(ours, theirs, order: torch.LongTensor) -> None:
    """One encoder or decoder layer. Names are the same but for the feed-forward network, which Marian keeps in the
    layer (`fc1`, `fc2`, `final_layer_norm`)."""
    for name in ("self_attn", "encoder_attn") if hasattr(ours, "encoder_attn") else ("self_attn",):
        copy_attention(getattr(ours, name), getattr(theirs, name), order)
        copy_layer_norm(getattr(ours, f"{name}_layer_norm"), getattr(theirs, f"{name}_layer_norm"), order)
    theirs.fc1.weight.copy_(ours.feed_forward.fc1.weight[:, order])  # reads the stream
    theirs.fc1.bias.copy_(ours.feed_forward.fc1.bias)
    theirs.fc2.weight.copy_(ours.feed_forward.fc2.weight[order])  # writes it
    theirs.fc2.bias.copy_(ours.feed_forward.fc2.bias[order])
    copy_layer_norm(ours.feed_forward_layer_norm, theirs.final_layer_norm, order)


def copy_attention(ours, theirs, order: torch.LongTensor) -> None:
    keys, values = ours.kv_proj.weight.split([ours.num_heads * ours.head_dim, ours.num_heads * ours.v_head_dim])
    for projection, weight in ((theirs.q_proj, ours.q_proj.weight), (theirs.k_proj, keys), (theirs.v_proj, values)):
        projection.weight.copy_(weight[:, order])
        projection.bias.zero_()
    theirs.out_proj.weight.copy_(ours.out_proj.weight[order])
    theirs.out_proj.bias.zero_()


def copy_layer_norm(ours, theirs, order: torch.LongTensor) -> None:
    theirs.weight.copy_(ours.weight[order])
    theirs.bias.copy_(ours.bias[order])


def marian_generation_config(generation_config: GenerationConfig) -> GenerationConfig:
    """Our decoding settings without the per-sentence length limit, which Marian's `generate()` does not know: its
    fixed `max_length` (the longest the positions allow) is the only limit left."""
    settings = generation_config.to_diff_dict()
    settings.pop("max_new_tokens_over_source", None)
    settings.pop("transformers_version", None)
    return GenerationConfig(**settings)


def export(model_path: str, output_dir: str, overwrite_output_dir: bool = False) -> str:
    """Write `model_path` (one of our model folders) as a `MarianMTModel` folder at `output_dir`."""
    check_output_dir(output_dir, overwrite_output_dir, reads=[model_path])
    model, tokenizer = load_ours(model_path)
    marian = marian_model(model)
    marian.generation_config = marian_generation_config(model.generation_config)
    with atomic_output_dir(output_dir, overwrite_output_dir) as staging:
        marian.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        write_card(model_path, staging, model_id=output_dir)
    return output_dir


def write_card(model_path: str, folder: str, model_id: str) -> None:
    """The source's card with this folder's "How to use", its decoding read from the generation configs written."""
    generation = read_json(os.path.join(folder, GENERATION_CONFIG_NAME))
    max_new_tokens_over_source = max_new_tokens_over_source_of(GenerationConfig.from_pretrained(model_path))
    write_export_card(
        model_path, folder, model_id, "transformers", ["marian"], usage(generation, max_new_tokens_over_source)
    )


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def usage(generation: dict, max_new_tokens_over_source: int | None) -> Callable[[str, str], str]:
    """The card's "How to use" for a Marian export decoding with `generation` (its generation config's settings),
    exported from a model whose sentences ended by their source length + `max_new_tokens_over_source` tokens
    (None: no such limit)."""

    def section(model_id: str, example: str) -> str:
        model_literal, example_literal = code_literal(model_id), code_literal(example)
        limit = (
            "\n\nThe source model also ends each sentence by its source length + "
            f"{max_new_tokens_over_source} tokens (Section 6.1). "
            "Marian has no such rule, so a translation that does not end by itself runs on to `max_length` here "
            "(pass `max_new_tokens` per sentence to keep the rule); on every other sentence the two translate alike."
            if max_new_tokens_over_source is not None
            else ""
        )
        return f"""## How to use

This folder is the model above as transformers' own `MarianMTModel` (`vanilla-export-marian`): it loads with plain
transformers, runs no code from the repository, and needs no `trust_remote_code`.

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained({model_literal})
model = AutoModelForSeq2SeqLM.from_pretrained({model_literal})  # a MarianMTModel
batch = tokenizer([{example_literal}], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

`generate()` decodes as `generation_config.json` says: beam size {generation.get("num_beams", 1)}, length penalty
{generation.get("length_penalty", 1.0)}, at most `max_length` = {generation["max_length"]} tokens.{limit}

transformers 5 removed its translation pipeline (`pipeline("translation")` raises); with hf-vanilla-transformer
installed, `hf_vanilla_transformer.TranslationPipeline(model=model, tokenizer=tokenizer)` is one.
"""

    return section
