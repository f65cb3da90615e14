"""The bounded load test: passes on a healthy server, and its checks catch leaks and miscounts."""

from __future__ import annotations

from quantkit.bench.serve_load import BAD, LEFT, OK, REJECTED, LoadConfig, Outcome, check, make_plans, run


def test_small_load_on_the_tiny_model_passes(tiny_model):
    report = run(LoadConfig(model=str(tiny_model), num_requests=60, concurrency=24, max_model_len=256,
                            max_prompt_words=12, max_num_seqs=8, max_waiting=4, num_kv_blocks=40, seed=1))
    failed = [(name, detail) for name, ok, detail in report.checks if not ok]
    assert not failed
    kinds = {key.split("/")[0] for key in report.counts}
    assert kinds == {"valid", "leave", "invalid"}
    assert report.responses_503 > 0  # 24 clients against 8 running + 4 waiting
    assert sum(report.counts.values()) == 60


def test_plans_mix_kinds_and_are_reproducible():
    plans = make_plans(LoadConfig(num_requests=300), "m")
    assert plans == make_plans(LoadConfig(num_requests=300), "m")
    share = {k: sum(p.kind == k for p in plans) / 300 for k in ("valid", "leave", "invalid")}
    assert 0.05 < share["invalid"] < 0.16 and 0.09 < share["leave"] < 0.22
    assert {p.chat for p in plans} == {True, False} and {p.stream for p in plans} == {True, False}


def _metrics(**over):
    base = {"vllm:request_success_total{stop}": 1, "vllm:request_success_total{length}": 1,
            "vllm:request_success_total{abort}": 1, "vllm:e2e_request_latency_seconds_count": 3,
            "vllm:generation_tokens_total": 10, "vllm:kv_cache_usage_perc": 0.0, "vllm:num_requests_running": 0,
            "vllm:num_requests_waiting": 0}
    return base | over


def test_checks_catch_leaked_blocks_and_counts_that_do_not_add_up():
    outcomes = [Outcome(0, "valid", OK, 200, 3, 4), Outcome(1, "valid", OK, 200, 3, 4),
                Outcome(2, "leave", LEFT), Outcome(3, "invalid", REJECTED, 400)]
    failing = lambda after, outs=outcomes: {n for n, ok, _ in check(outs, {}, after, 200) if not ok}  # noqa: E731
    assert failing(_metrics()) == set()
    assert failing(_metrics(**{"vllm:kv_cache_usage_perc": 0.1})) == {"KV usage back to 0"}
    assert "finished (stop+length) = completed + those that left after finishing" in failing(
        _metrics(**{"vllm:request_success_total{stop}": 0}))
    assert "aborted <= clients that left" in failing(_metrics(**{"vllm:request_success_total{abort}": 2}))
    assert failing(_metrics(), outcomes + [Outcome(4, "valid", BAD, 500)]) == {
        "every valid request completed or was refused with 503 + Retry-After"}
