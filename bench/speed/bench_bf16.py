"""bfloat16 against float32 on this CPU, side by side: matrix products, a training step, generate() and CTranslate2.

    python -m bench bf16 --model runs/multi30k-small --repetitions 3
    python -m bench bf16 --parts cpu training profile loop --results training   # training in bf16

- "cpu": whether the CPU has bfloat16 units (AVX512-BF16, AMX: `hf_vanilla_transformer.hardware`) and 2048x2048
  matrix products per second in each dtype, on torch's threads.
- "training": training steps (forward, backward, fused Adam) of the `small` and `base` presets on the same
  --batches Multi30k batches (8) of <= --max_tokens tokens (the main job's 1,024), each way of running them in turn
  (interleaved), medians of --repetitions; target tokens per second and the ratio to float32 (`TRAINING_OPTIONS`).
- "profile": torch.profiler over float32 and the default bf16 step (autocast, eager attention) of `small`: CPU
  milliseconds a batch by kind of operator (bench_profile_models' kinds, and copies: autocast's casts).
- "loop": the main job's recipe through `run_translation.py` for --loop_steps steps (no evaluation, no averaging),
  with --bf16 false and true in turn, --repetitions times; training steps per second of the Trainer's own
  clock (`train_results.json`), medians. The whole loop: batching, collation, the label-smoothed loss,
  checkpoints. With --loop_baseline CHECKOUT, that checkout's loop (its own code, the same recipe) runs in turn
  with this one's: `git worktree add ../before HEAD~1` (beside this checkout: it reads ../shared) measures a change.
- "generate" and "ctranslate2": the trained model (--model) translates the 1,000 Multi30k test sources as
  vanilla-translate does (batch 64, the model's decoding): generate() with the model loaded in float32 and in
  bfloat16, and the model exported to CTranslate2 (float32) run with compute types float32, bfloat16, int8 and
  int8_bfloat16 where this CPU's CTranslate2 offers them (its CPU build has no bfloat16 kernels); each
  measurement in a process of its own, in turn within each repetition; sentences/s, BLEU
  (sacreBLEU 13a) and how many translations differ from float32's.
Writes bench/results/bf16/DATE[_LABEL].json (--results LABEL).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import ctranslate2
import sacrebleu
import torch
from accelerate.utils import compile_regions

from bench.helpers.common import (
    PROFILE_CATEGORIES,
    REPO_ROOT,
    add_repetitions,
    add_results_label,
    hf_loss,
    in_own_process,
    interleaved_medians,
    machine,
    matmul_rate,
    multi30k_batches,
    multi30k_pairs,
    paper_adam,
    step_function,
    write_results,
)
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.export.ctranslate2 import export
from hf_vanilla_transformer.hardware import cpu_has_bf16_units
from hf_vanilla_transformer.model.modeling_vanilla_transformer import VanillaTransformerDropout


def autocast_loss(model, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return hf_loss(model, batch)


def bf16_weights_step(model, batches):
    """The model in bfloat16 throughout (no autocast: no casts in the step), float32 master copies of the weights
    that Adam updates and copies back: mixed precision as Micikevicius et al. (2018) train, without loss scaling,
    which bfloat16's range does not need."""
    model.to(torch.bfloat16).train()
    weights = list(model.parameters())
    masters = [weight.detach().float().requires_grad_() for weight in weights]
    optimizer = paper_adam(masters)

    def run():
        for batch in batches:
            hf_loss(model, batch).backward()
            for weight, master in zip(weights, masters, strict=True):
                master.grad, weight.grad = weight.grad.float(), None
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for weight, master in zip(weights, masters, strict=True):
                    weight.copy_(master)

    return run


def bf16_matrix_products(run):
    """`run` with float32 matrix products computed in bfloat16 by oneDNN: torch's public precision setting,
    the CPU's counterpart of TF32 on GPUs; the model, its activations and gradients stay float32."""

    def run_in_bf16_products():
        before = torch.backends.mkldnn.matmul.fp32_precision
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        try:
            run()
        finally:
            torch.backends.mkldnn.matmul.fp32_precision = before

    return run_in_bf16_products


# name: (attention implementation, how the step runs, torch.compile, whose dropout masks). "autocast" is what the
# Trainer's --bf16 does on a CPU; "bf16 weights" is `bf16_weights_step`; "bf16 products", `bf16_matrix_products`;
# "nn.Dropout" swaps the model's dropout for torch's own (`with_torch_dropout`).
TRAINING_OPTIONS = {
    "float32": ("sdpa", "float32", False, "ours"),
    "float32, nn.Dropout's masks": ("sdpa", "float32", False, "nn.Dropout"),
    "float32, compiled": ("sdpa", "float32", True, "ours"),
    "float32, matrix products in bf16 (oneDNN)": ("sdpa", "bf16 products", False, "ours"),
    "float32, matrix products in bf16 (oneDNN), eager attention": ("eager", "bf16 products", False, "ours"),
    "bf16 autocast (sdpa)": ("sdpa", "autocast", False, "ours"),
    "bf16 autocast, eager attention": ("eager", "autocast", False, "ours"),
    "bf16 autocast, eager attention, nn.Dropout's masks": ("eager", "autocast", False, "nn.Dropout"),
    "bf16 autocast, eager attention, compiled": ("eager", "autocast", True, "ours"),
    "bf16 autocast, eager attention, regional compile": ("eager", "autocast", "regions", "ours"),
    "bf16 weights, float32 master copies, eager attention": ("eager", "bf16 weights", False, "ours"),
}


def with_torch_dropout(model):
    """The model with each of its dropout modules replaced by torch's `nn.Dropout` of the same p."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, VanillaTransformerDropout):
                setattr(module, name, torch.nn.Dropout(child.p))
    return model


def training_candidate(config, batches, option: str):
    attention, arithmetic, compiled, dropout = TRAINING_OPTIONS[option]
    model = VanillaTransformerForConditionalGeneration(config)
    model.set_attn_implementation(attention)
    if dropout == "nn.Dropout":
        with_torch_dropout(model)
    if compiled == "regions":
        model = compile_regions(model)  # accelerate's: each repeated layer compiled once, the rest on its own
    elif compiled:
        model.compile()  # as the Trainer's --torch_compile: the forward, in place
    if arithmetic == "bf16 weights":
        return bf16_weights_step(model, batches)
    if arithmetic == "bf16 products":
        return bf16_matrix_products(step_function(model, batches, hf_loss))
    return step_function(model, batches, autocast_loss if arithmetic == "autocast" else hf_loss)


def training_figures(
    presets: list[str], options: list[str], batch_count: int, max_tokens: int, repetitions: int
) -> dict:
    figures = {}
    for preset in presets:
        batches, tokenizer = multi30k_batches(batch_count, max_tokens)
        config = VanillaTransformerConfig.from_preset(preset, vocab_size=len(tokenizer))
        candidates = {}
        for option in ["float32", *(option for option in options if option != "float32")]:
            torch.manual_seed(0)
            candidates[option] = training_candidate(config, batches, option)
            start = time.perf_counter()
            candidates[option]()  # warm-up: compilation, first-touch allocations
            print(f"{preset}, {option}: warm-up {time.perf_counter() - start:.1f} s", flush=True)
        medians = interleaved_medians(candidates, repetitions)
        tokens = sum(int((b["labels"] != -100).sum()) for b in batches)
        rates = {name: tokens / seconds for name, seconds in medians.items()}
        figures[preset] = {
            name: {"target_tokens_per_second": round(rate), "over_float32": round(rate / rates["float32"], 3)}
            for name, rate in rates.items()
        }
        for name, figure in figures[preset].items():
            print(f"training step, {preset}, {name}: {figure}", flush=True)
    return figures


PROFILED = ("float32", "bf16 autocast, eager attention")
KINDS = {**PROFILE_CATEGORIES, "copies (autocast's casts among them)": lambda name: name == "aten::copy_"}


def profile_figures(max_tokens: int) -> dict:
    batches, tokenizer = multi30k_batches(8, max_tokens)
    config = VanillaTransformerConfig.from_preset("small", vocab_size=len(tokenizer))
    figures = {}
    for option in PROFILED:
        torch.manual_seed(0)
        run = training_candidate(config, batches, option)
        run()  # warm-up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            run()
        events = profiler.key_averages()
        per_batch = {
            kind: sum(event.self_cpu_time_total for event in events if matches(event.key)) / 1e3 / len(batches)
            for kind, matches in KINDS.items()
        }
        total = sum(event.self_cpu_time_total for event in events) / 1e3 / len(batches)
        per_batch["everything else"] = total - sum(per_batch.values())
        per_batch["total"] = total
        figures[option] = {kind: round(ms, 1) for kind, ms in per_batch.items()}
        print(f"profile, small, {option}: CPU ms a batch {figures[option]}", flush=True)
    return figures


def loop_figures(steps: int, repetitions: int, baseline: str | None = None) -> dict:
    """The loop's steps per second in float32 and bfloat16; with `baseline` (another checkout of this repository),
    that checkout's loop too, each of the four runs in turn within a repetition."""
    checkouts = {"": REPO_ROOT} | ({"baseline, ": os.path.abspath(baseline)} if baseline else {})
    runs = {f"{label}{name}": [] for label in checkouts for name in ("float32", "bfloat16")}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(repetitions):
            for label, root in checkouts.items():
                for name, flag in (("float32", "false"), ("bfloat16", "true")):
                    output = os.path.join(folder, "run")
                    flags = f"--bf16 {flag} --max_steps {steps} --do_eval false --do_predict false"
                    flags += " --average_last_checkpoints 1 --disable_tqdm true --overwrite_output_dir true"
                    command = [sys.executable, "run_translation.py", "recipes/multi30k_small.yaml", *flags.split()]
                    command += ["--output_dir", output]
                    # in the checkout's folder, Python imports the checkout's package (the script's folder comes first)
                    subprocess.run(command, cwd=root, check=True, capture_output=True)
                    with open(os.path.join(output, "train_results.json")) as results:
                        runs[label + name].append(json.load(results)["train_steps_per_second"])
                    print(f"loop, {label}{name}: {runs[label + name][-1]} steps/s", flush=True)
    medians = {name: statistics.median(rates) for name, rates in runs.items()}
    figures = {"steps": steps, "steps_per_second": runs, "median_steps_per_second": medians}
    for label in checkouts:
        figures[f"{label}bf16_over_fp32"] = round(medians[f"{label}bfloat16"] / medians[f"{label}float32"], 3)
    if baseline:
        figures["baseline"] = baseline
        for name in ("float32", "bfloat16"):
            figures[f"{name}_over_baseline"] = round(medians[name] / medians[f"baseline, {name}"], 3)
    return figures


def translation_figures(model: str, repetitions: int) -> dict:
    pairs = multi30k_pairs()
    references = [target for _, target in pairs]
    with tempfile.TemporaryDirectory() as folder:
        exported = export(model, f"{folder}/ctranslate2", "float32")
        # CTranslate2 builds its bfloat16 kernels for GPUs only: on a CPU it refuses the compute type outright
        supported = ctranslate2.get_supported_compute_types("cpu")
        systems = {
            "generate() float32": ("generate", model, "float32"),
            "generate() bfloat16": ("generate", model, "bfloat16"),
            **{
                f"CTranslate2 {compute_type}": ("ctranslate2", exported, compute_type)
                for compute_type in ("float32", "bfloat16", "int8", "int8_bfloat16")
                if compute_type in supported
            },
        }
        print("CTranslate2 compute types on this CPU:", sorted(supported))
        runs = {name: [] for name in systems}
        for _ in range(repetitions):
            for name, (system, path, compute_type) in systems.items():
                runs[name].append(
                    in_own_process(
                        "bench.speed.bench_ctranslate2", "translate", system, path, 64, len(pairs), compute_type
                    )
                )
    figures = {}
    for name, measured in runs.items():
        seconds = statistics.median(run["seconds"] for run in measured)
        output = measured[0]["translations"]
        baseline = "generate() float32" if name.startswith("generate") else "CTranslate2 float32"
        figures[name] = {
            "sentences_per_second": round(len(pairs) / seconds, 1),
            "speedup_over_float32": round(statistics.median(r["seconds"] for r in runs[baseline]) / seconds, 3),
            "bleu": round(sacrebleu.corpus_bleu(output, [references]).score, 2),
            "translations_unlike_float32": sum(
                mine != theirs for mine, theirs in zip(output, runs[baseline][0]["translations"], strict=True)
            ),
        }
        print(f"{name:<28} {figures[name]}")
    figures["ctranslate2_cpu_compute_types"] = sorted(supported)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/multi30k-small", help="A trained model folder (the main job's).")
    add_repetitions(parser, 3)
    parser.add_argument("--presets", nargs="+", default=["small", "base"])
    parts = ["cpu", "training", "profile", "loop", "translation"]
    parser.add_argument("--parts", nargs="+", default=["cpu", "training", "translation"], choices=parts)
    parser.add_argument("--options", nargs="+", default=list(TRAINING_OPTIONS), choices=list(TRAINING_OPTIONS))
    parser.add_argument("--max_tokens", type=int, default=1024, help="Token budget of a training batch.")
    parser.add_argument("--batches", type=int, default=8, help="Distinct training batches (shapes) a step cycles.")
    parser.add_argument("--loop_steps", type=int, default=300, help="Steps of each run of the main job's loop.")
    parser.add_argument(
        "--loop_baseline", help="Another checkout of this repository whose loop runs in turn with this one's."
    )
    add_results_label(parser)
    args = parser.parse_args()
    results = {"machine": machine(), "bf16_units": cpu_has_bf16_units(), "repetitions": args.repetitions}
    if "cpu" in args.parts:
        rates = {str(dtype).removeprefix("torch."): matmul_rate(dtype) for dtype in (torch.float32, torch.bfloat16)}
        results["matmul_tflops"] = {name: round(rate / 1e12, 3) for name, rate in rates.items()}
        print("matmul TFLOP/s:", results["matmul_tflops"], "bf16 units:", results["bf16_units"])
    if "training" in args.parts:
        results["max_tokens"], results["batches"] = args.max_tokens, args.batches
        results["onednn_primitive_cache_capacity"] = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "default")
        results["training_step"] = training_figures(
            args.presets, args.options, args.batches, args.max_tokens, args.repetitions
        )
    if "profile" in args.parts:
        results["profile_small"] = profile_figures(args.max_tokens)
    if "loop" in args.parts:
        results["loop"] = loop_figures(args.loop_steps, args.repetitions, args.loop_baseline)
    if "translation" in args.parts:
        results["translation"] = translation_figures(args.model, args.repetitions)
    print("wrote", write_results("bf16", results, args.results))


if __name__ == "__main__":
    main()
