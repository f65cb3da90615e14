"""Guess a record's language from its letters, for traffic without ``lang`` tags (the normal case).

Writing systems decide most languages outright (Han -> zh, kana -> ja, Hangul -> ko, Cyrillic -> ru, Arabic ->
ar); Latin-script text is "en" when it uses several distinct English function words (words that other Latin-script
languages do not share, so "a", "in" and "on" are left out), otherwise "latin" (a language we cannot name).
Counting distinct words rather than their share keeps code, whose identifiers outnumber its prose, English.
"""

from __future__ import annotations

import re
from collections import Counter

from quantkit.data.records import Record

_SCRIPTS = (  # (language, character class), checked by share of letters
    ("ja", re.compile(r"[\u3040-\u30ff]")),  # kana first: Japanese text also uses Han characters
    ("ko", re.compile(r"[\uac00-\ud7af]")),
    ("zh", re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf]")),
    ("ru", re.compile(r"[\u0400-\u04ff]")),
    ("ar", re.compile(r"[\u0600-\u06ff]")),
)
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")
_EN_WORDS = frozenset("the and of to is are was were that this for with you what which how does can should "
                      "would they".split())
MIN_SCRIPT_SHARE = 0.2  # of letters; a few loan characters do not make a language
MIN_EN_WORDS = 2  # distinct ones: a one-line coding request has about two


def guess_language(text: str) -> str:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return "unknown"
    joined = "".join(letters)
    for lang, pattern in _SCRIPTS:
        if len(pattern.findall(joined)) >= MIN_SCRIPT_SHARE * len(letters):
            return lang
    if len(_LATIN.findall(joined)) < MIN_SCRIPT_SHARE * len(letters):
        return "unknown"
    words = re.findall(r"[a-z]+", text.lower())
    return "en" if len(_EN_WORDS.intersection(words)) >= MIN_EN_WORDS else "latin"


def record_language(record: Record) -> str:
    """The record's tag when it has one, else the guess from its text."""
    return record.lang if record.lang != "unknown" else guess_language(record.plain_text())


def language_shares(records: list[Record]) -> dict[str, float]:
    counts = Counter(record_language(r) for r in records)
    return {lang: n / len(records) for lang, n in counts.most_common()}
