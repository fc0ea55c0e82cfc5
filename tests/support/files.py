"""Input files written by the tests: lines, bytes, translation datasets in the layouts the Hub uses."""

import json
from pathlib import Path

from datasets import Dataset, DatasetDict


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


# The two layouts of the Hub's translation datasets, each making a row of an English and a German sentence
HUB_LAYOUTS = {
    "translation column": lambda en, de: {"translation": {"en": en, "de": de}},  # wmt14, Helsinki-NLP/opus-100
    "language columns": lambda en, de: {"en": en, "de": de},  # bentrevett/multi30k
}


def write_dataset(folder, splits: dict[str, list[dict]], form: str = "jsonl") -> str:
    """`splits` (rows a split) as a local folder that `datasets.load_dataset(folder)` reads: JSON lines or parquet
    files named as bentrevett/multi30k names them (val.jsonl holds the validation split), or `save_to_disk`'s
    folder."""
    tables = {split: Dataset.from_list(rows) for split, rows in splits.items()}
    if form == "saved":
        DatasetDict(tables).save_to_disk(folder)
        return str(folder)
    folder.mkdir()
    for split, rows in splits.items():
        name = folder / ("val" if split == "validation" else split)
        if form == "jsonl":
            write_lines(name.with_suffix(".jsonl"), [json.dumps(row) for row in rows])
        else:
            tables[split].to_parquet(name.with_suffix(".parquet"))
    return str(folder)


def write_bytes_lines(folder: Path, name: str, lines: list[bytes], bom: bool = False) -> str:
    path = folder / name
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"".join(line + b"\n" for line in lines))
    return str(path)
