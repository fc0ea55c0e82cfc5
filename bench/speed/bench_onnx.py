"""Greedy CPU translation of one trained model by every runtime we export to, side by side: our generate(), ONNX
Runtime (float32, int8), CTranslate2 (int8) and transformers.js in Node (float32, int8).

    python -m bench onnx --model runs/multi30k-small --repetitions 3

The 1,000 Multi30k test sources, greedy, each sentence within its source length + 50 tokens. Python systems
translate as vanilla-translate does (sorted by length, batches of 64); transformers.js a sentence at a time
(demo/web/translate.mjs, as the page does), timed as the whole Node process minus the same process on one
sentence (start-up and loading). Each measurement runs in a process of its own, the systems in turn within each
repetition; medians. Threads: each engine's default on a CPU (torch 2, ONNX Runtime every core, CTranslate2 a batch
per core). Reports sentences/s, BLEU (sacreBLEU 13a against the references), translations unlike generate()'s and
each folder's size; writes bench/results/onnx/DATE.json.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import sacrebleu

from bench.helpers.common import REPO_ROOT, add_repetitions, in_own_process, machine, multi30k_pairs, write_results
from hf_vanilla_transformer.engines.ctranslate2 import CTranslate2Translator
from hf_vanilla_transformer.engines.generate import ModelTranslator
from hf_vanilla_transformer.engines.onnx import OnnxTranslator
from hf_vanilla_transformer.export import ctranslate2 as export_ctranslate2
from hf_vanilla_transformer.export import onnx as export_onnx
from hf_vanilla_transformer.translation.lines import translate_lines

BATCH_SIZE = 64
NODE_SCRIPT = os.path.join(REPO_ROOT, "demo", "web", "translate.mjs")


def python_worker(system: str, folder: str) -> dict:
    """One measurement in a process of its own: loads, warms up on one batch, times the 1,000 sources."""
    sources = [source for source, _ in multi30k_pairs()]
    if system == "generate":
        translator = ModelTranslator(folder, "cpu", dtype=None)
    elif system == "ctranslate2":
        translator = CTranslate2Translator(folder, "cpu")
    else:
        translator = OnnxTranslator(folder, quantized=system == "onnxruntime-int8")
    options = {"num_beams": 1} if system in ("generate", "ctranslate2") else {}
    translate_lines(translator, sources[:BATCH_SIZE], BATCH_SIZE, options, show_progress=False)
    start = time.perf_counter()
    translations = translate_lines(translator, sources, BATCH_SIZE, options, show_progress=False)
    return {
        "seconds": time.perf_counter() - start,
        "translations": translations,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def node_run(folder: str, dtype: str, sources: list[str]) -> tuple[float, list[str]]:
    start = time.perf_counter()
    result = subprocess.run(
        ["node", NODE_SCRIPT, folder, dtype], input="\n".join(sources) + "\n", capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return time.perf_counter() - start, result.stdout.splitlines()


def node_measurement(folder: str, dtype: str) -> dict:
    sources = [source for source, _ in multi30k_pairs()]
    fixed, _ = node_run(folder, dtype, sources[:1])
    seconds, translations = node_run(folder, dtype, sources)
    return {"seconds": seconds - fixed, "translations": translations, "start_and_load_seconds": fixed}


def folder_mib(path: str, names: list[str] | None = None) -> float:
    files = [os.path.join(root, name) for root, _, found in os.walk(path) for name in found]
    if names is not None:
        files = [file for file in files if os.path.basename(file) in names]
    return round(sum(map(os.path.getsize, files)) / 2**20, 1)


def measure(args, work: str) -> tuple[dict, dict]:
    """The exports written into `work`, each system measured in turn --repetitions times; the runs and the sizes."""
    onnx_folder = export_onnx.export(args.model, os.path.join(work, "onnx"))
    ct2_folder = export_ctranslate2.export(args.model, os.path.join(work, "ct2-int8"), "int8")
    systems = {
        "ours generate()": lambda: in_own_process("bench.speed.bench_onnx", "generate", args.model),
        "ONNX Runtime float32": lambda: in_own_process("bench.speed.bench_onnx", "onnxruntime-float32", onnx_folder),
        "ONNX Runtime int8": lambda: in_own_process("bench.speed.bench_onnx", "onnxruntime-int8", onnx_folder),
        "CTranslate2 int8": lambda: in_own_process("bench.speed.bench_onnx", "ctranslate2", ct2_folder),
        "transformers.js float32 (Node)": lambda: node_measurement(onnx_folder, "fp32"),
        "transformers.js int8 (Node)": lambda: node_measurement(onnx_folder, "q8"),
    }
    runs = {name: [] for name in systems}
    for repetition in range(args.repetitions):
        for name, run_once in systems.items():
            runs[name].append(run_once())
            print(f"repetition {repetition + 1}: {name} {runs[name][-1]['seconds']:.1f} s", file=sys.stderr)
    onnx_graphs = os.path.join(onnx_folder, "onnx")
    sizes = {
        "ours (safetensors)": folder_mib(args.model, ["model.safetensors"]),
        "ONNX float32 (both graphs)": folder_mib(onnx_graphs, ["encoder_model.onnx", "decoder_model_merged.onnx"]),
        "ONNX int8": folder_mib(onnx_graphs, ["encoder_model_quantized.onnx", "decoder_model_merged_quantized.onnx"]),
        "CTranslate2 int8 (model.bin)": folder_mib(ct2_folder, ["model.bin"]),
    }
    return runs, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="A trained model folder (run_translation.py).")
    add_repetitions(parser, 3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(python_worker(*json.loads(args.worker))))
        return
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as work:  # the exports go once measured
        runs, sizes = measure(args, work)
    references = [target for _, target in multi30k_pairs()]
    generated = runs["ours generate()"][0]["translations"]
    medians = {name: statistics.median(run["seconds"] for run in measured) for name, measured in runs.items()}
    figures = {}
    for name, measured in runs.items():
        output = measured[0]["translations"]
        figures[name] = {
            "sentences_per_second": round(len(references) / medians[name], 2),
            "speed_over_generate": round(medians["ours generate()"] / medians[name], 2),
            "bleu": round(sacrebleu.corpus_bleu(output, [references]).score, 2),
            "translations_unlike_generate": sum(mine != theirs for mine, theirs in zip(output, generated, strict=True)),
            "seconds": [round(run["seconds"], 2) for run in measured],
        }
    bleu = sacrebleu.BLEU()
    bleu.corpus_score(generated, [references])
    signature = str(bleu.get_signature())
    path = write_results(
        "onnx",
        {
            "machine": machine(),
            "model": args.model,
            "repetitions": args.repetitions,
            "batch_size": BATCH_SIZE,
            "bleu_signature": signature,
            "figures": figures,
            "sizes_mib": sizes,
        },
    )
    print(json.dumps({"figures": figures, "sizes_mib": sizes}, indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
