"""Completions and chat through the real `openai` client against a real uvicorn server."""

from __future__ import annotations

import json

import requests

from tests.runtime.conftest import TEXTS
from tests.runtime.server.conftest import client


def test_completion_is_the_engines_greedy_output(server, make_llm):
    from quantkit.runtime import SamplingParams

    reference = make_llm(max_model_len=256).generate(TEXTS[:3], SamplingParams(temperature=0, max_tokens=12,
                                                                                ignore_eos=True))
    api = client(server)
    for text, ref in zip(TEXTS[:3], reference):
        out = api.completions.create(model="tiny", prompt=text, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
        assert out.choices[0].text == ref.text
        assert out.choices[0].finish_reason == "length"
        assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
        assert out.usage.completion_tokens == 12
        assert out.usage.total_tokens == len(ref.prompt_token_ids) + 12


def test_several_prompts_and_token_id_prompts_in_one_call(server):
    api = client(server)
    single = [api.completions.create(model="tiny", prompt=t, max_tokens=6, temperature=0).choices[0].text
              for t in TEXTS[:3]]
    batch = api.completions.create(model="tiny", prompt=TEXTS[:3], max_tokens=6, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == single
    from quantkit.models import load_tokenizer

    ids = load_tokenizer(server.app.state.engine_loop.engine.path).encode(TEXTS[0])
    by_ids = api.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == single[0]
    assert by_ids.usage.prompt_tokens == len(ids)


def test_streamed_completion_equals_the_whole_one(server):
    api = client(server)
    whole = api.completions.create(model="tiny", prompt=TEXTS[2], max_tokens=20, temperature=0)
    chunks = list(api.completions.create(model="tiny", prompt=TEXTS[2], max_tokens=20, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_sse_wire_format_ends_with_done(server):
    body = {"model": "tiny", "prompt": TEXTS[0], "max_tokens": 4, "stream": True, "temperature": 0}
    with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines(decode_unicode=True) if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["object"] == "text_completion" for e in events[:-1])


def test_chat_streaming_and_whole_agree(server):
    api = client(server)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXTS[1]}]
    whole = api.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    chunks = list(api.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_prompt_is_the_chat_template(server, make_llm):
    """The server's chat prompt is the model's template with the generation prompt, as LLM.chat builds it."""
    from quantkit.runtime import SamplingParams

    messages = [{"role": "user", "content": TEXTS[4]}]
    ref = make_llm(max_model_len=256).chat(messages, SamplingParams(temperature=0, max_tokens=8))[0]
    out = client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert out.choices[0].message.content == ref.text


def test_stop_string_and_seeded_sampling(server):
    api = client(server)
    free = api.completions.create(model="tiny", prompt=TEXTS[0], max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True}).choices[0].text
    stop = free.strip()[:2]
    cut = api.completions.create(model="tiny", prompt=TEXTS[0], max_tokens=12, temperature=0, stop=[stop],
                                 extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and stop not in cut.text and free.startswith(cut.text)
    a, b = (api.completions.create(model="tiny", prompt=TEXTS[0], max_tokens=12, temperature=1.0,
                                   seed=7).choices[0].text for _ in range(2))
    assert a == b


def test_models_and_health(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
