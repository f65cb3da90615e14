"""OpenAI-shaped errors: 400 for bad parameters and over-long prompts, 401 without the key, 404 for another
model's name, 503 + Retry-After when the waiting queue is full."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from tests.runtime.server.conftest import client, wait_idle


@pytest.mark.parametrize("body, param", [
    ({"prompt": "word " * 300}, "prompt"),  # longer than max_model_len 256
    ({"prompt": "word " * 100, "max_tokens": 200}, "prompt"),  # prompt + max_tokens over max_model_len
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "n": 2}, None),
    ({"prompt": "hi", "logprobs": 3, "stream": True}, None),  # streamed logprobs are not supported
    ({"prompt": []}, None),
    ({"prompt": [1, 2, 10 ** 6]}, "prompt"),  # a token id outside the vocabulary
    ({"prompt": [[1, 2], [-1]]}, "prompt"),
    ({}, "prompt"),
])
def test_bad_completion_requests_are_400_in_openai_shape(server, body, param):
    resp = requests.post(server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and error["message"]
    assert error["param"] == param


def test_openai_client_sees_bad_request_and_unknown_model(server):
    api = client(server)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
        api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 300}])
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="gpt-4", prompt="hi")
    assert wait_idle(server)["kv_cache_usage"] == 0.0


def test_api_key_guards_the_v1_routes_only(start_server):
    keyed = start_server(api_key="s3cret")
    with pytest.raises(openai.AuthenticationError):
        client(keyed).models.list()
    with pytest.raises(openai.AuthenticationError):
        client(keyed, api_key="wrong").completions.create(model="tiny", prompt="hi", max_tokens=2)
    out = client(keyed, api_key="s3cret").completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert out.usage.completion_tokens >= 1
    assert requests.get(keyed.url + "/health", timeout=10).status_code == 200
    assert requests.get(keyed.url + "/metrics", timeout=10).status_code == 200


def test_full_waiting_queue_is_503_with_retry_after(start_server):
    """One running slot, one waiting slot: of 6 simultaneous long requests some must be refused, and every
    admitted one runs to its end."""
    busy = start_server(max_waiting=1, max_num_seqs=1)
    body = {"model": "tiny", "prompt": "Your order", "max_tokens": 200, "ignore_eos": True, "temperature": 0}

    def post(_):
        return requests.post(busy.url + "/v1/completions", json=body, timeout=120)

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(post, range(6)))
    codes = sorted(r.status_code for r in responses)
    assert set(codes) == {200, 503}, codes
    for r in responses:
        if r.status_code == 503:
            assert r.headers["Retry-After"] == "1"
            assert r.json()["error"]["code"] == 503
        else:
            assert r.json()["usage"]["completion_tokens"] == 200
    assert requests.get(busy.url + "/health", timeout=10).status_code == 200


def test_an_engine_failure_is_a_500_and_an_unhealthy_server(start_server):
    broken = start_server()
    engine = broken.app.state.engine_loop.engine

    def step():
        raise RuntimeError("boom")

    engine.step = step  # the loop thread picks it up at its next step
    resp = requests.post(broken.url + "/v1/completions", json={"model": "tiny", "prompt": "hi"}, timeout=30)
    assert resp.status_code == 500 and "boom" in resp.json()["error"]["message"]
    health = requests.get(broken.url + "/health", timeout=10)
    assert health.status_code == 503 and "RuntimeError: boom" in health.json()["error"]["message"]
    # later requests fail at once instead of waiting for a loop that is gone
    later = requests.post(broken.url + "/v1/chat/completions", timeout=10,
                          json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert later.status_code == 500
