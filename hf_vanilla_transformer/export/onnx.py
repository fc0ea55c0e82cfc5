"""Export a trained model folder to ONNX, in the layout transformers.js and ONNX Runtime load for translation.

    vanilla-export-onnx --model runs/multi30k-small --output_dir runs/multi30k-small-onnx

The model goes through its exact `MarianMTModel` form (export/marian.py, which refuses what Marian cannot
compute), so the folder is a Marian model to every tool that reads it: `config.json` (model_type `marian`),
`generation_config.json`, the tokenizer files, and

    onnx/encoder_model.onnx               input_ids, attention_mask -> last_hidden_state
    onnx/decoder_model_merged.onnx        one decoding step, below
    onnx/*_quantized.onnx                 the same, int8 weights (onnxruntime's dynamic quantization)

The decoder takes `input_ids` (the step's token), `encoder_hidden_states`, `encoder_attention_mask`, per layer
`past_key_values.{i}.decoder.{key,value}` and `past_key_values.{i}.encoder.{key,value}`, and `use_cache_branch`,
and returns `logits`, `present.{i}.decoder.*`, `present.{i}.encoder.*` and `cross_attentions.{i}`, the weights each
layer's encoder-decoder attention gave the source (what the browser page draws). It is two graphs behind an `If` on
`use_cache_branch`, as optimum merges its decoders: the first step (the past empty, `use_cache_branch` false)
computes the cross-attention's keys and values from the encoder output; every later step takes them back as its
past, with the self-attention's. torch's exporter writes each graph (`torch.onnx.export(dynamo=True)`);
`merge_decoders` joins them, storing each weight both use once.

What the folder cannot carry: beam search (transformers.js decodes greedily, so the generation config written here
is greedy; the source model's beam settings are in its card) and the per-sentence length limit (Section 6.1: source
length + 50 tokens), which a caller passes as `max_new_tokens` (`OnnxTranslator`, engines/onnx.py, applies it
from the generation config, where it stays).
Needs the [onnx] extra. Written to a temporary folder and renamed when complete.
"""

import hashlib
import os
import tempfile
from collections.abc import Callable

import torch
from transformers import DynamicCache, EncoderDecoderCache, GenerationConfig

from hf_vanilla_transformer.engines.onnx import output_names, past_names
from hf_vanilla_transformer.export.marian import marian_model
from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.files import atomic_output_dir, check_output_dir
from hf_vanilla_transformer.formats import DECODER_GRAPH, ENCODER_GRAPH, ONNX_FOLDER, QUANTIZED
from hf_vanilla_transformer.loading import load_ours
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    CACHE_NAME,
    PAPER_MAX_NEW_TOKENS_OVER_SOURCE,
    max_new_tokens_over_source_of,
)
from hf_vanilla_transformer.sharing.card import write_export_card
from hf_vanilla_transformer.sharing.markdown import code_literal, inline_code

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
    past keys and values (none at the first step), and taken apart again on the way out."""

    def __init__(self, marian):
        super().__init__()
        self.marian = marian

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states, past=(), cross_past=()):
        cache = EncoderDecoderCache(
            DynamicCache([tuple(layer) for layer in past]) if past else DynamicCache(),
            DynamicCache([tuple(layer) for layer in cross_past]) if cross_past else DynamicCache(),
        )
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


def export_graphs(marian, folder: str) -> None:
    """Write the encoder and decoder graphs of `marian` into `folder`, and their int8 copies. The example inputs
    have a batch of 2, a padded source and a past of 3 tokens: torch.export specialises dimensions of size 0 or 1."""
    require("onnxscript", "exporting to ONNX")
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
            os.path.join(folder, f"{ENCODER_GRAPH}.onnx"),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_shapes=({0: batch, 1: source}, {0: batch, 1: source}),
            dynamo=True,
            verbose=False,
            external_data=False,  # one file a graph, as transformers.js loads by default (under 2 GB)
        )
        heads, head_dim = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
        layers = config.decoder_layers
        # a tensor each: the exporter would take one tensor passed twice for one input
        past, cross_past = (
            [[torch.randn(2, heads, length, head_dim) for _ in range(2)] for _ in range(layers)]
            for length in (3, input_ids.shape[1])
        )
        step = torch.full((2, 1), config.decoder_start_token_id)
        decoder = DecoderStepGraph(marian).eval()
        inputs = ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
        first_shapes = ({0: batch}, {0: batch, 1: source}, {0: batch, 1: source})
        with tempfile.TemporaryDirectory(dir=folder) as graphs:
            first, later = os.path.join(graphs, "first_step.onnx"), os.path.join(graphs, "with_past.onnx")
            torch.onnx.export(
                decoder,
                (step, attention_mask, hidden),
                first,
                input_names=inputs,
                output_names=output_names(layers),
                dynamic_shapes=first_shapes,
                dynamo=True,
                verbose=False,
                external_data=False,
            )
            torch.onnx.export(
                decoder,
                (step, attention_mask, hidden, past, cross_past),
                later,
                input_names=inputs + past_names(layers),
                output_names=output_names(layers),
                dynamic_shapes=(
                    *first_shapes,
                    [[{0: batch, 2: past_length}] * 2] * layers,
                    [[{0: batch, 2: source}] * 2] * layers,
                ),
                dynamo=True,
                verbose=False,
                external_data=False,
            )
            merge_decoders(first, later, os.path.join(folder, f"{DECODER_GRAPH}.onnx"))

            # the branches are quantized before they are joined: the quantizer leaves alone the weights a branch
            # reads from the graph around it
            def int8(path: str) -> str:
                return f"{os.path.splitext(path)[0]}{QUANTIZED}.onnx"

            for graph in (os.path.join(folder, f"{ENCODER_GRAPH}.onnx"), first, later):
                quantize(graph, int8(graph))
            merge_decoders(int8(first), int8(later), int8(os.path.join(folder, f"{DECODER_GRAPH}.onnx")))


def merge_decoders(first_step_path: str, with_past_path: str, output_path: str) -> None:
    """One decoder graph from the first step's and the later steps': an `If` on `use_cache_branch` with each as a
    branch. The inputs are the later steps' (the first step's are among them); the cross-attention's past gets a
    length of its own name, since it is empty at the first step. Each constant both graphs hold (the weights, and
    the exporter's transposes of them, under names of its own) is stored once, outside the branches."""
    onnx = require("onnx", "exporting to ONNX")
    first, later = onnx.load(first_step_path), onnx.load(with_past_path)
    # each graph's constants by their content, whatever their names, hashed once
    first_keys, later_keys = (
        {constant.name: constant_key(onnx, constant) for constant in graph.initializer}
        for graph in (first.graph, later.graph)
    )
    first_constants = set(first_keys.values())
    shared = {}
    for constant in later.graph.initializer:
        key = later_keys[constant.name]
        if key in first_constants and key not in shared:
            shared[key] = onnx.TensorProto()
            shared[key].CopyFrom(constant)
            shared[key].name = f"shared_{len(shared)}"
    outputs = []
    for value in later.graph.output:
        output = onnx.ValueInfoProto()
        output.CopyFrom(value)
        if value.name.startswith("present.") and ".decoder." in value.name:  # 1 at the first step, past + 1 later
            output.type.tensor_type.shape.dim[2].dim_param = "present_sequence_length"
        outputs.append(output)
    inputs = list(later.graph.input)
    for value in inputs:
        if value.name.startswith("past_key_values.") and ".encoder." in value.name:
            value.type.tensor_type.shape.dim[2].dim_param = "encoder_past_sequence_length"
    inputs.append(onnx.helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1]))
    branch = onnx.helper.make_node(
        "If",
        ["use_cache_branch"],
        [output.name for output in outputs],
        then_branch=branch_graph(onnx, later, "with_past", shared, later_keys),
        else_branch=branch_graph(onnx, first, "first_step", shared, first_keys),
    )
    graph = onnx.helper.make_graph([branch], DECODER_GRAPH, inputs, outputs, list(shared.values()))
    functions = {(function.domain, function.name): function for function in [*first.functions, *later.functions]}
    merged = onnx.helper.make_model(
        graph, opset_imports=later.opset_import, functions=list(functions.values()), ir_version=later.ir_version
    )
    onnx.checker.check_model(merged)
    onnx.save(merged, output_path)


def constant_key(onnx, constant) -> tuple:
    """A constant by its content, whatever its name."""
    values = onnx.numpy_helper.to_array(constant)
    return constant.data_type, tuple(constant.dims), hashlib.sha256(values.tobytes()).hexdigest()


def branch_graph(onnx, model, name: str, shared: dict, keys: dict):
    """`model`'s graph as a branch of the `If`: no inputs of its own (it reads the outer graph's by name), its
    outputs renamed (a branch may not reuse the names of the `If`'s outputs) and its shared constants (`keys`: the
    `constant_key` of each of its constants, by name) read from the outer graph."""
    graph = model.graph
    renamed = {output.name: f"{name}.{output.name}" for output in graph.output}
    kept = []
    for constant in graph.initializer:
        key = keys[constant.name]
        if key in shared:
            renamed[constant.name] = shared[key].name
        else:
            kept.append(constant)
    for node in graph.node:
        node.input[:] = [renamed.get(value, value) for value in node.input]
        node.output[:] = [renamed.get(value, value) for value in node.output]
    for value in [*graph.value_info, *graph.output]:
        value.name = renamed.get(value.name, value.name)
    return onnx.helper.make_graph(list(graph.node), name, [], list(graph.output), kept, value_info=graph.value_info)


def quantize(graph: str, quantized: str) -> None:
    """An int8 copy of a graph: weights quantized ahead, activations at run time (onnxruntime's dynamic
    quantization, as transformers.js's own conversion script does)."""
    require("onnxruntime", "quantizing an ONNX export")
    from onnxruntime import quantization

    quantization.quantize_dynamic(graph, quantized, weight_type=quantization.QuantType.QInt8)


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
        require(package, "exporting to ONNX")
    check_output_dir(output_dir, overwrite_output_dir, reads=[model_path])
    model, tokenizer = load_ours(model_path)
    marian = marian_model(model)
    with atomic_output_dir(output_dir, overwrite_output_dir) as staging:
        graphs = os.path.join(staging, ONNX_FOLDER)
        os.makedirs(graphs)
        export_graphs(marian, graphs)
        marian.config.save_pretrained(staging)
        greedy_generation_config(model.generation_config).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        max_new_tokens_over_source = max_new_tokens_over_source_of(model.generation_config)
        write_export_card(
            model_path, staging, output_dir, "transformers.js", ["onnx", "marian"], usage(max_new_tokens_over_source)
        )
    return output_dir


def usage(max_new_tokens_over_source: int | None) -> Callable[[str, str], str]:
    """The card's "How to use" for an ONNX export of a model whose sentences ended by their source length +
    `max_new_tokens_over_source` tokens (None: no such limit)."""

    def section(model_id: str, example: str) -> str:
        model_literal, example_literal = code_literal(model_id), code_literal(example)
        onnx_translator = f"OnnxTranslator({model_literal}).translate(sentences, batch_size=32)"
        new_tokens = (max_new_tokens_over_source or PAPER_MAX_NEW_TOKENS_OVER_SOURCE) - 1  # `</s>` is not counted
        limit = (
            "The source model ends each sentence by its source length + "
            f"{max_new_tokens_over_source} tokens, `</s>` included (Section 6.1); pass one fewer as "
            "`max_new_tokens`, as above, sentence by sentence."
            if max_new_tokens_over_source is not None
            else "Pass `max_new_tokens` to bound a translation."
        )
        return f"""## How to use

This folder is the model above in ONNX (`vanilla-export-onnx`), laid out for
[transformers.js](https://huggingface.co/docs/transformers.js) and ONNX Runtime: `onnx/encoder_model.onnx`,
`onnx/decoder_model_merged.onnx` and their int8 copies (`_quantized`, transformers.js's `dtype: "q8"`).

```js
import {{ AutoTokenizer, AutoModelForSeq2SeqLM }} from "@huggingface/transformers";

const tokenizer = await AutoTokenizer.from_pretrained({model_literal});
const model = await AutoModelForSeq2SeqLM.from_pretrained({model_literal}, {{ dtype: "fp32" }});
const inputs = tokenizer({example_literal});
const output = await model.generate({{ ...inputs, max_new_tokens: inputs.input_ids.dims[1] + {new_tokens} }});
console.log(tokenizer.decode(output[0], {{ skip_special_tokens: true }}));
```

**Greedy decoding only**: transformers.js has no beam search, so translations here are greedy where the source
model's own `generate()` uses the paper's beam search (beam 4, length penalty 0.6) — usually a little lower BLEU.
{limit} In Python, ONNX Runtime decodes the same way with hf-vanilla-transformer's
{inline_code(f"hf_vanilla_transformer.engines.onnx.{onnx_translator}")}.
"""

    return section
