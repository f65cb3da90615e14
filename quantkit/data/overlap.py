"""Word 8-gram overlap between calibration text and the items an evaluation scores (contamination check).

Words are lowercased runs of letters and digits; each CJK character is a word of its own, so Chinese text
is checked at the same grain. 8-grams are long enough that shared boilerplate rarely reaches them and short
enough to catch a copied sentence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

N = 8
_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|[^\W_]+", re.UNICODE)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int = N) -> set[tuple[str, ...]]:
    tokens = words(text)
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def ngram_index(texts: Iterable[str], n: int = N) -> set[tuple[str, ...]]:
    index: set[tuple[str, ...]] = set()
    for text in texts:
        index |= ngrams(text, n)
    return index


def overlapping(items: Iterable[str], index: set[tuple[str, ...]], n: int = N) -> list[tuple[int, tuple]]:
    """(position, a shared n-gram) for every item that shares at least one n-gram with ``index``."""
    hits = []
    for i, text in enumerate(items):
        shared = ngrams(text, n) & index
        if shared:
            hits.append((i, min(shared)))
    return hits
