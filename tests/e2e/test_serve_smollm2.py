"""`quantkit serve`'s app on the real SmolLM2: the openai client gets the offline engine's greedy text, chat
streams agree with whole answers, and /metrics adds up."""

from __future__ import annotations

import pytest

from tests.runtime.server.conftest import client, metric, scrape, wait_idle

pytestmark = pytest.mark.e2e
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,"]


@pytest.fixture(scope="module")
def smollm2_server(smollm2):
    from quantkit.runtime import EngineConfig
    from quantkit.runtime.server import make_server

    with make_server(EngineConfig("smollm2-135m", dtype="float32", max_model_len=512), "smollm2-135m") as server:
        yield server


def test_completions_are_the_offline_engines(smollm2_server):
    from quantkit.runtime import LLM, SamplingParams

    api = client(smollm2_server)
    outs = [api.completions.create(model="smollm2-135m", prompt=p, max_tokens=12, temperature=0) for p in PROMPTS]
    assert "Paris" in outs[0].choices[0].text
    reference = LLM("smollm2-135m", dtype="float32", max_model_len=512, num_kv_blocks=64).generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=12))
    assert [o.choices[0].text for o in outs] == [r.text for r in reference]


def test_chat_stream_and_metrics(smollm2_server):
    api = client(smollm2_server)
    before = scrape(smollm2_server)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = api.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=24, temperature=0)
    assert "Paris" in whole.choices[0].message.content
    chunks = list(api.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=24, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
    wait_idle(smollm2_server)
    after = scrape(smollm2_server)
    grew = {name: metric(after, name) - metric(before, name)
            for name in ("vllm:request_success_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total")}
    assert grew == {"vllm:request_success_total": 2, "vllm:generation_tokens_total": 2 * whole.usage.completion_tokens,
                    "vllm:prompt_tokens_total": 2 * whole.usage.prompt_tokens}
    assert metric(after, "vllm:kv_cache_usage_perc") == 0.0
