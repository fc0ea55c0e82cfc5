"""CPU translation side by side: our generate(), our model on CTranslate2 (float32, int8), and MarianMTModel of the
same size on CTranslate2 (converted by CTranslate2's own transformers converter).

    python -m bench.bench_ctranslate2 --model runs/multi30k-small --repetitions 3

Two modes, each at batch 64 and batch 1, repetitions interleaved (medians):
- "translate": the trained model translates the 1,000 Multi30k test sources as vanilla-translate does (sorted by
  length, beam 4, length penalty 0.6, at most source length + 50 tokens), through `generate()` and through our
  CTranslate2 exports; sentences/s, target tokens/s, BLEU (sacreBLEU 13a against the references).
- "fixed length": every system writes exactly --new_tokens tokens per sentence at beam 4, so that our export and an
  untrained MarianMTModel of the same shape (no trained Marian of this size exists here) do equal work.
Peak RSS is measured for each system in its own process translating the 1,000 sources once at batch 64.
Writes bench/results/ctranslate2.json.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import sacrebleu

from bench.common import MULTI30K, machine, marian_like, run_with_peak_rss, write_results
from hf_vanilla_transformer.data import read_translation_file
from hf_vanilla_transformer.export_ctranslate2 import export
from hf_vanilla_transformer.translate import CTranslate2Translator, PipelineTranslator, read_lines, translate_lines

QUANTIZATIONS = ("float32", "int8")


def marian_exports(model_path: str, folder: str) -> dict[str, str]:
    """An untrained MarianMTModel of our model's shape, converted by CTranslate2's own converter."""
    from ctranslate2.converters import TransformersConverter
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from hf_vanilla_transformer.loading import load_model_and_tokenizer

    ours, tokenizer = load_model_and_tokenizer(model_path, "cpu")
    # Marian's vocabularies end with <pad>, which CTranslate2's Marian converter drops (Marian's decoder starts from
    # a zero embedding instead): the same tokens as ours, <pad> moved last
    tokens = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    tokens = [token for token in tokens if token != tokenizer.pad_token] + [tokenizer.pad_token]
    vocab = {token: index for index, token in enumerate(tokens)}
    marian_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token=tokenizer.unk_token)),
        bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token, unk_token=tokenizer.unk_token,
        pad_token=tokenizer.pad_token,
    )  # fmt: skip
    marian = marian_like(
        ours.config, pad_token_id=vocab[tokenizer.pad_token], eos_token_id=vocab[tokenizer.eos_token],
        decoder_start_token_id=vocab[tokenizer.pad_token],
    )  # fmt: skip
    source = os.path.join(folder, "marian")
    marian.save_pretrained(source)
    marian_tokenizer.save_pretrained(source)
    exports = {}
    for quantization in QUANTIZATIONS:
        exports[quantization] = os.path.join(folder, f"marian-{quantization}")
        TransformersConverter(source).convert(exports[quantization], quantization=quantization)
    return exports


def ctranslate2_fixed_length(folder: str, sources: list[list[str]], batch_size: int, new_tokens: int):
    """Beam 4, exactly `new_tokens` tokens a sentence, threads as vanilla-translate sets them on this CPU."""
    import ctranslate2

    translator = ctranslate2.Translator(folder, device="cpu", inter_threads=os.cpu_count(), intra_threads=1)

    def run():
        translator.translate_batch(
            sources, beam_size=4, length_penalty=0.6, min_decoding_length=new_tokens,
            max_decoding_length=new_tokens, max_batch_size=batch_size,
        )  # fmt: skip

    return run


def worker(kind: str, model: str, sources_file: str) -> None:
    """Translate the sources once at batch 64 (the parent measures this process's peak RSS)."""
    sources = read_lines(sources_file)
    translator = PipelineTranslator(model, "cpu") if kind == "generate" else CTranslate2Translator(model, "cpu")
    translate_lines(translator, sources, 64, {}, show_progress=False)


def interleaved(candidates: dict, repetitions: int) -> dict[str, float]:
    seconds = {name: [] for name in candidates}
    for _ in range(repetitions):
        for name, run in candidates.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/multi30k-small")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--batch1_sentences", type=int, default=200, help="Sources translated one at a time.")
    parser.add_argument("--new_tokens", type=int, default=20)
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "SOURCES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.model, args.worker[1])
        return

    pairs = list(read_translation_file(os.path.join(MULTI30K, "test.jsonl"), "en", "de"))
    sources, references = [source for source, _ in pairs], [[target for _, target in pairs]]
    with tempfile.TemporaryDirectory() as folder:
        ours = {q: export(args.model, os.path.join(folder, f"ours-{q}"), q) for q in QUANTIZATIONS}
        marian = marian_exports(args.model, folder)
        systems = {
            "ours generate()": PipelineTranslator(args.model, "cpu"),
            **{f"ours CTranslate2 {q}": CTranslate2Translator(ours[q], "cpu") for q in QUANTIZATIONS},
        }
        tokenizer = systems["ours generate()"].tokenizer
        results = {"machine": machine(), "model": args.model, "sentences": len(sources), "translate": {},
                   "fixed_length": {}}  # fmt: skip

        translations = {}
        for batch_size, count in ((64, len(sources)), (1, args.batch1_sentences)):

            def run(translator, batch_size=batch_size, count=count):
                def translate():
                    translations[(translator, batch_size)] = translate_lines(
                        translator, sources[:count], batch_size, {}, show_progress=False
                    )

                return translate

            medians = interleaved({name: run(t) for name, t in systems.items()}, args.repetitions)
            for name, translator in systems.items():
                output = translations[(translator, batch_size)]
                target_tokens = sum(len(ids) for ids in tokenizer(output)["input_ids"])
                figures = {
                    "sentences_per_second": round(count / medians[name], 2),
                    "target_tokens_per_second": round(target_tokens / medians[name], 1),
                    "speedup_over_generate": round(medians["ours generate()"] / medians[name], 2),
                }
                if batch_size == 64:
                    figures["bleu"] = round(sacrebleu.corpus_bleu(output, references).score, 2)
                results["translate"][f"{name}, batch {batch_size}"] = figures
                print(f"{name}, batch {batch_size}: {figures}", flush=True)

        for batch_size, count in ((64, len(sources)), (1, args.batch1_sentences)):
            ordered = sorted(sources[:count], key=len, reverse=True)
            tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(ordered)["input_ids"]]
            runs = {
                f"{system} CTranslate2 {q}": ctranslate2_fixed_length(exports[q], tokens, batch_size, args.new_tokens)
                for system, exports in (("ours", ours), ("Marian", marian))
                for q in QUANTIZATIONS
            }
            medians = interleaved(runs, args.repetitions)
            for q in QUANTIZATIONS:
                ratio = medians[f"Marian CTranslate2 {q}"] / medians[f"ours CTranslate2 {q}"]
                for name in (f"ours CTranslate2 {q}", f"Marian CTranslate2 {q}"):
                    figures = {"sentences_per_second": round(count / medians[name], 2),
                               "ours_over_marian": round(ratio, 3)}  # fmt: skip
                    results["fixed_length"][f"{name}, batch {batch_size}"] = figures
                    print(f"fixed length, {name}, batch {batch_size}: {figures}", flush=True)

        sources_file = os.path.join(folder, "test.en")
        with open(sources_file, "w", encoding="utf-8") as file:
            file.writelines(source + "\n" for source in sources)
        results["peak_rss_mib"] = {}
        for name, kind, model in (
            ("ours generate()", "generate", args.model),
            *((f"ours CTranslate2 {q}", "ctranslate2", ours[q]) for q in QUANTIZATIONS),
        ):
            command = [sys.executable, "-m", "bench.bench_ctranslate2", "--model", model, "--worker", kind,
                       sources_file]  # fmt: skip
            result, peak = run_with_peak_rss(command)
            if result.returncode != 0:
                raise subprocess.CalledProcessError(result.returncode, command, stderr=result.stderr)
            results["peak_rss_mib"][name] = round(peak / 2**20, 1)
        print(results["peak_rss_mib"])
    print("wrote", write_results("ctranslate2", results))


if __name__ == "__main__":
    main()
