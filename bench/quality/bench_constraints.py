"""Terminology constraints against plain beam search: terms met, BLEU and time, on Multi30k (en-de) or Tatoeba (en-zh).

    OMP_NUM_THREADS=1 python -m bench constraints --model runs/multi30k-small --repetitions 3
    OMP_NUM_THREADS=1 python -m bench constraints --model runs/tatoeba-en-zh-small --target_lang zh \
        --data ../shared/data/tatoeba-en-zh/test.jsonl --repetitions 3

The model's beam search (`generate()`, its generation config) translates every sentence. Then each sentence gets
terms from its reference that the translation lacks, as a translator who knows the right word would give them: for
a language written with spaces, one or two reference words of four letters or more (punctuation stripped), met as
whole words; for Chinese or Japanese, one or two spans of two characters of the reference, met inside words. A
sentence whose translation lacks no such word gets no terms. `constrained_beam_search` translates every sentence
again, those without terms included, with each variant asked for (`--variants BEAMS/SLACK`: the beam of the
sentences searched again, `rule` for `constrained_beams`, and the tokens they may write beyond their translation
without terms and the terms' own, `none` for no such bound; the defaults, `rule/0`, always). Reported: the share
of terms the output holds (`holds`, as a reader checks it), sacreBLEU (detokenized, cased, the target language's
tokenization, with its signature) of plain and constrained output, whether the sentences without terms kept their
translation, and the time of each over all sentences, in batches of --batch_size sorted by length, interleaved
repetitions, median.
"""

import argparse
import os
import random
import string

import regex as re
import torch

from bench.helpers.common import (
    MULTI30K,
    add_repetitions,
    add_results_label,
    interleaved_medians,
    machine,
    write_results,
)
from hf_vanilla_transformer.decoding.constraints import constrained_beam_search, constrained_beams
from hf_vanilla_transformer.decoding.words import (
    UNSPACED_CHARACTER,
    UNSPACED_SCRIPTS,
    TokenWords,
    encode_phrases,
    holds,
)
from hf_vanilla_transformer.loading import load_model_and_tokenizer
from hf_vanilla_transformer.training.data import read_translation_file
from hf_vanilla_transformer.training.metrics import load_translation_metric

PUNCTUATION = string.punctuation + "„“”‚‘’«»…–—"


def words(text: str) -> list[str]:
    return [word.strip(PUNCTUATION) for word in text.split()]


def missing_terms(reference: str, translation: str, rng: random.Random) -> list[str]:
    """One or two terms of the reference that the translation lacks, in reference order: words of four letters or
    more, or, in a script written without spaces, spans of two of its characters (each run of such characters cut
    into pairs from its start, so that no two terms overlap)."""
    if UNSPACED_CHARACTER.search(reference):
        runs = re.findall(rf"[{UNSPACED_SCRIPTS}]+", reference)
        spans = [run[start : start + 2] for run in runs for start in range(0, len(run) - 1, 2)]
        candidates = list(dict.fromkeys(span for span in spans if span not in translation))
    else:
        present = set(words(translation))
        candidates = list(dict.fromkeys(word for word in words(reference) if len(word) >= 4 and word not in present))
    chosen = set(rng.sample(candidates, min(len(candidates), rng.choice([1, 2]))))
    return [term for term in candidates if term in chosen]


def length_sorted_batches(tokenizer, sources: list[str], batch_size: int) -> list[tuple[list[int], dict]]:
    """(sentence indices, tokenized batch) by source length, as vanilla-translate batches, so padding stays small."""
    order = sorted(range(len(sources)), key=lambda index: len(tokenizer(sources[index])["input_ids"]))
    return [
        (chunk, dict(tokenizer([sources[i] for i in chunk], return_tensors="pt", padding=True)))
        for chunk in (order[start : start + batch_size] for start in range(0, len(order), batch_size))
    ]


def translate(model, tokenizer, batches, count: int, constraints=None, words=None, variant=(None, 0)) -> list[str]:
    """Each sentence's best translation: `generate()` when `constraints` is None, else `constrained_beam_search`
    with them (a list of `Phrase`s a sentence) and `variant`, (beams, slack) for the sentences searched again."""
    texts = [None] * count
    with torch.no_grad():
        for indices, batch in batches:
            if constraints is None:
                sequences = model.generate(**batch)
            else:
                sequences = constrained_beam_search(
                    model,
                    batch["input_ids"],
                    batch["attention_mask"],
                    [constraints[i] for i in indices],
                    words,
                    constrained_num_beams=variant[0],
                    length_slack=variant[1],
                ).sequences
            for index, row in zip(indices, sequences.tolist(), strict=True):
                texts[index] = tokenizer.decode(row, skip_special_tokens=True).strip()
    return texts


def parsed_variant(name: str) -> tuple[int | None, int | None]:
    """`BEAMS/SLACK` as `constrained_beam_search`'s `constrained_num_beams` and `length_slack`."""
    beams, slack = name.split("/")
    return (None if beams == "rule" else int(beams)), (None if slack == "none" else int(slack))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a trained model folder")
    parser.add_argument("--data", default=os.path.join(MULTI30K, "test.jsonl"), help="JSON lines of pairs")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--sentences", type=int, default=None, help="the first this many (default: all)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help="BEAMS/SLACK pairs measured beside the defaults (rule/0): e.g. 8/0, rule/none",
    )
    add_repetitions(parser, 3)
    parser.add_argument("--seed", type=int, default=0, help="of the choice of terms")
    add_results_label(parser)
    args = parser.parse_args()
    if not os.path.isfile(args.data):
        parser.error(f"--data {args.data}: no such file")

    model, tokenizer = load_model_and_tokenizer(args.model, device="cpu", dtype=torch.float32)
    model.eval()
    pairs = list(read_translation_file(args.data, args.source_lang, args.target_lang))[: args.sentences]
    sources, references = [source for source, _ in pairs], [reference for _, reference in pairs]
    batches = length_sorted_batches(tokenizer, sources, args.batch_size)
    table = TokenWords.of(tokenizer, model.config.vocab_size)

    plain = translate(model, tokenizer, batches, len(pairs))
    rng = random.Random(args.seed)
    terms = [missing_terms(reference, text, rng) for reference, text in zip(references, plain, strict=True)]
    phrases = [encode_phrases(tokenizer, sentence_terms, "word", table) for sentence_terms in terms]
    wanted = [row for row, sentence_terms in enumerate(terms) if sentence_terms]
    total = sum(len(terms[row]) for row in wanted)
    rules = {name: parsed_variant(name) for name in dict.fromkeys(["rule/0", *args.variants])}
    outputs = {
        name: translate(model, tokenizer, batches, len(pairs), phrases, table, variant)
        for name, variant in rules.items()
    }

    metric = load_translation_metric()
    references_list = [[reference] for reference in references]
    bleu = {
        "beam search": metric.compute(predictions=plain, references=references_list, target_language=args.target_lang)
    }
    met, kept = {}, {}
    for name, texts in outputs.items():
        bleu[name] = metric.compute(predictions=texts, references=references_list, target_language=args.target_lang)
        met[name] = sum(holds(texts[row], term) for row in wanted for term in terms[row]) / total
        kept[name] = sum(texts[row] == plain[row] for row in range(len(pairs)) if not terms[row])

    medians = interleaved_medians(
        {
            "beam search": lambda: translate(model, tokenizer, batches, len(pairs)),
            **{
                name: lambda variant=variant: translate(model, tokenizer, batches, len(pairs), phrases, table, variant)
                for name, variant in rules.items()
            },
        },
        args.repetitions,
    )
    config = model.generation_config
    token_counts = [sum(phrase.shortest for phrase in phrases[row]) for row in wanted]
    results = {
        "machine": machine(),
        "model": args.model,
        "data": args.data,
        "sentences": len(pairs),
        "sentences_with_terms": len(wanted),
        "terms": total,
        "batch_size": args.batch_size,
        "decoding": {
            "num_beams": config.num_beams,
            "length_penalty": config.length_penalty,
            "max_new_tokens_over_source": getattr(config, "max_new_tokens_over_source", None),
            "rule/0": {
                "beams of sentences searched again": sorted(
                    {constrained_beams(config.num_beams, count) for count in token_counts}
                )
            },
        },
        "terms_met": met,
        "sentences_without_terms_unchanged": {
            name: f"{count} of {len(pairs) - len(wanted)}" for name, count in kept.items()
        },
        "bleu": {name: round(score["bleu"], 2) for name, score in bleu.items()},
        "bleu_signature": bleu["beam search"]["bleu_signature"],
        "seconds_median": {name: round(seconds, 2) for name, seconds in medians.items()},
        "time_ratio_to_beam_search": {name: round(medians[name] / medians["beam search"], 2) for name in rules},
        "repetitions": args.repetitions,
        "examples": [
            {
                "source": sources[row],
                "terms": terms[row],
                "beam search": plain[row],
                "constrained": outputs["rule/0"][row],
            }
            for row in wanted[:8]
        ],
    }
    for name in rules:
        print(
            f"{name}: terms met {met[name]:.1%}; BLEU {results['bleu']['beam search']} -> {results['bleu'][name]}; "
            f"time x{results['time_ratio_to_beam_search'][name]}"
        )
    print(results["bleu_signature"])
    print("wrote", write_results("constraints", results, args.results))


if __name__ == "__main__":
    main()
