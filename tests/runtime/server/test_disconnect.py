"""A client that leaves mid-request (streaming or not) aborts its request and frees its KV blocks. The tests
read /stats right after the server told them something, so /stats must never lag behind that."""

from __future__ import annotations

import json
import socket
import time

import requests

from tests.runtime.server.conftest import metric, scrape, wait_idle

LONG = {"model": "tiny", "prompt": "Your order 12345 shipped yesterday", "max_tokens": 220, "ignore_eos": True,
        "temperature": 0}


def send_and_leave(server, payload: dict, leave_once: str) -> None:
    """POST payload on a raw socket and close it unread once /stats shows `leave_once` above 0."""
    body = json.dumps(payload).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(head + body)
        deadline = time.monotonic() + 20
        while requests.get(server.url + "/stats", timeout=10).json()[leave_once] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.005)


def _aborts(server) -> float:
    return metric(scrape(server), "vllm:request_success_total", finished_reason="abort")


def test_streaming_client_that_leaves_is_aborted(start_server):
    server = start_server()
    with requests.post(server.url + "/v1/completions", json={**LONG, "stream": True}, stream=True, timeout=60) as resp:
        lines = resp.iter_lines()
        first = next(line for line in lines if line)
        assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
        assert requests.get(server.url + "/stats", timeout=10).json()["kv_cache_usage"] > 0
    # the connection is closed here, long before 220 tokens
    stats = wait_idle(server)
    assert stats["num_running"] == 0 and stats["kv_cache_usage"] == 0.0
    m = scrape(server)
    assert metric(m, "vllm:request_success_total", finished_reason="abort") == 1
    assert metric(m, "vllm:generation_tokens_total") < 220


def test_non_streaming_client_that_leaves_is_aborted(start_server):
    server = start_server()
    send_and_leave(server, LONG, leave_once="num_running")
    stats = wait_idle(server)
    assert stats["kv_cache_usage"] == 0.0
    assert _aborts(server) == 1
    assert metric(scrape(server), "vllm:generation_tokens_total") < 220
    # the server is fine afterwards
    ok = requests.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 3}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_streaming_client_that_leaves_before_reading_is_aborted(start_server):
    server = start_server()
    send_and_leave(server, {**LONG, "stream": True}, leave_once="admitted_requests")
    stats = wait_idle(server)
    assert stats["kv_cache_usage"] == 0.0
    assert _aborts(server) == 1
    assert metric(scrape(server), "vllm:generation_tokens_total") < 220


def test_stats_already_show_what_a_client_was_told(start_server):
    """A slow snapshot widens the gap in which /stats could still serve the state from before the request was
    admitted or stepped (it used to: the tests above then read an idle engine before the abort was counted)."""
    server = start_server()
    engine = server.app.state.engine_loop.engine
    fast_stats = engine.stats

    def slow_stats():
        time.sleep(0.3)
        return fast_stats()

    engine.stats = slow_stats  # the loop thread picks it up at its next snapshot
    with requests.post(server.url + "/v1/completions", json={**LONG, "stream": True}, stream=True, timeout=60) as resp:
        stats = requests.get(server.url + "/stats", timeout=10).json()  # the headers follow the admission
        assert stats["admitted_requests"] == 1 and stats["num_waiting"] + stats["num_running"] == 1
        next(line for line in resp.iter_lines() if line)
        assert requests.get(server.url + "/stats", timeout=10).json()["kv_cache_usage"] > 0
    wait_idle(server)
    assert _aborts(server) == 1
