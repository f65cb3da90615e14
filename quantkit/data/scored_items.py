"""Everything quantkit's eval can score, as one index of word 8-grams, so that calibration text can be kept
apart from it: the standard benchmarks' validation items (quantkit.eval.benchmarks), quantkit's own task files
(quantkit/eval/tasks/*.jsonl) and the held-out eval splits of the shipped synthetic sets.

8-grams are stored as 64-bit hashes in a sorted numpy array: the ~20k benchmark items hold about 1.5M of
them, which as Python tuples would take gigabytes.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

import numpy as np

from quantkit.data.overlap import words

N = 8


_VOCAB: dict[str, int] = {}
# A polynomial hash of the 8 word ids (wrapping uint64 arithmetic): vectorised, and far faster than hashing
# 1.8M joined strings. A rare collision can only flag an item that does not overlap, never miss one that does.
_WEIGHTS = np.random.default_rng(8).integers(1, 2**63, size=N, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def gram_hashes(text: str, n: int = N) -> np.ndarray:
    ids = np.array([_VOCAB.setdefault(w, len(_VOCAB) + 1) for w in words(text)], dtype=np.uint64)
    if len(ids) < n:
        return np.zeros(0, dtype=np.uint64)
    windows = np.lib.stride_tricks.sliding_window_view(ids, n)
    return (windows * _WEIGHTS[:n]).sum(axis=1, dtype=np.uint64)


def item_text(row: object) -> str:
    """Every string in a row (question, choices, passage...), whatever its schema."""
    if isinstance(row, str):
        return row
    if isinstance(row, dict):
        return "\n".join(item_text(v) for v in row.values())
    if isinstance(row, (list, tuple)):
        return "\n".join(item_text(v) for v in row)
    return ""


def benchmark_items() -> dict[str, list[str]]:
    from datasets import Dataset

    from quantkit.eval.benchmarks import BENCHMARKS

    return {name: [item_text(row) for f in b.data_files() for row in Dataset.from_file(str(f)).to_list()]
            for name, b in BENCHMARKS.items()}


def task_file_items() -> dict[str, list[str]]:
    folder = resources.files("quantkit.eval.tasks")
    return {p.name.removesuffix(".jsonl"): [item_text(json.loads(line)) for line in p.read_text("utf-8").splitlines()
                                            if line.strip()]
            for p in folder.iterdir() if p.name.endswith(".jsonl")}


def synthetic_eval_items() -> dict[str, list[str]]:
    from quantkit.data.readers import read_records, synthetic_set_names

    return {f"{name}:eval": [r.plain_text() for r in read_records(f"{name}:eval")] for name in synthetic_set_names()}


def all_scored_items() -> dict[str, list[str]]:
    return benchmark_items() | task_file_items() | synthetic_eval_items()


@cache
def scored_index() -> np.ndarray:
    hashes = [gram_hashes(text) for items in all_scored_items().values() for text in items]
    return np.unique(np.concatenate(hashes))


def shares_ngram(text: str, index: np.ndarray | None = None) -> bool:
    index = scored_index() if index is None else index
    grams = gram_hashes(text)
    if not len(grams):
        return False
    pos = np.searchsorted(index, grams).clip(max=len(index) - 1)
    return bool(np.any(index[pos] == grams))
