from collections import Counter

import pytest

from quantkit.data.records import Record
from quantkit.data.samples import length_bucket, render, select_samples, tokenize
from quantkit.models import load_tokenizer


def _records(n_a: int, n_b: int) -> list[Record]:
    return [Record(f"f:{i}", "text", text=f"t{i}", task="a" if i < n_a else "b") for i in range(n_a + n_b)]


def test_stratified_sampling_keeps_task_shares_and_is_seeded():
    records = _records(75, 25)
    ids = [[1] * 10 for _ in records]
    first = select_samples(records, ids, num_samples=20, max_seq_len=64, seed=3)
    again = select_samples(records, ids, num_samples=20, max_seq_len=64, seed=3)
    other = select_samples(records, ids, num_samples=20, max_seq_len=64, seed=4)
    assert Counter(r.task for r in first.records) == {"a": 15, "b": 5}
    assert [r.where for r in first.records] == [r.where for r in again.records]
    assert [r.where for r in first.records] != [r.where for r in other.records]


def test_truncation_is_counted_not_silent():
    records = _records(3, 0)
    ids = [[1] * 10, [1] * 40, [1] * 100]
    samples = select_samples(records, ids, num_samples=3, max_seq_len=32, seed=0)
    assert samples.num_truncated == 2
    assert samples.tokens_truncated == (40 - 32) + (100 - 32)
    assert max(len(x) for x in samples.input_ids) == 32


def test_fewer_records_than_requested_warns_and_uses_all():
    records = _records(4, 1)
    with pytest.warns(UserWarning, match="only 5 records available"):
        samples = select_samples(records, [[1, 2]] * 5, num_samples=128, max_seq_len=8)
    assert len(samples.input_ids) == 5


def test_length_buckets():
    assert length_bucket(5) == "0-127"
    assert length_bucket(128) == "128-511"
    assert length_bucket(5000) == ">=2048"


def test_chat_records_render_with_the_chat_template(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    chat = Record("f:1", "chat", messages=(("user", "hi"), ("assistant", "yo")))
    pair = Record("f:2", "pair", prompt="hi", completion="yo")
    text, templated = render(chat, tokenizer)
    assert templated and text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    assert render(pair, tokenizer)[0] == text  # a prompt/completion pair is a user turn + assistant turn
    ids = tokenize([chat], tokenizer)[0]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.decode(ids) == text


def test_packing_gives_full_length_chunks_across_record_boundaries():
    from quantkit.data.samples import pack_samples

    records = _records(30, 10)
    ids = [[i] * (5 + i % 7) for i in range(40)]
    samples = pack_samples(records, ids, num_samples=6, max_seq_len=16, separator=[999], seed=1)
    assert [len(x) for x in samples.input_ids] == [16] * 6
    stream = [t for x in samples.input_ids for t in x]
    assert stream.count(999) >= 5  # several records were joined, each followed by the separator
    used = sum(len(ids[int(r.where.split(":")[1])]) + 1 for r in samples.records)
    assert used - 6 * 16 == samples.tokens_truncated and samples.tokens_truncated < 16 + 12


def test_packing_warns_when_the_dataset_is_too_small():
    from quantkit.data.samples import pack_samples

    with pytest.warns(UserWarning, match="enough for 2 packed samples"):
        samples = pack_samples(_records(3, 0), [[1] * 10] * 3, num_samples=5, max_seq_len=12, separator=[0])
    assert len(samples.input_ids) == 2
