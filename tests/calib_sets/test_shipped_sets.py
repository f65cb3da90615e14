"""The shipped calibration sets are real, varied, tagged, documented, and their eval splits are held out."""

import statistics
from collections import Counter

import pytest

from quantkit.data.readers import read_records, shipped_set_names, shipped_sets_dir
from quantkit.data.samples import tokenize
from quantkit.models import load_tokenizer

EXPECTED = {
    "support_chat_en": ("chat", "en"),
    "coding_python": ("chat", "en"),
    "rag_product_docs_en": ("pair", "en"),
    "customer_service_zh": ("chat", "zh"),
    "meeting_notes_en": ("pair", "en"),
    "pile_style_en": ("text", "en"),
}
CARD_SECTIONS = ("Purpose", "Fields", "Length statistics", "Language", "License")


def test_every_expected_set_ships():
    assert set(EXPECTED) <= set(shipped_set_names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_set_is_large_tagged_and_held_out(name):
    shape, lang = EXPECTED[name]
    train, held_out = read_records(name), read_records(f"{name}:eval")
    assert len(train) >= 200 and len(held_out) >= 50
    assert {r.shape for r in train + held_out} == {shape}
    assert {r.lang for r in train + held_out} == {lang}
    tasks = Counter(r.task for r in train)
    assert len(tasks) >= 4 and "unknown" not in tasks
    assert tasks.most_common(1)[0][1] < 0.5 * len(train)  # no single task dominates
    train_texts = [r.plain_text() for r in train]
    assert len(set(train_texts)) == len(train_texts), "duplicate records in train"
    assert not set(train_texts) & {r.plain_text() for r in held_out}, "eval overlaps train"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_set_has_a_data_card(name):
    card = (shipped_sets_dir() / name / "README.md").read_text(encoding="utf-8")
    for section in CARD_SECTIONS:
        assert section in card, f"{name} data card lacks '{section}'"


@pytest.mark.e2e
def test_rag_contexts_are_long(smollm2):
    lengths = [len(ids) for ids in tokenize(read_records("rag_product_docs_en"), load_tokenizer(smollm2))]
    assert 1000 <= statistics.median(lengths) <= 2000
    assert sum(900 <= n <= 2300 for n in lengths) >= 0.9 * len(lengths)
