"""Prometheus metrics under vLLM v1's names and buckets, so existing vLLM dashboards read them unchanged.

Each server app owns its CollectorRegistry (several apps can live in one process, as in the tests).
The engine thread is the only writer; prometheus_client's metrics are thread-safe for the scrape.
Counters are exported with the `_total` suffix (vllm:num_preemptions -> vllm:num_preemptions_total).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from quantkit.runtime.engine import EngineStats
from quantkit.runtime.outputs import RequestOutput

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort")


class ServerMetrics:
    def __init__(self, model_name: str):
        disable_created_metrics()  # vLLM exports no *_created series; dashboards do not expect them
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}
        names = list(labels)

        def counter(name, doc, extra=()):
            return Counter(name, doc, names + list(extra), registry=self.registry)

        def gauge(name, doc):
            return Gauge(name, doc, names, registry=self.registry).labels(**labels)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry).labels(**labels)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens.", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Per-request mean time per output token after the first.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.", REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled.",
                               REQUEST_LATENCY_BUCKETS)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Tokens computed per engine step.",
                                          ITERATION_TOKENS_BUCKETS)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.")
        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.preemptions = counter("vllm:num_preemptions", "Preemptions (recompute).").labels(**labels)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefilled prompt tokens.").labels(**labels)
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.").labels(**labels)
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
                                      ).labels(**labels)
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."
                                   ).labels(**labels)
        success = counter("vllm:request_success", "Finished requests by finish reason.", ["finished_reason"])
        self.success = {reason: success.labels(**labels, finished_reason=reason) for reason in FINISH_REASONS}
        self._last = {"preemptions": 0, "queries": 0, "hits": 0}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def on_step(self, stats: EngineStats, step_tokens: int | None) -> None:
        """Gauges from the engine's state; counters advance by the engine's deltas since the last call."""
        self.kv_usage.set(stats.kv_cache_usage)
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        if step_tokens:
            self.iteration_tokens.observe(step_tokens)
        for key, metric, value in (("preemptions", self.preemptions, stats.num_preemptions),
                                   ("queries", self.prefix_queries, stats.prefix_cache_queries),
                                   ("hits", self.prefix_hits, stats.prefix_cache_hits)):
            if value > self._last[key]:
                metric.inc(value - self._last[key])
            self._last[key] = value

    def on_scheduled(self, queue_seconds: float) -> None:
        self.queue.observe(queue_seconds)

    def on_output(self, out: RequestOutput, inter_token_seconds: float | None) -> None:
        """One engine output: a new token (and maybe the end) of a request, or its abort."""
        m = out.metrics
        if out.delta_token_ids:
            self.generation_tokens.inc(len(out.delta_token_ids))
            if m.output_tokens == len(out.delta_token_ids):  # its first token: the prompt is prefilled
                self.prompt_tokens.inc(m.prompt_tokens)
                if m.ttft_ms is not None:
                    self.ttft.observe(m.ttft_ms / 1e3)
            elif inter_token_seconds is not None:
                self.itl.observe(inter_token_seconds)
        if out.finished:
            self.success[out.finish_reason].inc()
            if m.tpot_ms is not None and out.finish_reason != "abort":
                self.tpot.observe(m.tpot_ms / 1e3)

    def on_finished(self, e2e_seconds: float) -> None:
        self.e2e.observe(e2e_seconds)
