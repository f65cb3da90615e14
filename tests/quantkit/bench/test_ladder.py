"""quantkit bench ladder on the tiny model: every step measured on the same workload, table and plot written."""

from __future__ import annotations

import json

import pytest

from tests.conftest import build_tiny_model


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-long"), max_positions=1024)


def test_ladder_rows_table_and_plot(long_tiny, run_cli, tmp_path):
    code, out, err = run_cli("bench", "ladder", "--model", long_tiny, "--num-requests", "6", "--batch-size", "2",
                             "--kv-budget-mib", "0.5", "--tune", "4", "--out", tmp_path)
    assert code == 0, err
    result = json.loads((tmp_path / "ladder.json").read_text())
    names = [r["name"] for r in result["rows"]]
    assert names[:4] == ["transformers static batching", "continuous batching", "+ FP8 KV cache", "+ prefix caching"]
    total = result["rows"][0]["output_tokens"]
    assert all(r["output_tokens"] == total and r["throughput"] > 0 for r in result["rows"])
    by = {r["name"]: r for r in result["rows"]}
    assert by["continuous batching"]["max_concurrency"] <= 2 and by["continuous batching"]["prefix_hit_rate"] == 0
    assert by["+ prefix caching"]["prefix_hit_rate"] > 0.3  # the shared system prompt, after the first batch
    fp32, fp8 = by["continuous batching"]["settings"], by["+ FP8 KV cache"]["settings"]
    assert fp8["kv_blocks"] > fp32["kv_blocks"]  # the same MiB holds more FP8 tokens
    table = (tmp_path / "ladder.md").read_text().splitlines()
    assert len(table) == 2 + len(names) and "tok/s" in table[0]
    assert (tmp_path / "ladder.png").stat().st_size > 10_000


def test_bad_tune_is_a_usage_error(run_cli, tmp_path):
    code, _, err = run_cli("bench", "ladder", "--tune", "a,b", "--out", tmp_path)
    assert code == 2 and "--tune" in err
