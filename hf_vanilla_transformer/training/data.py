"""Reading translation data: Hugging Face translation JSON lines, plain text, or a `datasets` dataset.

A translation row is `{"translation": {"en": "...", "de": "..."}}`, the format of transformers' translation
examples. A `datasets` dataset may also hold one column a language (`{"en": "...", "de": "..."}`), as some of the
Hub's translation datasets do. Every reader checks each row and raises `InputError` (files.py) naming the file and
line (or the dataset, split and row) of the first bad one, so that a command fails with one clear line instead of a
traceback.

`load_translation_split` streams the checked pairs into an Arrow file on disk (`datasets`' cache), never into
Python lists, so a corpus of millions of pairs is memory-mapped rather than held in memory; a second run on the same
file finds that cache and reads nothing (see `file_fingerprint`).
"""

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from itertools import islice

from hf_vanilla_transformer.files import InputError, check_unicode, json_value, numbered_lines, shortened

TRANSLATION_FILE_EXTENSIONS = (".json", ".jsonl")
# bumped when the rows a file gives change, so that a cache written by an earlier version is not reused
PAIRS_FORMAT = 1


def translation_pair(row, where: str, source_lang: str, target_lang: str) -> tuple[str, str]:
    """The (source, target) sentences of one translation row, checked."""
    translation = row.get("translation") if isinstance(row, dict) else None
    if not isinstance(translation, dict):
        raise InputError(f'{where}: expected an object with a "translation" object, got {shortened(row)}')
    return sentence_pair(translation, where, source_lang, target_lang, holder="the translation")


def sentence_pair(sentences: dict, where: str, source_lang: str, target_lang: str, holder: str) -> tuple[str, str]:
    """The (source, target) sentences of a mapping from language to sentence, checked; `holder` names the mapping
    in errors."""
    for lang in (source_lang, target_lang):
        sentence = sentences.get(lang)
        if sentence is None:  # no such key, or null: `datasets` fills in null for a language that a row lacks
            languages = ", ".join(repr(key) for key, value in sentences.items() if value is not None) or "none"
            raise InputError(f"{where}: {holder} has no {lang!r} sentence (it has {languages})")
        if not isinstance(sentence, str):
            raise InputError(f"{where}: the {lang!r} sentence is not a string: {shortened(sentence)}")
        if not sentence.strip():
            raise InputError(f"{where}: the {lang!r} sentence is empty")
        check_unicode(sentence, f"{where}: the {lang!r} sentence")
    return sentences[source_lang], sentences[target_lang]


def dataset_row_pair(row: dict, where: str, source_lang: str, target_lang: str) -> tuple[str, str]:
    """The (source, target) sentences of a `datasets` row in either layout of the Hub's translation datasets: a
    `translation` column of {language: sentence} (wmt14, opus-100) or a column a language (bentrevett/multi30k)."""
    if "translation" in row:
        return translation_pair(row, where, source_lang, target_lang)
    for lang in (source_lang, target_lang):
        if lang not in row:
            columns = ", ".join(map(repr, row)) or "none"
            raise InputError(
                f"{where}: neither a 'translation' column nor a column named {lang!r} (the columns are {columns})"
            )
    return sentence_pair(row, where, source_lang, target_lang, holder="the row")


def read_translation_file(path: str, source_lang: str, target_lang: str) -> Iterator[tuple[str, str]]:
    """(source, target) pairs of a translation JSON lines file; blank lines are skipped."""
    count = 0
    for line_number, line in numbered_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{line_number}"
        yield translation_pair(json_value(line, where, "a translation row"), where, source_lang, target_lang)
        count += 1
    if count == 0:
        raise InputError(f"{path}: no sentence pairs (the file is empty)")


def read_text_file(path: str) -> Iterator[str]:
    """The non-blank lines of a plain text file, one sentence a line."""
    count = 0
    for _, line in numbered_lines(path):
        if line.strip():
            yield line.rstrip("\r\n")
            count += 1
    if count == 0:
        raise InputError(f"{path}: no sentences (the file is empty)")


def read_dataset(
    dataset_name: str, dataset_config_name: str | None, split: str, source_lang: str, target_lang: str
) -> Iterator[tuple[str, str]]:
    """(source, target) pairs of one split of a `datasets` dataset: whatever `datasets.load_dataset` loads, a Hub
    name or a local folder (data files such as train.jsonl/validation.jsonl/test.jsonl or parquet, or a folder that
    `save_to_disk` wrote), in either layout `dataset_row_pair` reads."""
    where = dataset_split_name(dataset_name, dataset_config_name, split)
    for index, row in enumerate(load_dataset_split(dataset_name, dataset_config_name, split)):
        yield dataset_row_pair(row, f"{where} row {index}", source_lang, target_lang)


def dataset_split_name(dataset_name: str, dataset_config_name: str | None, split: str) -> str:
    """How errors name a dataset's split: `name (config c)[split]`."""
    config = "" if dataset_config_name is None else f" (config {dataset_config_name})"
    return f"{dataset_name}{config}[{split}]"


def load_dataset_split(dataset_name: str, dataset_config_name: str | None, split: str, cache_dir: str | None = None):
    """`datasets.load_dataset`'s split, or an InputError naming it."""
    import datasets

    try:
        return datasets.load_dataset(dataset_name, dataset_config_name, split=split, cache_dir=cache_dir)
    except (FileNotFoundError, ValueError, ConnectionError, RuntimeError) as error:
        # RuntimeError: a dataset with a loading script, which `datasets` 4 and later no longer run
        where = dataset_split_name(dataset_name, dataset_config_name, split)
        raise InputError(f"dataset_name {where}: cannot load it ({error})") from None


def load_translation_split(
    path: str | None,
    dataset_name: str | None,
    dataset_config_name: str | None,
    split: str,
    source_lang: str,
    target_lang: str,
    max_samples: int | None = None,
    cache_dir: str | None = None,
):
    """A `datasets.Dataset` with `source` and `target` columns, from a JSON lines file or else a dataset's split,
    written to an Arrow file in `cache_dir` (default: `datasets`' cache) and memory-mapped from there."""
    import datasets

    features = datasets.Features({"source": datasets.Value("string"), "target": datasets.Value("string")})
    if path is None:
        dataset = load_dataset_split(dataset_name, dataset_config_name, split, cache_dir)
        if max_samples is not None:
            dataset = dataset.select(range(min(max_samples, len(dataset))))
        where = dataset_split_name(dataset_name, dataset_config_name, split)
        return dataset.map(
            checked_pairs,
            batched=True,
            with_indices=True,
            fn_kwargs={"where": where, "source_lang": source_lang, "target_lang": target_lang},
            remove_columns=dataset.column_names,
            features=features,
            desc=f"Checking {split}",
        )
    try:
        return datasets.Dataset.from_generator(
            file_pairs,
            features=features,
            cache_dir=cache_dir,
            gen_kwargs={
                "path": path,
                "source_lang": source_lang,
                "target_lang": target_lang,
                "max_samples": max_samples,
            },
            fingerprint=file_fingerprint(path, split, source_lang, target_lang, max_samples),
            split=split,
        )
    except datasets.exceptions.DatasetGenerationError as error:
        # `datasets` wraps whatever the generator raised in its own "An error occurred while generating the
        # dataset"; a bad row's InputError (file and line) is the message to show, and the cache is left unwritten
        if isinstance(error.__cause__, InputError):
            raise error.__cause__ from None
        raise


def file_pairs(path: str, source_lang: str, target_lang: str, max_samples: int | None) -> Iterator[dict]:
    """The rows `load_translation_split` writes: a translation file's checked pairs as {"source", "target"}."""
    for source, target in islice(read_translation_file(path, source_lang, target_lang), max_samples):
        yield {"source": source, "target": target}


def file_fingerprint(path: str, split: str, source_lang: str, target_lang: str, max_samples: int | None) -> str:
    """What names a file's cached pairs: the file as it is now, the split it is read as (the cache holds the split's
    name, so one file given for two splits is cached twice), the languages and the number of pairs read. `datasets`
    would otherwise hash the generator's arguments, which name the file but not its content, and a file edited in
    place would give the old pairs."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    return files_fingerprint([path], PAIRS_FORMAT, split, source_lang, target_lang, max_samples)


def files_fingerprint(paths: list[str], *settings) -> str:
    """A name for what is made from the files at `paths`, as they are now (path, size, modification time), with
    `settings` (JSON values)."""
    files = [
        [os.path.abspath(path), status.st_size, status.st_mtime_ns] for path in paths for status in [os.stat(path)]
    ]
    return hashlib.sha256(json.dumps([files, *settings]).encode()).hexdigest()[:32]


def checked_pairs(rows: dict[str, list], indices: list[int], where: str, source_lang: str, target_lang: str) -> dict:
    """A batch of a `datasets` split as checked {"source", "target"} columns (`Dataset.map`, batched)."""
    pairs = [
        dataset_row_pair(
            {column: values[offset] for column, values in rows.items()},
            f"{where} row {index}",
            source_lang,
            target_lang,
        )
        for offset, index in enumerate(indices)
    ]
    return {"source": [source for source, _ in pairs], "target": [target for _, target in pairs]}


def dataset_fingerprint(dataset, *settings) -> str | None:
    """A name for what is made from `dataset` with `settings` (JSON values): its Arrow files as they are now and
    its length; None for a dataset held only in memory."""
    files = [cache_file["filename"] for cache_file in dataset.cache_files]
    return files_fingerprint(files, len(dataset), *settings) if files else None


def column_values(dataset, column: str, batch_size: int = 1000) -> Iterator:
    """A column's values one by one, read a batch at a time from the Arrow file (`dataset[column]` would make one
    Python list of them all)."""
    for batch in dataset.select_columns(column).iter(batch_size=batch_size):
        yield from batch[column]


def file_sentences(files: Iterable[str], source_lang: str, target_lang: str) -> Iterator[str]:
    """Sentences of translation files (.json/.jsonl: source, target, source, ...) and plain text files."""
    for path in files:
        if path.endswith(TRANSLATION_FILE_EXTENSIONS):
            for pair in read_translation_file(path, source_lang, target_lang):
                yield from pair
        else:
            yield from read_text_file(path)
