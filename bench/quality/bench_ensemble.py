"""Ensembling trained models: BLEU and time of each model alone and of their ensemble, on Multi30k.

    OMP_NUM_THREADS=1 python -m bench ensemble --models runs/multi30k-small-seed1 runs/multi30k-small-seed2

Each model alone (its own generate()) and the ensemble of all (decoding/ensemble.py: the mean of their log-probabilities
at each step) translate the English sources of --validation and --test (rows with "en" and "de") as
vanilla-translate does: sorted by length into batches of --batch_size, each decoding as the models' generation
config says (for a model run_translation.py trained, its recipe's beam and length penalty, at most the source
length + 50 tokens; the ensemble takes the first model's config and is given the length rule as a logits
processor), in float32 on the CPU. BLEU is
sacreBLEU's corpus BLEU (13a, cased) of the detokenized translations against the raw references, with its
signature; time is one timed pass per system and split after a warm-up batch, on torch's threads (set
OMP_NUM_THREADS). Writes bench/results/ensemble/DATE.json.
"""

import argparse
import os
import sys
import time

import sacrebleu
import torch

from bench.helpers.common import MULTI30K, REPO_ROOT, machine, write_results
from hf_vanilla_transformer.decoding.ensemble import TranslationEnsemble, load_ensemble
from hf_vanilla_transformer.model.modeling_vanilla_transformer import max_new_tokens_over_source_of
from hf_vanilla_transformer.training.data import read_translation_file


def translated_batch(model, tokenizer, sources: list[str]) -> list[str]:
    batch = tokenizer(
        sources, return_tensors="pt", padding=True, truncation=True, max_length=model.config.max_position_embeddings
    )
    # our model adds Section 6.1's length rule in its own generate(); the ensemble is given it
    length_rule = model.length_limit_processors(batch) if isinstance(model, TranslationEnsemble) else None
    with torch.no_grad():
        ids = model.generate(**batch, logits_processor=length_rule)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def timed_translation(model, tokenizer, sources: list[str], batch_size: int):
    """The translations of `sources`, in order, and the seconds they took. Batches are cut as vanilla-translate
    cuts them (translation/lines.py): the stripped sentences sorted by token count, longest first."""
    start = time.perf_counter()
    sources = [source.strip() for source in sources]
    lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]]
    order = sorted(range(len(sources)), key=lengths.__getitem__, reverse=True)
    translations = [""] * len(sources)
    for first in range(0, len(order), batch_size):
        indices = order[first : first + batch_size]
        batch = translated_batch(model, tokenizer, [sources[i] for i in indices])
        for index, translation in zip(indices, batch, strict=True):
            translations[index] = translation
    return translations, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", required=True, help="Trained model folders of one vocabulary.")
    parser.add_argument("--validation", default=os.path.join(MULTI30K, "validation.jsonl"))
    parser.add_argument("--test", default=os.path.join(MULTI30K, "test.jsonl"))
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args()
    for path in (args.validation, args.test):
        if not os.path.isfile(path):
            parser.error(f"{path}: no such file")
    if len(set(args.models)) < 2 or len(set(args.models)) < len(args.models):
        parser.error("--models: give two folders or more to ensemble, each once")

    try:
        ensemble, tokenizer = load_ensemble(args.models, device="cpu", dtype=torch.float32)
    except ValueError as error:  # a folder that is no model, or models of different vocabularies
        parser.error(str(error))
    systems = {**dict(zip(args.models, ensemble.members, strict=True)), "ensemble": ensemble}
    files = {"validation": args.validation, "test": args.test}
    splits = {split: list(read_translation_file(path, "en", "de")) for split, path in files.items()}
    warm_up = [source for source, _ in splits["test"][: args.batch_size]]
    bleu = sacrebleu.BLEU()
    figures = {split: {} for split in splits}
    for name, model in systems.items():
        timed_translation(model, tokenizer, warm_up, args.batch_size)
        for split, pairs in splits.items():
            sources = [source for source, _ in pairs]
            translations, seconds = timed_translation(model, tokenizer, sources, args.batch_size)
            score = bleu.corpus_score(translations, [[reference for _, reference in pairs]])
            figures[split][name] = {
                "bleu": round(score.score, 2),
                "seconds": round(seconds, 1),
                "sentences_per_second": round(len(pairs) / seconds, 2),
            }
            print(f"{split}, {name}: BLEU {score.score:.2f}, {seconds:.1f} s", file=sys.stderr, flush=True)
    generation = ensemble.generation_config
    path = write_results(
        "ensemble",
        {
            "machine": machine(),
            "command": " ".join(["python -m bench ensemble", *sys.argv[1:]]),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "models": args.models,
            "splits": {
                split: {"file": os.path.relpath(path, REPO_ROOT), "sentences": len(splits[split])}
                for split, path in files.items()
            },
            "decoding": {
                "num_beams": generation.num_beams,
                "length_penalty": generation.length_penalty,
                "max_new_tokens_over_source": max_new_tokens_over_source_of(generation),
                "batch_size": args.batch_size,
                "dtype": "float32",
            },
            "bleu_signature": str(bleu.get_signature()),
            "figures": figures,
        },
    )
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
