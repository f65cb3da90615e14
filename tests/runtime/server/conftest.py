"""Real uvicorn servers on free loopback ports over the tiny random Llama, and helpers to read them."""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture(scope="module")
def start_server(tiny_model):
    """start_server(**engine_and_server_options) -> a running Server; all are stopped after the module."""
    from quantkit.runtime import EngineConfig
    from quantkit.runtime.server import make_server

    servers = []

    def start(api_key=None, max_waiting=256, **engine):
        engine.setdefault("dtype", "float32")
        engine.setdefault("max_model_len", 256)
        engine.setdefault("num_kv_blocks", 96)
        server = make_server(EngineConfig(str(tiny_model), **engine), "tiny", api_key=api_key,
                             max_waiting=max_waiting)
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def server(start_server):
    return start_server()


def client(server, api_key="unused"):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=60)


def scrape(server) -> dict[tuple[str, tuple], float]:
    """/metrics parsed by prometheus_client: {(sample name, sorted labels): value}."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(samples: dict, name: str, **labels) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def wait_idle(server, timeout: float = 20) -> dict:
    """The engine's stats once nothing runs or waits (aborts are handled asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = requests.get(server.url + "/stats", timeout=10).json()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)
