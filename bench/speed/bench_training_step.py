"""Training-step speed against the peers a user would pick instead, and against this CPU's matmul limit.

    python -m bench training_step --preset small --repetitions 5

One training step (forward, backward, Adam step) of three models of the same size and shape, on the same batches
cut from Multi30k train by our token-budget sampler: ours, transformers' MarianMTModel configured to match
(post-LN, sinusoidal positions, sqrt(d_model) scale, shared and tied embeddings, ReLU), and torch.nn.Transformer
with the same embeddings and output layer. Repetitions are interleaved (ours, Marian, nn, ours, ...) and the
median kept. Also measured in the same run: dense fp32 matmul FLOP/s (torch.matmul, 2048x2048), and our step's
model FLOPs utilisation = analytic FLOPs of the batch / step time / matmul FLOP/s.

    python -m bench training_step --preset small --repetitions 7 --label_smoother_cache

measures instead our step as the Trainer runs it with label smoothing (its `LabelSmoother` takes the labels, so
the model is called without them) with the decoder's key/value cache built, as every training step did before
the cache was left out of training steps, against the same step without it.

    python -m bench training_step --preset small --repetitions 5 --torch_compile

measures ours and MarianMTModel each eager and under torch.compile (inductor, default mode: what the Trainer's
--torch_compile does), with the MFU of each; its results file's variant is compiled_<preset>.
"""

import argparse
import copy
import math

import torch
from torch import nn

from bench.helpers.common import (
    add_repetitions,
    hf_loss,
    interleaved_medians,
    machine,
    marian_like,
    matmul_rate,
    multi30k_batches,
    step_function,
    training_flops,
    write_results,
)
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.modeling_vanilla_transformer import VanillaTransformerSinusoidalPositionalEncoding
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments


class TorchTransformerTranslator(nn.Module):
    """torch.nn.Transformer (post-LN, ReLU) with our embeddings, sinusoids and tied output layer."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()

        d = config.d_model
        self.embedding = nn.Embedding(config.vocab_size, d)
        self.register_buffer(
            "positions",
            VanillaTransformerSinusoidalPositionalEncoding.compute_encoding(config.max_position_embeddings, d),
            persistent=False,
        )
        self.dropout = nn.Dropout(config.dropout)
        encoder_layer = nn.TransformerEncoderLayer(
            d, config.encoder_attention_heads, config.encoder_ffn_dim, config.dropout, batch_first=True
        )
        decoder_layer = nn.TransformerDecoderLayer(
            d, config.decoder_attention_heads, config.decoder_ffn_dim, config.dropout, batch_first=True
        )
        self.transformer = nn.Transformer(
            d,
            custom_encoder=nn.TransformerEncoder(encoder_layer, config.encoder_layers, enable_nested_tensor=False),
            custom_decoder=nn.TransformerDecoder(decoder_layer, config.decoder_layers),
            batch_first=True,
        )
        self.scale = math.sqrt(d)
        self.pad_token_id = config.pad_token_id

    def embed(self, ids):
        return self.dropout(self.embedding(ids) * self.scale + self.positions[: ids.shape[1]])

    def forward(self, input_ids, attention_mask, decoder_input_ids, labels):
        causal = nn.Transformer.generate_square_subsequent_mask(decoder_input_ids.shape[1])
        padding = attention_mask == 0
        hidden = self.transformer(
            self.embed(input_ids),
            self.embed(decoder_input_ids),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=padding,
            memory_key_padding_mask=padding,
        )
        logits = hidden @ self.embedding.weight.T
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def label_smoother_loss(use_cache: bool | None):
    """The Trainer's loss with the paper's label smoothing: the model called without labels, then LabelSmoother."""
    from transformers.trainer_pt_utils import LabelSmoother

    smoother = LabelSmoother(epsilon=TranslationTrainingArguments.label_smoothing_factor)

    def loss_of(model, batch):
        inputs = {name: value for name, value in batch.items() if name != "labels"}
        return smoother(model(**inputs, use_cache=use_cache), batch["labels"])

    return loss_of


def compare_label_smoother_cache(ours, batches, repetitions: int) -> dict:
    """Our training step with the Trainer's label smoother, building the decoder cache (before) and not (after)."""
    candidates = {
        "cache built (before)": step_function(ours, batches, label_smoother_loss(use_cache=True)),
        "no cache (after)": step_function(copy.deepcopy(ours), batches, label_smoother_loss(use_cache=None)),
    }
    for run in candidates.values():  # warm-up
        run()
    return interleaved_medians(candidates, repetitions)


def torch_loss(model, batch):
    return model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"], batch["labels"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batches", type=int, default=8, help="Batches per timed repetition.")
    parser.add_argument("--max_tokens", type=int, default=2048)
    add_repetitions(parser, 5)
    parser.add_argument(
        "--label_smoother_cache", action="store_true", help="Compare our step with and without the decoder cache."
    )
    parser.add_argument(
        "--torch_compile", action="store_true", help="Ours and Marian, each eager and under torch.compile (inductor)."
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    batches, tokenizer = multi30k_batches(args.batches, args.max_tokens)
    config = VanillaTransformerConfig.from_preset(args.preset, vocab_size=len(tokenizer))
    ours = VanillaTransformerForConditionalGeneration(config)
    ours.set_attn_implementation("sdpa")
    target_tokens = sum(int((b["labels"] != -100).sum()) for b in batches)
    if args.label_smoother_cache:
        medians = compare_label_smoother_cache(ours, batches, args.repetitions)
        results = {
            "machine": machine(),
            "preset": args.preset,
            "batches": args.batches,
            "max_tokens": args.max_tokens,
            "target_tokens_per_repetition": target_tokens,
            "seconds_per_repetition": {name: round(seconds, 4) for name, seconds in medians.items()},
            "speedup_after": round(medians["cache built (before)"] / medians["no cache (after)"], 3),
            "repetitions": args.repetitions,
        }
        for name, seconds in medians.items():
            print(f"{name:<24} {seconds:8.3f} s   {target_tokens / seconds:10,.0f} target tokens/s")
        print(f"after / before: {results['speedup_after']:.3f}x")
        print("wrote", write_results("training_step", results, f"label_smoother_cache_{args.preset}"))
        return
    marian = marian_like(config)
    if args.torch_compile:  # each model eager and compiled (inductor, the Trainer's --torch_compile default)
        candidates = {
            "ours": step_function(ours, batches, hf_loss),
            "ours, compiled": step_function(torch.compile(copy.deepcopy(ours)), batches, hf_loss),
            "MarianMTModel": step_function(marian, batches, hf_loss),
            "MarianMTModel, compiled": step_function(torch.compile(copy.deepcopy(marian)), batches, hf_loss),
        }
    else:
        candidates = {
            "ours": step_function(ours, batches, hf_loss),
            "MarianMTModel": step_function(marian, batches, hf_loss),
            "torch.nn.Transformer": step_function(TorchTransformerTranslator(config), batches, torch_loss),
        }
    for run in candidates.values():  # warm-up (and compilation: the batches' shapes make dynamo go dynamic)
        run()
    matmul = matmul_rate()
    medians = interleaved_medians(candidates, args.repetitions)
    matmul_after = matmul_rate()

    rates = {name: target_tokens / seconds for name, seconds in medians.items()}
    flops = sum(training_flops(config, b) for b in batches)
    mfus = {name: flops / seconds / max(matmul, matmul_after) for name, seconds in medians.items()}
    mfu = mfus["ours"]
    padded = sum(b["labels"].numel() for b in batches)
    results = {
        "machine": machine(),
        "preset": args.preset,
        "parameters": ours.num_parameters(),
        "batches": args.batches,
        "max_tokens": args.max_tokens,
        "target_tokens_per_repetition": target_tokens,
        "target_padding_fraction": round(1 - target_tokens / padded, 4),
        "target_tokens_per_second": {name: round(rate) for name, rate in rates.items()},
        "ratio_ours_to": {name: round(rates["ours"] / rate, 3) for name, rate in rates.items() if name != "ours"},
        "matmul_gflops": round(max(matmul, matmul_after) / 1e9, 1),
        "model_gflops_per_repetition": round(flops / 1e9, 1),
        "mfu": round(mfu, 3),
        "repetitions": args.repetitions,
    }
    if args.torch_compile:
        results["mfu_of_each"] = {name: round(value, 3) for name, value in mfus.items()}
        results["compiled_over_eager"] = {
            name: round(rates[f"{name}, compiled"] / rates[name], 3) for name in ("ours", "MarianMTModel")
        }
        results["ours_over_marian"] = {
            "eager": round(rates["ours"] / rates["MarianMTModel"], 3),
            "compiled": round(rates["ours, compiled"] / rates["MarianMTModel, compiled"], 3),
        }
    print(f"{args.preset} preset, {args.batches} batches of <= {args.max_tokens} tokens, {target_tokens} target tokens")
    print(f"{'model':<24} {'target tokens/s':>16} {'ours / this':>12}")
    for name, rate in rates.items():
        print(f"{name:<24} {rate:>16,.0f} {rates['ours'] / rate:>12.2f}")
    step_gflops = flops / medians["ours"] / 1e9
    print(f"matmul: {results['matmul_gflops']} GFLOP/s; our step: {step_gflops:.1f} GFLOP/s; MFU {mfu:.1%}")
    if args.torch_compile:
        print("compiled / eager:", results["compiled_over_eager"], "ours / Marian:", results["ours_over_marian"])
        print("MFU:", results["mfu_of_each"])
    print("wrote", write_results("training_step", results, f"{'compiled_' if args.torch_compile else ''}{args.preset}"))


if __name__ == "__main__":
    main()
