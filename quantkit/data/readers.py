"""Read calibration or traffic records from jsonl, json, csv, parquet, plain text, a `datasets`
directory (``load_from_disk``) or a shipped set name (``coqa_chat_en`` or ``support_chat_en:eval``).

Shipped sets are of two kinds: real public text built from an installed package (quantkit.data.public_sets)
and synthetic sets written for quantkit, stored as calib_sets/<set>/{train,eval}.jsonl.

Every record keeps its source location; a bad record is an error naming file and line, never skipped.
"""

from __future__ import annotations

import csv
import hashlib
import json
from importlib import resources
from pathlib import Path

from quantkit.data.public_sets import PUBLIC_SETS, read_public_set, source_files
from quantkit.data.records import Record, parse_record
from quantkit.errors import QuantkitError

SPLITS = ("train", "eval")


def shipped_sets_dir() -> Path:
    return Path(str(resources.files("quantkit.calib_sets")))


def synthetic_set_names() -> list[str]:
    return sorted(p.name for p in shipped_sets_dir().iterdir() if (p / "train.jsonl").is_file())


def shipped_set_names() -> list[str]:
    return sorted(synthetic_set_names() + list(PUBLIC_SETS))


def _shipped_split(ref: str) -> tuple[str, str] | None:
    """(name, split) when ``ref`` names a shipped set, else None."""
    name, _, split = ref.partition(":")
    if name not in PUBLIC_SETS and name not in synthetic_set_names():
        return None
    split = split or "train"
    if split not in SPLITS:
        raise QuantkitError(f"dataset '{ref}': unknown split '{split}'", hint=f"use one of {SPLITS}")
    return name, split


def resolve_dataset(ref: str) -> Path:
    """A synthetic set name (optionally ``name:split``) or a path, as a path that exists."""
    shipped = _shipped_split(ref)
    if shipped and shipped[0] in PUBLIC_SETS:
        raise QuantkitError(f"dataset '{ref}' is built from an installed package, not stored as a file")
    if shipped:
        return shipped_sets_dir() / shipped[0] / f"{shipped[1]}.jsonl"
    path = Path(ref).expanduser()
    if not path.exists():
        raise QuantkitError(
            f"dataset '{ref}' not found: no such file or directory, and not a shipped set",
            hint=f"shipped sets: {', '.join(shipped_set_names())}",
        )
    return path


def read_records(ref: str) -> list[Record]:
    """Records of one dataset, or of several joined by commas (``pile_style_en,coding_python``)."""
    if "," in ref:
        return [record for part in ref.split(",") for record in read_records(part.strip())]
    shipped = _shipped_split(ref)
    if shipped and shipped[0] in PUBLIC_SETS:
        return list(read_public_set(*shipped))
    path = resolve_dataset(ref)
    try:
        if path.is_dir():
            records = _read_datasets_dir(path)
        else:
            reader = _READERS.get(path.suffix.lower(), _read_text)
            records = reader(path)
    except PermissionError as exc:
        raise QuantkitError(f"cannot read {path}: permission denied") from exc
    except UnicodeDecodeError as exc:
        raise QuantkitError(f"cannot read {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    if not records:
        raise QuantkitError(f"dataset {path} is empty: no records found")
    return records


def dataset_hash(ref: str) -> str:
    """sha256 over the dataset's bytes (every file, in name order, for a directory; datasets in the
    order given, for a comma-separated list)."""
    digest = hashlib.sha256()
    files = []
    for part in ref.split(","):
        shipped = _shipped_split(part.strip())
        if shipped and shipped[0] in PUBLIC_SETS:  # the package files it is built from, and which split
            digest.update(f"{shipped[0]}:{shipped[1]}".encode())
            files += source_files(shipped[0])
            continue
        path = resolve_dataset(part.strip())
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _read_jsonl(path: Path) -> list[Record]:
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QuantkitError(f"{where}: malformed JSON line ({exc.msg}, column {exc.colno})") from exc
            records.append(parse_record(obj, where))
    return records


def _read_json(path: Path) -> list[Record]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise QuantkitError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from exc
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise QuantkitError(f"{path}: expected a JSON list of records (or an object with a 'data' list)")
    return [parse_record(obj, f"{path}[{i}]") for i, obj in enumerate(data)]


def _read_csv(path: Path) -> list[Record]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        # line_num is the last physical line read, i.e. this row's line for one-line rows.
        return [parse_record(row, f"{path}:{reader.line_num}") for row in reader]


def _read_parquet(path: Path) -> list[Record]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises its own error types for corrupt files
        raise QuantkitError(f"cannot read parquet file {path}: {exc}") from exc
    return [parse_record(row, f"{path}[row {i}]") for i, row in enumerate(rows)]


def _read_text(path: Path) -> list[Record]:
    """Plain text: one record per paragraph (blocks separated by blank lines)."""
    records, block, start = [], [], 0
    with open(path, encoding="utf-8") as f:
        lines = list(f) + [""]
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            start = start or lineno
            block.append(line.rstrip("\n"))
        elif block:
            records.append(parse_record({"text": "\n".join(block)}, f"{path}:{start}"))
            block, start = [], 0
    return records


def _read_datasets_dir(path: Path) -> list[Record]:
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise QuantkitError(f"{path} is a directory but not a saved `datasets` dataset: {exc}") from exc
    if isinstance(ds, DatasetDict):
        split = "train" if "train" in ds else next(iter(ds))
        ds = ds[split]
    return [parse_record(row, f"{path}[row {i}]") for i, row in enumerate(ds)]


_READERS = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".csv": _read_csv,
    ".parquet": _read_parquet,
    ".txt": _read_text,
}
