"""CPU translation side by side: our generate(), our model on CTranslate2 (float32, int8), and MarianMTModel of the
same size on CTranslate2 (converted by CTranslate2's own transformers converter).

    python -m bench ctranslate2 --model runs/multi30k-small --repetitions 3

Two modes, each at batch 64 and batch 1:
- "translate": the trained model translates the 1,000 Multi30k test sources as vanilla-translate does (sorted by
  length, decoding as its generation config says: for the main job beam 4, length penalty 1.0, at most source
  length + 50 tokens), through `generate()` and through our
  CTranslate2 exports, and so does a MarianMTModel of our size trained on the same data for the same 24 minutes
  (--marian, converted by CTranslate2's converter, with its own tokenizer); sentences/s, target tokens/s (the
  output's tokens in our tokenizer, one yardstick for all), BLEU (sacreBLEU 13a against the references), and for
  our exports how many translations differ from generate()'s.
- "fixed length": every system writes exactly --new_tokens tokens per sentence at beam 4, so that our exports and
  an untrained MarianMTModel of the same shape and the same token strings do equal work. These are measured side by
  side in one process (CTranslate2 only, no torch), chunk by chunk in rotating order, --repetitions passes over the
  1,000 sources. Each export is loaded twice: the two copies' ratio shows the measurement floor, and each
  figure is the mean of the two.
"translate" measurements run each in a process of their own (idle threads of one engine would slow another in a
shared process), the systems in turn within each repetition; medians of --repetitions. Threads: torch's default
(2 here) for generate(), CTranslate2 as vanilla-translate sets it on a CPU (a batch per core, one thread each).
Peak RSS is each measuring process's (`ru_maxrss`). Writes bench/results/ctranslate2/DATE.json.
"""

import argparse
import copy
import json
import os
import resource
import shutil
import statistics
import tempfile
import time

import sacrebleu
import torch

from bench.helpers.common import add_repetitions, in_own_process, machine, marian_like, multi30k_pairs, write_results
from hf_vanilla_transformer.engines.ctranslate2 import CTranslate2Translator
from hf_vanilla_transformer.engines.generate import ModelTranslator
from hf_vanilla_transformer.export.ctranslate2 import CARRIED_FILES, export
from hf_vanilla_transformer.loading import load_tokenizer
from hf_vanilla_transformer.translation.lines import translate_lines

WORKER_MODULE = "bench.speed.bench_ctranslate2"
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
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        unk_token=tokenizer.unk_token,
        pad_token=tokenizer.pad_token,
    )
    shape = copy.deepcopy(ours.config)
    shape.pad_token_id = shape.decoder_start_token_id = vocab[tokenizer.pad_token]
    shape.eos_token_id = vocab[tokenizer.eos_token]
    marian = marian_like(shape)
    source = os.path.join(folder, "marian")
    marian.save_pretrained(source)
    marian_tokenizer.save_pretrained(source)
    exports = {}
    for quantization in QUANTIZATIONS:
        exports[quantization] = os.path.join(folder, f"marian-{quantization}")
        TransformersConverter(source).convert(exports[quantization], quantization=quantization)
        for name in CARRIED_FILES:  # our tokenizer gives the same token strings; the bench feeds tokens
            shutil.copy(os.path.join(model_path, name), exports[quantization])
    return exports


def with_pad_last(marian_path: str, folder: str) -> str:
    """`marian_path` (a MarianMTModel whose <pad> is token 0, as `bench_stock_marian_translation` trains it) with
    <pad> moved to the end of the vocabulary, where CTranslate2's Marian converter expects it (OPUS-MT's layout:
    it drops the last row, as Marian starts decoding from a zero embedding). The same function: the embedding rows
    and the output bias are permuted as the token ids are."""
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(marian_path)
    pad, size = model.config.pad_token_id, model.config.vocab_size
    if pad != 0:
        raise ValueError(f"{marian_path}: <pad> is token {pad}, not 0")
    order = torch.cat([torch.arange(1, size), torch.tensor([0])])  # new id i holds old id order[i]
    with torch.no_grad():
        model.model.shared.weight.copy_(model.model.shared.weight[order])
        model.final_logits_bias.copy_(model.final_logits_bias[:, order])
    new_id = {old: new for new, old in enumerate(order.tolist())}
    for config in (model.config, model.generation_config):
        for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id"):
            if isinstance(getattr(config, name, None), int):
                setattr(config, name, new_id[getattr(config, name)])
    output = os.path.join(folder, "trained-marian-pad-last")
    model.save_pretrained(output)
    with open(os.path.join(marian_path, "tokenizer.json"), encoding="utf-8") as file:
        tokenizer = json.load(file)
    tokenizer["model"]["vocab"] = {token: new_id[index] for token, index in tokenizer["model"]["vocab"].items()}
    for token in tokenizer["added_tokens"]:
        token["id"] = new_id[token["id"]]
    for special in tokenizer["post_processor"]["special_tokens"].values():
        special["ids"] = [new_id[index] for index in special["ids"]]
    with open(os.path.join(output, "tokenizer.json"), "w", encoding="utf-8") as file:
        json.dump(tokenizer, file, ensure_ascii=False)
    shutil.copy(os.path.join(marian_path, "tokenizer_config.json"), output)
    return output


def trained_marian_exports(marian_path: str, model_path: str, folder: str) -> dict[str, str]:
    """A trained MarianMTModel of our size (`bench_stock_marian_translation`'s), converted by CTranslate2's own
    converter, with its own tokenizer and our model's decoding settings (its generation config)."""
    from ctranslate2.converters import TransformersConverter

    source = with_pad_last(marian_path, folder)
    exports = {}
    for quantization in QUANTIZATIONS:
        exports[quantization] = os.path.join(folder, f"trained-marian-{quantization}")
        TransformersConverter(source).convert(exports[quantization], quantization=quantization)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(source, name), exports[quantization])
        # CTranslate2Translator reads only the decoding settings from it
        shutil.copy(os.path.join(model_path, "generation_config.json"), exports[quantization])
    return exports


def translate_worker(system: str, folder: str, batch_size: int, count: int, compute_type: str | None = None) -> dict:
    """One "translate" measurement in a process of its own: idle threads of one engine (CTranslate2's workers,
    torch's pool) must not slow another down. Loads (generate(): in the torch dtype `compute_type` names, CTranslate2:
    with that compute type; default: as saved), warms up on one batch, then times the translation of the first
    `count` sources; reports seconds, the translations and this process's peak RSS."""
    sources = [source for source, _ in multi30k_pairs()][:count]
    if system == "generate":
        translator = ModelTranslator(folder, "cpu", dtype=compute_type)
    else:
        translator = CTranslate2Translator(folder, "cpu", compute_type=compute_type or "default")
    translate_lines(translator, sources[:batch_size], batch_size, {}, show_progress=False)
    start = time.perf_counter()
    translations = translate_lines(translator, sources, batch_size, {}, show_progress=False)
    return {
        "seconds": time.perf_counter() - start,
        "translations": translations,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def fixed_length_worker(folders: dict[str, str], batch_size: int, new_tokens: int, passes: int) -> dict:
    """Equal work side by side in one process: every system writes exactly `new_tokens` tokens for each of the test
    sources (our token strings, longest first) at beam 4. The sources are cut into chunks of one call each (a
    batch per CTranslate2 worker); each chunk is translated by every system in turn, the order rotating from
    chunk to chunk, so that a slow moment of a shared machine falls on all alike. Reports each system's wall and
    CPU seconds in all, and its seconds per chunk."""
    translators = {name: CTranslate2Translator(folder, "cpu") for name, folder in folders.items()}
    tokenizer = next(iter(translators.values())).tokenizer
    ordered = sorted((source for source, _ in multi30k_pairs()), key=len, reverse=True)
    tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(ordered)["input_ids"]]
    size = batch_size * next(iter(translators.values())).batches_per_call
    chunks = [tokens[start : start + size] for start in range(0, len(tokens), size)]

    def run(name, selection):
        translators[name].translator.translate_batch(
            selection,
            beam_size=4,
            length_penalty=0.6,
            min_decoding_length=new_tokens,
            max_decoding_length=new_tokens,
            max_batch_size=batch_size,
        )

    names = list(translators)
    for name in names:
        run(name, chunks[0])
    wall, cpu, per_chunk = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0), {name: [] for name in names}
    for turn, selection in enumerate(chunks * passes):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            started, cpu_started = time.perf_counter(), time.process_time()
            run(name, selection)
            per_chunk[name].append(time.perf_counter() - started)
            wall[name] += per_chunk[name][-1]
            cpu[name] += time.process_time() - cpu_started
    return {"sentences": len(tokens) * passes, "wall_seconds": wall, "cpu_seconds": cpu, "chunk_seconds": per_chunk}


WORKERS = {"translate": translate_worker, "fixed_length": fixed_length_worker}


def translate_figures(args, exports: dict[str, tuple[str, str]], batch_size: int, references: list[str]) -> dict:
    """Each system in a process of its own, in turn within each repetition; medians."""
    count = len(references) if batch_size > 1 else args.batch1_sentences
    runs = {name: [] for name in exports}
    for _ in range(args.repetitions):
        for name, (system, folder) in exports.items():
            runs[name].append(in_own_process(WORKER_MODULE, "translate", system, folder, batch_size, count))
    medians = {name: statistics.median(run["seconds"] for run in runs[name]) for name in runs}
    tokenizer = load_tokenizer(args.model)
    figures = {}
    for name, measured in runs.items():
        output = measured[0]["translations"]
        figures[name] = {
            "sentences_per_second": round(count / medians[name], 2),
            "target_tokens_per_second": round(sum(map(len, tokenizer(output)["input_ids"])) / medians[name], 1),
            "speedup_over_generate": round(medians["ours generate()"] / medians[name], 2),
            "bleu": round(sacrebleu.corpus_bleu(output, [references[:count]]).score, 2),
            "peak_rss_mib": round(max(run["peak_rss_mib"] for run in measured), 1),
        }
        if name.startswith("ours CTranslate2"):
            # the same model decoded the same way: beam searches that stop differently show up here
            figures[name]["translations_unlike_generate"] = sum(
                mine != theirs for mine, theirs in zip(output, runs["ours generate()"][0]["translations"], strict=True)
            )
            if name.replace("ours", "Marian") in medians:
                figures[name]["ours_over_marian"] = round(medians[name.replace("ours", "Marian")] / medians[name], 3)
    return figures


def fixed_length_figures(args, exports: dict[str, str], batch_size: int) -> dict:
    """Per system, the mean over its copies (a name and the same name + ", again": the same export loaded twice);
    ours against Marian in the same mode; and, for systems loaded twice, the second copy against the first."""
    measured = in_own_process(WORKER_MODULE, "fixed_length", exports, batch_size, args.new_tokens, args.repetitions)
    copies = {}
    for name in exports:
        copies.setdefault(name.removesuffix(", again"), []).append(name)

    def mean(kind: str, system: str) -> float:
        return statistics.mean(measured[kind][name] for name in copies[system])

    def chunks(system: str) -> list[float]:
        per_copy = [measured["chunk_seconds"][name] for name in copies[system]]
        return [statistics.mean(seconds) for seconds in zip(*per_copy, strict=True)]

    figures = {}
    for system, names in copies.items():
        figures[system] = {"sentences_per_second": round(measured["sentences"] / mean("wall_seconds", system), 2)}
        peer = system.replace("ours", "Marian")
        if peer != system:
            figures[system]["ours_over_marian"] = {
                "wall": round(mean("wall_seconds", peer) / mean("wall_seconds", system), 3),
                "cpu": round(mean("cpu_seconds", peer) / mean("cpu_seconds", system), 3),
                "median_chunk": round(
                    statistics.median(theirs / mine for theirs, mine in zip(chunks(peer), chunks(system), strict=True)),
                    3,
                ),
            }
        if len(names) == 2:  # the control: equal work, so any difference is the measurement's
            first, second = (measured["wall_seconds"][name] for name in names)
            figures[system]["second_copy_over_first"] = round(first / second, 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/multi30k-small")
    parser.add_argument(
        "--marian",
        default="runs/stock-marian-multi30k",
        help="A trained MarianMTModel folder (python -m bench stock_marian_translation --data multi30k "
        "--source_lang en --target_lang de --minutes 24); skipped when missing.",
    )
    add_repetitions(parser, 3)
    parser.add_argument(
        "--batch1_sentences",
        type=int,
        default=200,
        help="Sources translated one at a time by generate() and the exports (translate mode).",
    )
    parser.add_argument("--new_tokens", type=int, default=20)
    parser.add_argument("--modes", nargs="+", default=["translate", "fixed_length"], help="Which modes to run.")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[64, 1], help="64 and/or 1.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker, *arguments = json.loads(args.worker)
        print(json.dumps(WORKERS[worker](*arguments)))
        return

    references = [target for _, target in multi30k_pairs()]
    results = {
        "machine": machine(),
        "model": args.model,
        "sentences": len(references),
        "repetitions": args.repetitions,
        "translate": {},
        "fixed_length": {},
    }
    with tempfile.TemporaryDirectory() as folder:
        ours = {q: export(args.model, os.path.join(folder, f"ours-{q}"), q) for q in QUANTIZATIONS}
        marian = marian_exports(args.model, folder)
        trained = trained_marian_exports(args.marian, args.model, folder) if os.path.isdir(args.marian) else {}
        translate_exports = {
            "ours generate()": ("generate", args.model),
            **{
                f"{system} CTranslate2 {q}": ("ctranslate2", exports[q])
                for system, exports in (("ours", ours), ("Marian", trained))
                for q in exports
            },
        }
        fixed_length_exports = {  # each twice: the control, and a mean over where the weights land in memory
            f"{system} CTranslate2 {q}{copy}": exports[q]
            for system, exports in (("ours", ours), ("Marian", marian))
            for q in QUANTIZATIONS
            for copy in ("", ", again")
        }
        for mode in args.modes:
            for batch_size in args.batch_sizes:
                if mode == "translate":
                    figures = translate_figures(args, translate_exports, batch_size, references)
                else:
                    figures = fixed_length_figures(args, fixed_length_exports, batch_size)
                for name, values in figures.items():
                    results[mode][f"{name}, batch {batch_size}"] = values
                    print(f"{mode}, {name}, batch {batch_size}: {values}", flush=True)
    # a partial run (a recheck of one mode or batch size) gets a file of its own
    partial = (args.modes, args.batch_sizes) != (["translate", "fixed_length"], [64, 1])
    label = "_".join([*args.modes, *(f"batch{size}" for size in args.batch_sizes)]) if partial else ""
    print("wrote", write_results("ctranslate2", results, label))


if __name__ == "__main__":
    main()
