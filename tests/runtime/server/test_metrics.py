"""/metrics scraped with prometheus_client's parser: vLLM's names, labels and buckets, and counters that add
up to what the clients received."""

from __future__ import annotations

from tests.runtime.conftest import TEXTS
from tests.runtime.server.conftest import client, metric, scrape, wait_idle

VLLM_NAMES = [
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
    "vllm:request_success", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:iteration_tokens_total",
]


def test_metric_families_and_buckets_are_vllms(start_server):
    from prometheus_client.parser import text_string_to_metric_families
    import requests

    fresh = start_server()
    client(fresh).completions.create(model="tiny", prompt="hi", max_tokens=3)
    text = requests.get(fresh.url + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(VLLM_NAMES) <= set(families)
    assert families["vllm:num_preemptions"].type == "counter"
    assert families["vllm:kv_cache_usage_perc"].type == "gauge"
    ttft_buckets = [s.labels["le"] for s in families["vllm:time_to_first_token_seconds"].samples
                    if s.name.endswith("_bucket")]
    assert ttft_buckets[:3] == ["0.001", "0.005", "0.01"] and ttft_buckets[-2:] == ["2560.0", "+Inf"]
    assert len(ttft_buckets) == 23
    e2e = [s.labels["le"] for s in families["vllm:e2e_request_latency_seconds"].samples if s.name.endswith("_bucket")]
    assert e2e[0] == "0.3" and e2e[-2] == "7680.0"
    assert all(s.labels["model_name"] == "tiny" for f in families.values() for s in f.samples)
    assert "vllm:num_preemptions_total" in text and "_created" not in text


def test_counters_add_up_to_what_clients_received(start_server):
    fresh = start_server()
    api = client(fresh)
    outs = [api.completions.create(model="tiny", prompt=t, max_tokens=5 + i, temperature=0)
            for i, t in enumerate(TEXTS)]
    shared = " ".join(TEXTS[2:5])  # well over two 16-token blocks: the second call hits the prefix cache
    outs += [api.completions.create(model="tiny", prompt=shared, max_tokens=5, temperature=0) for _ in range(2)]
    wait_idle(fresh)
    m = scrape(fresh)
    n = len(outs)
    completion = sum(o.usage.completion_tokens for o in outs)
    assert metric(m, "vllm:request_success_total") == n
    assert metric(m, "vllm:request_success_total", finished_reason="stop") == sum(
        o.choices[0].finish_reason == "stop" for o in outs)
    assert metric(m, "vllm:generation_tokens_total") == completion
    assert metric(m, "vllm:prompt_tokens_total") == sum(o.usage.prompt_tokens for o in outs)
    assert metric(m, "vllm:time_to_first_token_seconds_count") == n
    assert metric(m, "vllm:e2e_request_latency_seconds_count") == n
    assert metric(m, "vllm:request_queue_time_seconds_count") == n
    assert metric(m, "vllm:inter_token_latency_seconds_count") == completion - n
    assert metric(m, "vllm:kv_cache_usage_perc") == 0.0
    assert metric(m, "vllm:num_requests_running") == 0 and metric(m, "vllm:num_requests_waiting") == 0
    stats = wait_idle(fresh)
    assert metric(m, "vllm:prefix_cache_queries_total") == stats["prefix_cache_queries"] > 0
    assert metric(m, "vllm:prefix_cache_hits_total") == stats["prefix_cache_hits"] >= 32
    assert metric(m, "vllm:iteration_tokens_total_sum") == stats["computed_tokens"]
