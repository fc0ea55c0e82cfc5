"""Export a trained model folder to ONNX, in the layout transformers.js and ONNX Runtime load for translation.

    vanilla-export-onnx --model runs/multi30k-small --output_dir runs/multi30k-small-onnx

The model goes through its exact `MarianMTModel` form (tools/export_marian.py, which refuses what Marian cannot
compute), so the folder is a Marian model to every tool that reads it: `config.json` (model_type `marian`),
`generation_config.json`, the tokenizer files, and

    onnx/encoder_model.onnx               input_ids, attention_mask -> last_hidden_state
    onnx/decoder_model_merged.onnx        one decoding step, below
    onnx/*_quantized.onnx                 the same, int8 weights (onnxruntime's dynamic quantization)

The decoder takes `input_ids` (the step's token), `encoder_hidden_states`, `encoder_attention_mask` and, per layer,
`past_key_values.{i}.decoder.{key,value}` (length 0 at the first step), and returns `logits`,
`present.{i}.decoder.*` and `present.{i}.encoder.*` (the cross-attention's keys and values) and
`cross_attentions.{i}`, the weights each layer's encoder-decoder attention gave the source (what the browser page
draws). It has no `past_key_values.{i}.encoder.*` inputs: it computes the cross-attention's keys and values from
`encoder_hidden_states` at each step. optimum's merged decoders reuse them behind an `If` on `use_cache_branch`;
one graph without the branch is simpler to export and to check, and costs two source-length matrix products per
layer and step. transformers.js feeds only the inputs a graph declares, so it runs either form.

What the folder cannot carry: beam search (transformers.js decodes greedily, so the generation config written here
is greedy; the source model's beam settings are in its card) and the per-sentence length limit (Section 6.1: source
length + 50 tokens), which a caller passes as `max_new_tokens` (`OnnxTranslator`, tools/onnx_runtime.py, applies it
from the generation config, where it stays).
Needs the [onnx] extra. Written to a temporary folder and renamed when complete.
"""

import os
from collections.abc import Callable

import torch
from transformers import DynamicCache, EncoderDecoderCache, GenerationConfig

from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.files import atomic_output_dir, check_output_dir
from hf_vanilla_transformer.loading import ModelFolderError, load_model_and_tokenizer
from hf_vanilla_transformer.model.modeling_vanilla_transformer import CACHE_NAME, source_length_margin
from hf_vanilla_transformer.tools.card import write_export_card
from hf_vanilla_transformer.tools.export_marian import marian_model

ONNX_FOLDER = "onnx"
GRAPHS = ("encoder_model", "decoder_model_merged")
QUANTIZED = "_quantized"  # transformers.js's suffix for int8 files (its dtype "q8")
# the symbolic dimensions' names: transformers.js fills a graph's empty past from its input metadata, resolving
# `batch_size` and taking every other named dimension as 0
BATCH, SOURCE, PAST = "batch_size", "encoder_sequence_length", "past_sequence_length"


class EncoderGraph(torch.nn.Module):
    """The encoder alone, as transformers.js calls it."""

    def __init__(self, marian):
        super().__init__()
        self.marian = marian

    def forward(self, input_ids, attention_mask):
        return self.marian.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class DecoderStepGraph(torch.nn.Module):
    """One decoding step on flat tensors: the cache objects of transformers are built inside the graph from the
    past keys and values, and taken apart again on the way out."""

    def __init__(self, marian):
        super().__init__()
        self.marian = marian

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states, past):
        cache = EncoderDecoderCache(DynamicCache([tuple(layer) for layer in past]), DynamicCache())
        output = self.marian(
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=encoder_attention_mask,
            decoder_input_ids=input_ids,
            use_cache=True,
            output_attentions=True,
            **{CACHE_NAME: cache},
        )
        cache = getattr(output, CACHE_NAME)
        present = [
            tensor
            for layers in (cache.self_attention_cache.layers, cache.cross_attention_cache.layers)
            for layer in layers
            for tensor in (layer.keys, layer.values)
        ]
        return output.logits, *present, *output.cross_attentions


def graph_names(layers: int) -> tuple[list[str], list[str]]:
    """The decoder graph's input and output names, in transformers.js's (and optimum's) naming."""
    kinds = ("key", "value")
    inputs = ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
    inputs += [f"past_key_values.{i}.decoder.{kind}" for i in range(layers) for kind in kinds]
    outputs = ["logits"]
    for stack in ("decoder", "encoder"):
        outputs += [f"present.{i}.{stack}.{kind}" for i in range(layers) for kind in kinds]
    outputs += [f"cross_attentions.{i}" for i in range(layers)]
    return inputs, outputs


def export_graphs(marian, folder: str) -> None:
    """Write the encoder and decoder graphs of `marian` into `folder`. The example inputs have a batch of 2, a
    padded source and a past of 3 tokens: torch.export specialises dimensions of size 0 or 1."""
    require("onnxscript", "Exporting to ONNX")
    marian.set_attn_implementation("eager")  # the attention weights are outputs
    config = marian.config
    batch, source, past_length = (torch.export.Dim(name) for name in (BATCH, SOURCE, PAST))
    eos, pad = config.eos_token_id, config.pad_token_id
    input_ids = torch.tensor([[5, 6, 7, 8, eos], [9, 10, eos, pad, pad]])
    attention_mask = (input_ids != config.pad_token_id).long()
    with torch.no_grad():
        encoder = EncoderGraph(marian).eval()
        hidden = encoder(input_ids, attention_mask)
        torch.onnx.export(
            encoder,
            (input_ids, attention_mask),
            os.path.join(folder, "encoder_model.onnx"),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_shapes=({0: batch, 1: source}, {0: batch, 1: source}),
            dynamo=True,
            external_data=False,  # one file a graph, as transformers.js loads by default (under 2 GB)
        )
        heads, head_dim = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
        # a tensor each: the exporter would take one tensor passed twice for one input
        past = [[torch.randn(2, heads, 3, head_dim) for _ in range(2)] for _ in range(config.decoder_layers)]
        step = torch.full((2, 1), config.decoder_start_token_id)
        input_names, output_names = graph_names(config.decoder_layers)
        torch.onnx.export(
            DecoderStepGraph(marian).eval(),
            (step, attention_mask, hidden, past),
            os.path.join(folder, "decoder_model_merged.onnx"),
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=(
                {0: batch},
                {0: batch, 1: source},
                {0: batch, 1: source},
                [[{0: batch, 2: past_length}] * 2] * config.decoder_layers,
            ),
            dynamo=True,
            external_data=False,
        )


def quantize(folder: str) -> None:
    """int8 copies of the graphs: weights quantized ahead, activations at run time (onnxruntime's dynamic
    quantization, as transformers.js's own conversion script does)."""
    require("onnxruntime", "Quantizing an ONNX export")
    from onnxruntime import quantization

    for graph in GRAPHS:
        quantization.quantize_dynamic(
            os.path.join(folder, f"{graph}.onnx"),
            os.path.join(folder, f"{graph}{QUANTIZED}.onnx"),
            weight_type=quantization.QuantType.QInt8,
        )


def greedy_generation_config(generation_config: GenerationConfig) -> GenerationConfig:
    """The model's decoding settings, greedy: what this folder's runtimes do. The per-sentence limit stays, under
    its own name, for `OnnxTranslator` (transformers.js ignores it)."""
    settings = generation_config.to_diff_dict()
    for setting in ("num_beams", "length_penalty", "early_stopping", "transformers_version"):
        settings.pop(setting, None)
    return GenerationConfig(**settings)


def export(model_path: str, output_dir: str, overwrite_output_dir: bool = False) -> str:
    """Write `model_path` (one of our model folders) as an ONNX folder at `output_dir`."""
    for package in ("onnx", "onnxruntime", "onnxscript"):
        require(package, "Exporting to ONNX")
    check_output_dir(output_dir, overwrite_output_dir, source=model_path)
    model, tokenizer = load_model_and_tokenizer(model_path, "cpu", dtype=torch.float32)
    if model.config.model_type != "vanilla_transformer":
        raise ModelFolderError(
            f"{os.path.join(model_path, 'config.json')}: model_type {model.config.model_type!r} is not ours "
            "(vanilla_transformer); only our models are exported"
        )
    marian = marian_model(model)
    with atomic_output_dir(output_dir, overwrite_output_dir) as staging:
        graphs = os.path.join(staging, ONNX_FOLDER)
        os.makedirs(graphs)
        export_graphs(marian, graphs)
        quantize(graphs)
        marian.config.save_pretrained(staging)
        greedy_generation_config(model.generation_config).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        margin = source_length_margin(model.generation_config)
        write_export_card(model_path, staging, output_dir, "transformers.js", ["onnx", "marian"], usage(margin))
    return output_dir


def usage(margin: int | None) -> Callable[[str, str], str]:
    """The card's "How to use" for an ONNX export of a model whose sentences ended by their source length +
    `margin` tokens (None: no such limit)."""

    def section(model_id: str, example: str) -> str:
        limit = (
            f"The source model ends each sentence by its source length + {margin} tokens, `</s>` included (Section "
            "6.1); pass one fewer as `max_new_tokens`, as above, sentence by sentence."
            if margin is not None
            else "Pass `max_new_tokens` to bound a translation."
        )
        return f"""## How to use

This folder is the model above in ONNX (`vanilla-export-onnx`), laid out for
[transformers.js](https://huggingface.co/docs/transformers.js) and ONNX Runtime: `onnx/encoder_model.onnx`,
`onnx/decoder_model_merged.onnx` and their int8 copies (`_quantized`, transformers.js's `dtype: "q8"`).

```js
import {{ AutoTokenizer, AutoModelForSeq2SeqLM }} from "@huggingface/transformers";

const tokenizer = await AutoTokenizer.from_pretrained("{model_id}");
const model = await AutoModelForSeq2SeqLM.from_pretrained("{model_id}", {{ dtype: "fp32" }});
const inputs = tokenizer("{example}");
const output = await model.generate({{ ...inputs, max_new_tokens: inputs.input_ids.dims[1] + {(margin or 50) - 1} }});
console.log(tokenizer.decode(output[0], {{ skip_special_tokens: true }}));
```

**Greedy decoding only**: transformers.js has no beam search, so translations here are greedy where the source
model's own `generate()` uses the paper's beam search (beam 4, length penalty 0.6) — usually a little lower BLEU.
{limit} In Python, ONNX Runtime decodes the same way with hf-vanilla-transformer's
`hf_vanilla_transformer.tools.onnx_runtime.OnnxTranslator("{model_id}").translate(sentences, batch_size=32)`.
"""

    return section
