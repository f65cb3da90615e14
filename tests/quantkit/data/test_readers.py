import csv
import json

import pytest

from quantkit.data.readers import read_records, resolve_dataset
from quantkit.errors import QuantkitError
from tests.conftest import chat_rows, write_jsonl


def test_jsonl_reads_all_three_shapes_with_locations(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
         "task": "greet", "lang": "en"},
        {"prompt": "Summarize: a b c", "completion": "abc", "task": "summary"},
        {"text": "Plain pile-style text."},
    ])
    records = read_records(str(path))
    assert [r.shape for r in records] == ["chat", "pair", "text"]
    assert records[0].messages == (("user", "hi"), ("assistant", "hello"))
    assert records[1].lang == "unknown" and records[1].task == "summary"
    assert records[2].where == f"{path}:3"


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": "broken"\n')
    with pytest.raises(QuantkitError, match=r"bad\.jsonl:3: malformed JSON line"):
        read_records(str(path))


def test_record_without_usable_text_is_an_error_not_a_skip(tmp_path):
    path = write_jsonl(tmp_path / "empty_text.jsonl", [{"text": "fine"}, {"text": "   ", "task": "x"}])
    with pytest.raises(QuantkitError, match=r"empty_text\.jsonl:2: record has no usable text"):
        read_records(str(path))


def test_bad_messages_are_errors(tmp_path):
    path = write_jsonl(tmp_path / "roles.jsonl", [{"messages": [{"role": "wizard", "content": "hi"}]}])
    with pytest.raises(QuantkitError, match=r"roles\.jsonl:1: messages\[0\] needs a role"):
        read_records(str(path))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(QuantkitError, match="not found"):
        read_records(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(QuantkitError, match="is empty"):
        read_records(str(tmp_path / "empty.jsonl"))


def test_unreadable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(QuantkitError, match="not UTF-8"):
        read_records(str(path))


def test_json_csv_parquet_text_and_datasets_dir_agree(tmp_path):
    rows = chat_rows(5)
    (tmp_path / "set.json").write_text(json.dumps(rows))
    with open(tmp_path / "set.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["messages", "task", "lang"])
        writer.writeheader()
        writer.writerows([{**r, "messages": json.dumps(r["messages"])} for r in rows])
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{**r, "messages": json.dumps(r["messages"])} for r in rows]),
                   tmp_path / "set.parquet")
    from datasets import Dataset

    Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf_dir"))

    expected = [(r.messages, r.task, r.lang) for r in read_records(str(write_jsonl(tmp_path / "set.jsonl", rows)))]
    for name in ("set.json", "set.csv", "set.parquet", "hf_dir"):
        got = [(r.messages, r.task, r.lang) for r in read_records(str(tmp_path / name))]
        assert got == expected, name


def test_plain_text_splits_paragraphs(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("First paragraph\nstill first.\n\n\nSecond one.\n")
    records = read_records(str(path))
    assert [r.text for r in records] == ["First paragraph\nstill first.", "Second one."]
    assert records[1].where.endswith("corpus.txt:5")


def test_shipped_set_names_and_splits_resolve():
    assert resolve_dataset("support_chat_en").name == "train.jsonl"
    assert resolve_dataset("support_chat_en:eval").name == "eval.jsonl"
    with pytest.raises(QuantkitError, match="unknown split"):
        resolve_dataset("support_chat_en:test")


def test_comma_separated_datasets_are_read_and_hashed_together(tmp_path):
    from quantkit.data.readers import dataset_hash

    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "one"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": "two"}, {"text": "three"}])
    assert [r.text for r in read_records(f"{a},{b}")] == ["one", "two", "three"]
    assert dataset_hash(f"{a},{b}") != dataset_hash(f"{b},{a}") != dataset_hash(str(a))
