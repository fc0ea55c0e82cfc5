"""Export a trained model folder to CTranslate2, OpenNMT's inference engine, for fast CPU translation.

    vanilla-export-ctranslate2 --model runs/multi30k-small \\
        --output_dir runs/multi30k-small-ct2 --quantization int8
    vanilla-translate --model runs/multi30k-small-ct2 --input sentences.en --output sentences.de

CTranslate2's own transformers converter does the work (`TransformersConverter`); what it needs from us is a loader
that maps our weights onto its Transformer specification (`VanillaTransformerLoader`, registered for our config):
- post-LN (`pre_norm=False`) or pre-LN stacks with their final LayerNorm;
- no biases in the attention projections; our `kv_proj` already holds W^K above W^V, CTranslate2's fused K/V layout;
- the √d_model embedding scale;
- our interleaved sinusoid table given explicitly (CTranslate2's built-in one puts all sines first and starts at
  position 1), or the learned table;
- one vocabulary for source and target, and one embedding matrix tied three ways (stored once);
- the decoder starts from `<s>` and ends at `</s>`.
The folder also gets the tokenizer files, the generation config (the model's decoding, which `vanilla-translate`
applies; for ours by default the paper's: beam 4, length penalty 0.6, source length + 50 tokens) and a model card
with this folder's "How to use". It is written to a temporary folder and renamed when complete. Needs the [fast]
extra: `pip install -e ".[fast]"` (without it the command says so in one line, before any work).
"""

import os
import shlex
import shutil
from collections.abc import Callable

from transformers import GenerationConfig

from hf_vanilla_transformer.decoding.alignment import DEFAULT_LAYER
from hf_vanilla_transformer.engines.ctranslate2 import QUANTIZATIONS
from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.files import atomic_output_dir, check_output_dir
from hf_vanilla_transformer.formats import GENERATION_CONFIG_NAME, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from hf_vanilla_transformer.loading import load_ours, max_positions
from hf_vanilla_transformer.model.modeling_vanilla_transformer import max_new_tokens_over_source_of
from hf_vanilla_transformer.sharing.card import write_export_card
from hf_vanilla_transformer.sharing.markdown import code_literal, fenced_block

# what our folder carries besides the weights that the export keeps (the weights become model.bin)
CARRIED_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, GENERATION_CONFIG_NAME)


def export(model_path: str, output_dir: str, quantization: str = "float32", overwrite_output_dir: bool = False) -> str:
    """Write `model_path` (one of our model folders) as a CTranslate2 model folder at `output_dir`."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    converter_class = _converter_class()
    check_output_dir(output_dir, overwrite_output_dir, reads=[model_path])
    model, tokenizer = load_ours(model_path)
    converter = converter_class(model_path, model, tokenizer)
    with atomic_output_dir(output_dir, overwrite_output_dir) as staging:
        converter.convert(staging, quantization=quantization, force=True)
        for name in CARRIED_FILES:
            if os.path.isfile(os.path.join(model_path, name)):
                shutil.copy(os.path.join(model_path, name), staging)
        write_card(model_path, staging, quantization, model_id=output_dir)
    return output_dir


def write_card(model_path: str, folder: str, quantization: str, model_id: str) -> None:
    """The source's card with this folder's "How to use", its decoding read from the generation config copied."""
    generation = GenerationConfig.from_pretrained(folder)
    write_export_card(model_path, folder, model_id, "ctranslate2", ["ctranslate2"], usage(generation, quantization))


def usage(generation, quantization: str) -> Callable[[str, str], str]:
    """The card's "How to use" for a CTranslate2 export in `quantization` decoding as `generation` (its
    `GenerationConfig`) says."""
    beams = generation.num_beams or 1
    penalty = 1.0 if generation.length_penalty is None else generation.length_penalty
    max_new_tokens_over_source = max_new_tokens_over_source_of(generation)
    positions = max_positions(generation)
    limit = (
        f"the source length + {max_new_tokens_over_source} tokens"
        if max_new_tokens_over_source is not None
        else f"{positions} tokens"
    )
    # as CTranslate2Translator decodes: the decoder's start token takes a position, and CTranslate2 counts no `</s>`,
    # which generate() forces as Section 6.1's limit's last token
    decoding_length = (
        f"min(len(source) + {max_new_tokens_over_source - 1}, {positions - 2})"
        if max_new_tokens_over_source is not None
        else str(positions - 1)
    )

    def section(model_id: str, example: str) -> str:
        model_literal, example_literal = code_literal(model_id), code_literal(example)
        # the path as one shell word, which may hold line breaks and backticks: the block's fence is longer
        command = f"vanilla-translate --model {shlex.quote(model_id)} --input sentences.txt --output translations.txt"
        return f"""## How to use

This folder is the model above converted for [CTranslate2](https://github.com/OpenNMT/CTranslate2), with weights
in {quantization} (`vanilla-export-ctranslate2 --quantization {quantization}`); transformers cannot load it. With
hf-vanilla-transformer installed (its `[fast]` extra), translate a file, one sentence a line:

{fenced_block("bash", command)}

or call CTranslate2 on the tokens of the tokenizer stored here:

```python
import ctranslate2
from transformers import PreTrainedTokenizerFast

tokenizer = PreTrainedTokenizerFast.from_pretrained({model_literal})
translator = ctranslate2.Translator({model_literal})
source = tokenizer.convert_ids_to_tokens(tokenizer({example_literal})["input_ids"])
result = translator.translate_batch(
    [source], beam_size={beams}, length_penalty={penalty}, max_decoding_length={decoding_length}
)
print(tokenizer.decode(tokenizer.convert_tokens_to_ids(result[0].hypotheses[0]), skip_special_tokens=True))
```

Both decode as `generation_config.json` says: beam size {beams}, length penalty {penalty}, at most {limit}.
"""

    return section


def _converter_class():
    """CTranslate2's transformers converter, loading the folder through our checks, with our loader registered."""
    require("ctranslate2", "exporting to CTranslate2")
    import torch
    from ctranslate2.converters import TransformersConverter
    from ctranslate2.converters.transformers import ModelLoader, register_loader
    from ctranslate2.specs import common_spec, transformer_spec

    from hf_vanilla_transformer.model.modeling_vanilla_transformer import VanillaTransformerSinusoidalPositionalEncoding

    activations = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "gelu_new": common_spec.Activation.GELUTanh,
        "gelu_pytorch_tanh": common_spec.Activation.GELUTanh,
        "silu": common_spec.Activation.SWISH,
        "swish": common_spec.Activation.SWISH,
    }

    @register_loader("VanillaTransformerConfig")
    class VanillaTransformerLoader(ModelLoader):
        """Our model onto CTranslate2's `TransformerSpec`, module by module."""

        @property
        def architecture_name(self):
            return "AutoModelForSeq2SeqLM"  # a name in transformers' namespace that loads our registered class

        def get_model_spec(self, model):
            config = model.config
            check_ctranslate2_expressible(config, activations)
            spec = transformer_spec.TransformerSpec.from_config(
                (config.encoder_layers, config.decoder_layers),
                config.encoder_attention_heads,
                pre_norm=config.layer_norm_position == "pre",
                activation=activations[config.activation_function],
                # the attention vanilla-translate --alignments reads, as decoding/alignment.py's defaults: the last
                # layer's, averaged over all its heads
                alignment_layer=DEFAULT_LAYER,
                alignment_heads=config.decoder_attention_heads,
            )
            self.set_stack(spec.encoder, model.model.encoder)
            self.set_stack(spec.decoder, model.model.decoder)
            self.set_linear(spec.decoder.projection, model.lm_head)
            return spec

        def set_stack(self, spec, stack):
            embeddings = stack.embeddings
            spec.scale_embeddings = embeddings.embed_scale
            positions = embeddings.embed_positions
            sinusoidal = isinstance(positions, VanillaTransformerSinusoidalPositionalEncoding)
            spec.position_encodings.encodings = positions.encoding if sinusoidal else positions.weight
            token_spec = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
            self.set_embeddings(token_spec, embeddings.embed_tokens)
            if stack.layer_norm is not None:
                self.set_layer_norm(spec.layer_norm, stack.layer_norm)
            for layer_spec, layer in zip(spec.layer, stack.layers, strict=True):
                self.set_attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
                self.set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
                if hasattr(layer, "encoder_attn"):
                    self.set_attention(layer_spec.attention, layer.encoder_attn, self_attention=False)
                    self.set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
                self.set_linear(layer_spec.ffn.linear_0, layer.feed_forward.fc1)
                self.set_linear(layer_spec.ffn.linear_1, layer.feed_forward.fc2)
                self.set_layer_norm(layer_spec.ffn.layer_norm, layer.feed_forward_layer_norm)

        def set_attention(self, spec, attention, self_attention: bool):
            # CTranslate2 fuses Q, K, V into one matrix for self-attention and K, V for encoder-decoder attention;
            # our kv_proj is K above V already
            if self_attention:
                spec.linear[0].weight = torch.cat([attention.q_proj.weight, attention.kv_proj.weight])
            else:
                spec.linear[0].weight = attention.q_proj.weight
                spec.linear[1].weight = attention.kv_proj.weight
            spec.linear[-1].weight = attention.out_proj.weight

        def set_vocabulary(self, spec, tokens):
            spec.register_source_vocabulary(tokens)
            spec.register_target_vocabulary(tokens)

        def set_config(self, spec_config, model, tokenizer):
            spec_config.bos_token = tokenizer.bos_token
            spec_config.eos_token = tokenizer.eos_token
            spec_config.unk_token = tokenizer.unk_token
            spec_config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)

    class LoadedModelConverter(TransformersConverter):
        """Converts a model and tokenizer already loaded (through our checks) from `model_path`."""

        def __init__(self, model_path: str, model, tokenizer):
            super().__init__(model_path)
            self.model, self.tokenizer = model, tokenizer

        def load_model(self, model_class, model_name_or_path, **kwargs):
            return self.model

        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return self.tokenizer

    return LoadedModelConverter


def check_ctranslate2_expressible(config, activations: dict) -> None:
    """Refuse, naming the attribute, a variant that CTranslate2's Transformer cannot run."""
    heads = config.encoder_attention_heads
    even_split = config.d_model // heads
    problems = [
        (
            "decoder_attention_heads",
            config.decoder_attention_heads != heads,
            f"differs from encoder_attention_heads={heads}: CTranslate2 has one head count",
        ),
        ("head_dim", config.head_dim not in (None, even_split), f"is not d_model / heads = {even_split}"),
        ("v_head_dim", config.v_head_dim not in (None, config.head_dim or even_split), "differs from head_dim"),
        (
            "activation_function",
            config.activation_function not in activations,
            f"is not one CTranslate2 has ({', '.join(activations)})",
        ),
    ]
    for name, failed, why in problems:
        if failed:
            raise ValueError(
                f"{os.path.join(config.name_or_path, 'config.json')}: {name}={getattr(config, name)!r} {why}; "
                "CTranslate2 cannot run this variant"
            )
