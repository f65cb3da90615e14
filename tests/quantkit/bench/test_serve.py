"""quantkit bench serve: arrival times, the report's arithmetic, and a run against a real tiny server."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from quantkit.bench.serve import (BenchConfig, RequestResult, arrival_gaps, dataset_requests, run,
                                  summarize, synthetic_requests)
from quantkit.errors import QuantkitError
from tests.runtime.server.conftest import start_server  # noqa: F401  (the fixture)


def test_arrivals_all_at_once_or_at_the_asked_mean_rate():
    assert arrival_gaps(5, math.inf, 1.0, 0) == [0.0] * 5
    for burstiness in (0.5, 1.0, 4.0):
        gaps = np.array(arrival_gaps(20000, 8.0, burstiness, 0))
        assert abs(gaps.mean() - 1 / 8) < 0.01
    # Poisson gaps have std == mean; burstier ones more, smoother ones less
    assert np.std(arrival_gaps(20000, 8.0, 1.0, 0)) == pytest.approx(1 / 8, rel=0.05)
    assert np.std(arrival_gaps(20000, 8.0, 0.5, 0)) > 1 / 8 > np.std(arrival_gaps(20000, 8.0, 4.0, 0))


def test_summary_arithmetic_on_hand_made_results():
    results = [RequestResult(True, 200, prompt_tokens=10, output_tokens=5, ttft=0.1, latency=0.5,
                             itl=[0.1, 0.1, 0.1, 0.1]),
               RequestResult(True, 200, prompt_tokens=20, output_tokens=3, ttft=0.3, latency=0.7, itl=[0.2, 0.2]),
               RequestResult(False, 503, error="busy")]
    r = summarize(results, duration=2.0, percentiles=[50.0])
    assert (r["completed"], r["failed"]) == (2, 1)
    assert r["total_input_tokens"] == 30 and r["total_output_tokens"] == 8
    assert r["request_throughput"] == 1.0 and r["output_throughput"] == 4.0 and r["total_token_throughput"] == 19.0
    assert r["mean_ttft_ms"] == pytest.approx(200.0)
    assert r["mean_tpot_ms"] == pytest.approx((100.0 + 200.0) / 2)  # (0.5-0.1)/4 and (0.7-0.3)/2
    assert r["median_itl_ms"] == pytest.approx(100.0)
    assert r["mean_e2el_ms"] == pytest.approx(600.0) and r["p50_e2el_ms"] == pytest.approx(600.0)
    assert r["errors"] == ["busy"]


def test_synthetic_lengths_and_dataset_rows(tiny_model, tmp_path):
    from quantkit.models import load_tokenizer

    specs = synthetic_requests(50, 40, 10, 0.5, seed=3, tokenizer=load_tokenizer(tiny_model))
    assert all(20 <= len(s.prompt) <= 60 and 5 <= s.output_len <= 15 for s in specs)
    assert len({len(s.prompt) for s in specs}) > 5
    assert specs == synthetic_requests(50, 40, 10, 0.5, seed=3, tokenizer=load_tokenizer(tiny_model))
    good = tmp_path / "d.jsonl"
    good.write_text('{"prompt": "a b", "output_len": 3}\n\n{"prompt": "c"}\n')
    assert [(s.prompt, s.output_len) for s in dataset_requests(good, 10, 7)] == [("a b", 3), ("c", 7)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(QuantkitError, match="bad.jsonl:2"):
        dataset_requests(bad, 10, 7)


def test_against_a_real_server(start_server, tiny_model):  # noqa: F811
    from quantkit.models import load_tokenizer

    server = start_server()
    report = run(BenchConfig(server.url, num_prompts=12, input_len=20, output_len=8, range_ratio=0.5,
                             tokenizer=str(tiny_model), request_rate=200.0, max_concurrency=4,
                             percentiles=[50.0, 99.0]))
    specs = synthetic_requests(12, 20, 8, 0.5, 0, tokenizer=load_tokenizer(tiny_model))
    assert report["model"] == "tiny" and report["completed"] == 12 and report["failed"] == 0
    assert report["total_output_tokens"] == sum(s.output_len for s in specs)
    assert report["total_input_tokens"] == sum(len(s.prompt) for s in specs)
    assert 0 < report["mean_ttft_ms"] <= report["mean_e2el_ms"]
    assert report["p50_itl_ms"] <= report["p99_itl_ms"]
    json.dumps(report)  # the --out file


def test_cli_errors_are_one_line(run_cli, tmp_path):
    code, _, err = run_cli("bench", "serve", "--url", "http://127.0.0.1:9", "--num-prompts", "1")
    assert code == 2 and "cannot read the served model" in err
    code, _, err = run_cli("bench", "serve", "--url", "http://127.0.0.1:9", "--dataset", tmp_path / "none.jsonl")
    assert code == 2 and "no such file" in err
