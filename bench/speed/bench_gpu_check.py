"""The GPU path in one short run: bf16 training steps and decoding, ours against MarianMTModel, and bf16 vs fp32.

    python -m bench gpu_check

On a CUDA device, for the "small" preset and the paper's "base" model, built for Multi30k's 8,000-token shared BPE:
1. training steps (forward, backward, fused Adam) under bf16 autocast with fp32 weights, sdpa attention, label
   smoothing 0.1 (ours: TranslationTrainer's one-pass loss; Marian: the stock Seq2SeqTrainer's `LabelSmoother`), on
   the same Multi30k batches cut by our token-budget sampler, ours and MarianMTModel of the same shape interleaved
   (median), with model FLOPs utilisation against the bf16 matmul rate measured in the same run; with --compile,
   ours under `torch.compile` too (dynamic shapes: the batches' lengths differ), its MFU beside eager's;
2. decoding all 1,000 Multi30k test sentences, batch 64, greedy and beam 4, exactly --new_tokens tokens each
   (the models are untrained, so the work per sentence is fixed), under bf16 autocast;
3. how far bf16 autocast moves the logits from fp32 (TF32 off) on one batch, and how often the argmax changes;
   and how far fp32 on the GPU is from fp32 on the CPU.

It prints one table and writes bench/results/gpu_check/DATE_<device>_<max_tokens>_tokens.json. `--device cpu` runs
the same code on the CPU, to check the script itself where no GPU is lent.
"""

import argparse

import torch
from transformers.trainer_pt_utils import LabelSmoother

from bench.helpers.common import (
    add_repetitions,
    decode_all,
    interleaved_medians,
    machine,
    marian_like,
    matmul_rate,
    multi30k_batches,
    multi30k_sources,
    source_batches,
    step_function,
    synchronized,
    training_flops,
    write_results,
)
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.training.loss import LabelSmoothedLoss


def smoothed_loss(loss_function):
    """A training step's loss as a trainer computes it with label smoothing 0.1 (Section 5.4), under bf16 autocast:
    the model called without the labels, the loss from its logits."""

    def loss_of(model, batch):
        inputs = {name: value for name, value in batch.items() if name != "labels"}
        with torch.autocast(model.device.type, dtype=torch.bfloat16):
            return loss_function(model(**inputs), batch["labels"])

    return loss_of


# ours as TranslationTrainer computes its loss, MarianMTModel as the stock Seq2SeqTrainer does
LOSSES = {"ours": smoothed_loss(LabelSmoothedLoss(0.1)), "MarianMTModel": smoothed_loss(LabelSmoother(0.1))}


def our_model(config: VanillaTransformerConfig, device: torch.device):
    torch.manual_seed(0)
    ours = VanillaTransformerForConditionalGeneration(config)
    ours.set_attn_implementation("sdpa")
    return ours.to(device)


def both_models(config: VanillaTransformerConfig, device: torch.device) -> dict:
    return {"ours": our_model(config, device), "MarianMTModel": marian_like(config).to(device)}


def training_speed(config, batches, device, repetitions: int, matmul: float, compiled: bool = False) -> dict:
    models = both_models(config, device)
    if compiled:
        models["ours, compiled"] = torch.compile(our_model(config, device), dynamic=True)
    candidates = {
        name: synchronized(step_function(model, batches, LOSSES[name.split(",")[0]]), device)
        for name, model in models.items()
    }
    for run in candidates.values():  # warm-up: kernels chosen, allocator filled
        run()
    medians = interleaved_medians(candidates, repetitions)
    target_tokens = sum(int((batch["labels"] != -100).sum()) for batch in batches)
    flops = sum(training_flops(config, batch) for batch in batches)
    return {
        "target_tokens_per_second": {name: round(target_tokens / seconds) for name, seconds in medians.items()},
        "ratio_ours_to_marian": round(medians["MarianMTModel"] / medians["ours"], 3),
        "mfu_ours": round(flops / medians["ours"] / matmul, 4),
        **({"mfu_ours_compiled": round(flops / medians["ours, compiled"] / matmul, 4)} if compiled else {}),
    }


def decoding_speed(config, batches, device, repetitions: int, new_tokens: int, sentences: int) -> dict:
    models = {name: model.eval() for name, model in both_models(config, device).items()}
    results = {}
    for beams in (1, 4):
        generate_kwargs = dict(num_beams=beams, do_sample=False, min_new_tokens=new_tokens, max_new_tokens=new_tokens)

        def decode(model, some_batches, generate_kwargs=generate_kwargs):
            run = decode_all(model, some_batches, **generate_kwargs)

            def in_bf16():
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    run()

            return synchronized(in_bf16, device)

        for model in models.values():  # warm-up
            decode(model, batches[:2])()
        medians = interleaved_medians({name: decode(model, batches) for name, model in models.items()}, repetitions)
        results["greedy" if beams == 1 else "beam 4"] = {
            "sentences_per_second": {name: round(sentences / seconds, 1) for name, seconds in medians.items()},
            "ratio_ours_to_marian": round(medians["MarianMTModel"] / medians["ours"], 3),
        }
    return results


def logits_agreement(config, batch, device) -> dict:
    """bf16 autocast against fp32 on the device, and fp32 on the device against fp32 on the CPU, one batch."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = both_models(config, device)["ours"].eval()
    with torch.no_grad():
        fp32 = model(**batch).logits.float()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            bf16 = model(**batch).logits.float()
        cpu = model.to("cpu")(**{name: value.cpu() for name, value in batch.items()}).logits
    real = (batch["labels"] != -100).cpu()
    fp32, bf16, cpu = fp32.cpu()[real], bf16.cpu()[real], cpu[real]
    return {
        "bf16_vs_fp32_max_abs": float((bf16 - fp32).abs().max()),
        "bf16_vs_fp32_mean_abs": float((bf16 - fp32).abs().mean()),
        "fp32_logit_std": float(fp32.std()),
        "bf16_argmax_agreement": float((bf16.argmax(-1) == fp32.argmax(-1)).float().mean()),
        "device_fp32_vs_cpu_fp32_max_abs": float((fp32 - cpu).abs().max()),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--presets", nargs="+", default=["small", "base"])
    parser.add_argument("--batches", type=int, default=8, help="Training batches per timed repetition.")
    parser.add_argument("--max_tokens", type=int, default=4096, help="Token budget of each training batch.")
    parser.add_argument("--new_tokens", type=int, default=20)
    parser.add_argument("--sentences", type=int, default=1000, help="Multi30k test sentences to decode.")
    add_repetitions(parser, 5)
    parser.add_argument("--compile", action="store_true", help="Also time our training step under torch.compile.")
    args = parser.parse_args()

    device = torch.device(args.device)
    batches, tokenizer = multi30k_batches(args.batches, args.max_tokens)
    batches = [{name: value.to(device) for name, value in batch.items()} for batch in batches]
    sources = source_batches(tokenizer, multi30k_sources()[: args.sentences], 64)
    sources = [{name: value.to(device) for name, value in batch.items()} for batch in sources]
    matmul = matmul_rate(torch.bfloat16, device, 8192 if device.type == "cuda" else 1024)
    results = {
        "machine": machine(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "bf16_matmul_tflops": round(matmul / 1e12, 1),
        "batches": args.batches,
        "max_tokens": args.max_tokens,
        "new_tokens": args.new_tokens,
        "sentences": args.sentences,
        "presets": {},
    }
    for preset in args.presets:
        config = VanillaTransformerConfig.from_preset(preset, vocab_size=len(tokenizer))
        results["presets"][preset] = {
            "training_bf16": training_speed(config, batches, device, args.repetitions, matmul, args.compile),
            "decoding_bf16_batch_64": decoding_speed(
                config, sources, device, args.repetitions, args.new_tokens, args.sentences
            ),
            "logits": logits_agreement(config, batches[0], device),
        }

    print(f"{results['device']}; bf16 matmul {results['bf16_matmul_tflops']} TFLOP/s")
    print(f"{'preset':<6} {'measure':<34} {'ours':>12} {'Marian':>12} {'ours/Marian':>12}")
    for preset, measured in results["presets"].items():
        training = measured["training_bf16"]
        rates = training["target_tokens_per_second"]
        row = f"{preset:<6} {'train step, target tokens/s':<34} {rates['ours']:>12,} {rates['MarianMTModel']:>12,}"
        print(f"{row} {training['ratio_ours_to_marian']:>12.2f}")
        for setting, decoding in measured["decoding_bf16_batch_64"].items():
            rates = decoding["sentences_per_second"]
            measure = f"decode {setting}, sentences/s"
            row = f"{preset:<6} {measure:<34} {rates['ours']:>12,} {rates['MarianMTModel']:>12,}"
            print(f"{row} {decoding['ratio_ours_to_marian']:>12.2f}")
        logits = measured["logits"]
        if "mfu_ours_compiled" in training:
            rate, mfu = training["target_tokens_per_second"]["ours, compiled"], training["mfu_ours_compiled"]
            print(f"{preset:<6} {'train step compiled, tokens/s':<34} {rate:>12,}   MFU {mfu:.1%}")
        print(
            f"{preset:<6} MFU {training['mfu_ours']:.1%}; bf16 vs fp32 logits: max |diff| "
            f"{logits['bf16_vs_fp32_max_abs']:.3g} (std {logits['fp32_logit_std']:.3g}), argmax agrees "
            f"{logits['bf16_argmax_agreement']:.2%}; GPU fp32 vs CPU fp32 max |diff| "
            f"{logits['device_fp32_vs_cpu_fp32_max_abs']:.3g}"
        )
    print("wrote", write_results("gpu_check", results, f"{device.type}_{args.max_tokens}_tokens"))


if __name__ == "__main__":
    main()
