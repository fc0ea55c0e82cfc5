"""Terminology constraints on Multi30k test2016 (en-de): constraints met, BLEU and speed against plain beam search.

    OMP_NUM_THREADS=1 python -m bench constraints --model runs/multi30k-small-seed1 --repetitions 3

The model's beam search (its generation config) translates every sentence; then each sentence gets one or two
words of its reference (four letters or more, punctuation stripped, chosen at random with a fixed seed) that the
translation lacks, as constraints (`constraint_token_ids`: the word as it appears after a space), and
`constrained_beam_search` translates it again. Reported: the share of constraints met (as tokens, the search's
promise, and as words in the detokenized output), sacreBLEU (13a, cased, detokenized output against the raw
references, with its signature) without and with constraints, and the time of each search over all sentences,
in batches of --batch_size sorted by length, on the same threads, interleaved repetitions, median; also our
search without constraints, which tells the cost of the search itself from the cost of the constraints.
"""

import argparse
import os
import random
import string

import torch

from bench.common import MULTI30K, add_repetitions, interleaved_medians, machine, write_results
from hf_vanilla_transformer.loading import load_model_and_tokenizer
from hf_vanilla_transformer.tools.constraints import constrained_beam_search, constraint_token_ids
from hf_vanilla_transformer.training.data import read_translation_file
from hf_vanilla_transformer.training.metrics import load_translation_metric

PUNCTUATION = string.punctuation + "„“”‚‘’«»…–—"


def words(text: str) -> list[str]:
    return [word.strip(PUNCTUATION) for word in text.split()]


def missing_words(reference: str, translation: str, rng: random.Random) -> list[str]:
    """One or two words of the reference, four letters or more, that the translation lacks, in reference order."""
    present = set(words(translation))
    candidates = list(dict.fromkeys(word for word in words(reference) if len(word) >= 4 and word not in present))
    chosen = set(rng.sample(candidates, min(len(candidates), rng.choice([1, 2]))))
    return [word for word in candidates if word in chosen]


def length_sorted_batches(tokenizer, sources: list[str], batch_size: int) -> list[tuple[list[int], dict]]:
    """(sentence indices, tokenized batch) by source length, as vanilla-translate batches, so padding stays small."""
    order = sorted(range(len(sources)), key=lambda index: len(tokenizer(sources[index])["input_ids"]))
    return [
        (chunk, dict(tokenizer([sources[i] for i in chunk], return_tensors="pt", padding=True)))
        for chunk in (order[start : start + batch_size] for start in range(0, len(order), batch_size))
    ]


def translate(model, tokenizer, batches, count: int, constraints: list[list[list[int]]] | None = None):
    """Each sentence's best translation as text and token ids: `generate()` when `constraints` is None, else
    `constrained_beam_search` with them."""
    texts, tokens = [None] * count, [None] * count
    with torch.no_grad():
        for indices, batch in batches:
            if constraints is None:
                sequences = model.generate(**batch)
            else:
                chunk = [constraints[i] for i in indices]
                sequences = constrained_beam_search(model, batch["input_ids"], batch["attention_mask"], chunk).sequences
            for index, row in zip(indices, sequences.tolist(), strict=True):
                tokens[index] = row
                texts[index] = tokenizer.decode(row, skip_special_tokens=True).strip()
    return texts, tokens


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[start : start + len(phrase)] == phrase for start in range(len(tokens)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a trained model folder")
    parser.add_argument("--data", default=os.path.join(MULTI30K, "test.jsonl"), help="en-de JSON lines")
    parser.add_argument("--sentences", type=int, default=None, help="the first this many (default: all)")
    parser.add_argument("--batch_size", type=int, default=64)
    add_repetitions(parser, 3)
    parser.add_argument("--seed", type=int, default=0, help="of the choice of constraint words")
    args = parser.parse_args()
    if not os.path.isfile(args.data):
        parser.error(f"--data {args.data}: no such file")

    model, tokenizer = load_model_and_tokenizer(args.model, device="cpu", dtype=torch.float32)
    model.eval()
    pairs = list(read_translation_file(args.data, "en", "de"))[: args.sentences]
    sources, references = [source for source, _ in pairs], [reference for _, reference in pairs]
    batches = length_sorted_batches(tokenizer, sources, args.batch_size)

    plain, _ = translate(model, tokenizer, batches, len(pairs))
    rng = random.Random(args.seed)
    phrases = [missing_words(reference, text, rng) for reference, text in zip(references, plain, strict=True)]
    constraints = [constraint_token_ids(tokenizer, words) if words else [] for words in phrases]
    constrained, constrained_tokens = translate(model, tokenizer, batches, len(pairs), constraints)

    wanted = [(row, words_, ids) for row, (words_, ids) in enumerate(zip(phrases, constraints, strict=True)) if ids]
    total = sum(len(ids) for _, _, ids in wanted)
    met_tokens = sum(contains(constrained_tokens[row], phrase) for row, _, ids in wanted for phrase in ids)
    met_words = sum(word in words(constrained[row]) for row, words_, _ in wanted for word in words_)

    metric = load_translation_metric()
    scores = {
        name: metric.compute(predictions=texts, references=[[reference] for reference in references])
        for name, texts in (("unconstrained", plain), ("constrained", constrained))
    }

    no_constraints = [[] for _ in pairs]
    medians = interleaved_medians(
        {
            "generate() beam search": lambda: translate(model, tokenizer, batches, len(pairs)),
            "constrained_beam_search": lambda: translate(model, tokenizer, batches, len(pairs), constraints),
            "constrained_beam_search, no constraints": lambda: translate(
                model, tokenizer, batches, len(pairs), no_constraints
            ),
        },
        args.repetitions,
    )
    ratio = medians["constrained_beam_search"] / medians["generate() beam search"]
    config = model.generation_config
    results = {
        "machine": machine(),
        "model": args.model,
        "data": args.data,
        "sentences": len(pairs),
        "sentences_with_constraints": len(wanted),
        "constraints": total,
        "batch_size": args.batch_size,
        "decoding": {
            "num_beams": config.num_beams,
            "length_penalty": config.length_penalty,
            "max_new_tokens_over_source": getattr(config, "max_new_tokens_over_source", None),
        },
        "constraints_met_as_tokens": met_tokens / total,
        "constraints_met_as_words": met_words / total,
        "bleu": {name: round(score["bleu"], 2) for name, score in scores.items()},
        "bleu_signature": scores["constrained"]["bleu_signature"],
        "seconds_median": {name: round(seconds, 2) for name, seconds in medians.items()},
        "repetitions": args.repetitions,
        "time_ratio_constrained_to_generate": round(ratio, 2),
        "examples": [
            {
                "source": sources[row],
                "constraints": words_,
                "unconstrained": plain[row],
                "constrained": constrained[row],
            }
            for row, words_, _ in wanted[:5]
        ],
    }
    print(
        f"constraints met: {met_tokens}/{total} as tokens, {met_words}/{total} as words; "
        f"BLEU {results['bleu']['unconstrained']} -> {results['bleu']['constrained']} ({results['bleu_signature']}); "
        f"time {medians['generate() beam search']:.1f} s -> {medians['constrained_beam_search']:.1f} s ({ratio:.2f}x)"
    )
    print("wrote", write_results("constraints", results))


if __name__ == "__main__":
    main()
