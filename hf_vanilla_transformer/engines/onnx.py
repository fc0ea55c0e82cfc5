"""Greedy translation with ONNX Runtime from a folder written by `vanilla-export-onnx` (export/onnx.py).

transformers has no ONNX Runtime model for version 5 (optimum's `ORTModelForSeq2SeqLM` requires transformers < 4.58),
so this is the small loop such a model runs: encode once, then one decoder step per token, the decoder's keys and
values handed back as its past. It decodes as `generate(num_beams=1)` does, Section 6.1's per-sentence limit
included (source length + the folder's `max_new_tokens_over_source`, `</s>` forced as the last allowed token).
"""

import functools
import os

import numpy as np
from transformers import GenerationConfig, MarianConfig

from hf_vanilla_transformer.decoding.request import Hypothesis, Steering
from hf_vanilla_transformer.engines.base import Translator
from hf_vanilla_transformer.extras import require
from hf_vanilla_transformer.formats import DECODER_GRAPH, ENCODER_GRAPH, ONNX_FOLDER, QUANTIZED, is_onnx_folder
from hf_vanilla_transformer.hardware import check_device
from hf_vanilla_transformer.loading import load_tokenizer, max_positions
from hf_vanilla_transformer.model.modeling_vanilla_transformer import max_new_tokens_over_source_of


def past_names(layers: int) -> list[str]:
    """The decoder's past inputs, self-attention's then cross-attention's, in transformers.js's naming."""
    return [
        f"past_key_values.{i}.{stack}.{kind}"
        for stack in ("decoder", "encoder")
        for i in range(layers)
        for kind in ("key", "value")
    ]


def output_names(layers: int) -> list[str]:
    """The decoder's outputs: the logits, the presents in the order of `past_names`, each layer's cross-attention."""
    presents = [name.replace("past_key_values", "present") for name in past_names(layers)]
    return ["logits", *presents, *(f"cross_attentions.{i}" for i in range(layers))]


class OnnxTranslator(Translator):
    """The folder's graphs in ONNX Runtime sessions on the CPU (`quantized`: the int8 ones), `threads` threads
    each (None: ONNX Runtime's default, every core). Greedy decoding, the best translation only: n-best lists,
    scores, prefixes, constraints, alignments and sampling are refused (`check_request`)."""

    engine = "ONNX Runtime (greedy)"
    folder = "an ONNX folder"
    folders = "ONNX folders"
    num_beams = 1
    decoding = frozenset({"max_new_tokens"})

    @classmethod
    def reads(cls, path: str) -> bool:
        return is_onnx_folder(path)

    @classmethod
    def loader(cls, paths: list[str], device: str | None, threads: int | None, options: dict):
        check_device(device or "cpu", "ONNX Runtime (CPU)", None, 0)
        require("onnxruntime", "translating an ONNX folder")
        return functools.partial(cls, paths[0], threads=threads)

    def __init__(self, model_path: str, quantized: bool = False, threads: int | None = None):
        onnxruntime = require("onnxruntime", "translating an ONNX folder")
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        suffix = QUANTIZED if quantized else ""

        def session(graph: str):
            path = os.path.join(model_path, ONNX_FOLDER, f"{graph}{suffix}.onnx")
            return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])

        self.encoder, self.decoder = session(ENCODER_GRAPH), session(DECODER_GRAPH)
        self.tokenizer = load_tokenizer(model_path)
        self.config = MarianConfig.from_pretrained(model_path)
        generation = GenerationConfig.from_pretrained(model_path)
        self.max_positions = max_positions(generation, model_path)
        self.max_new_tokens_over_source = max_new_tokens_over_source_of(generation)
        self.suppress_tokens = generation.suppress_tokens or []  # never written, as generate() never writes them
        self.past_names = past_names(self.config.decoder_layers)
        self.present_names = output_names(self.config.decoder_layers)[1 : 1 + len(self.past_names)]

    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray, max_new_tokens: int | None = None):
        """Greedy decoding of a padded batch: the generated ids of each sentence, `</s>` included where reached.
        Each sentence ends by its own limit, `</s>` forced as its last allowed token; `max_new_tokens` cuts every
        sentence there as well, whichever comes first, as in `generate()`."""
        config = self.config
        sources = attention_mask.sum(-1).tolist()
        limits = np.full(len(input_ids), self.max_positions)  # no sentence's own limit: never forced
        if self.max_new_tokens_over_source is not None:
            limits = np.array(self.length_limits(sources))
        longest = max(self.length_limits(sources, max_new_tokens))
        (hidden,) = self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
        heads, head_dim = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
        past = {name: np.zeros((len(input_ids), heads, 0, head_dim), np.float32) for name in self.past_names}
        step = np.full((len(input_ids), 1), config.decoder_start_token_id, dtype=np.int64)
        generated, done = [], np.zeros(len(input_ids), dtype=bool)
        while not done.all() and len(generated) < longest:
            logits, *presents = self.decoder.run(
                ["logits", *self.present_names],
                {
                    "input_ids": step,
                    "encoder_attention_mask": attention_mask,
                    "encoder_hidden_states": hidden,
                    "use_cache_branch": np.array([bool(generated)]),
                    **past,
                },
            )
            scores = logits[:, -1]
            scores[:, self.suppress_tokens] = -np.inf
            tokens = scores.argmax(-1)
            tokens = np.where(len(generated) >= limits - 1, config.eos_token_id, tokens)  # the last allowed token
            tokens = np.where(done, config.pad_token_id, tokens)
            generated.append(tokens)
            done |= tokens == config.eos_token_id
            step = tokens[:, None]
            past = dict(zip(self.past_names, presents, strict=True))
        return np.stack(generated, axis=1)

    def hypotheses(
        self, sentences: list[str], batch_size: int, steering: Steering, max_new_tokens: int | None = None
    ) -> list[list[Hypothesis]]:
        translations = []
        for start in range(0, len(sentences), batch_size):
            batch = self.tokenizer(
                sentences[start : start + batch_size],
                truncation=True,
                max_length=self.max_positions,
                padding=True,
                return_tensors="np",
            )
            ids = self.generate(batch["input_ids"], batch["attention_mask"], max_new_tokens)
            translations += self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return [[Hypothesis(text)] for text in translations]
