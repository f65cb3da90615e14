"""/v1/completions with echo + logprobs (+ max_tokens 0): the legacy way to score a prompt, through the real
`openai` client and through lm-eval's local-completions, against transformers and HFLM."""

from __future__ import annotations

import pytest
import requests
import torch

from tests.runtime.conftest import TEXTS
from tests.runtime.server.conftest import client
from tests.runtime.test_prompt_logprobs import TOL, hf_logprobs


def test_echo_with_max_tokens_0_scores_the_prompt(server, tiny_hf, tiny_model):
    from quantkit.models import load_tokenizer

    ids = load_tokenizer(tiny_model).encode(TEXTS[4])
    out = client(server).completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=1)
    choice, expected = out.choices[0], hf_logprobs(tiny_hf, ids)
    assert choice.text == load_tokenizer(tiny_model).decode(ids) and choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = torch.stack([expected[p - 1, ids[p]] for p in range(1, len(ids))])
    torch.testing.assert_close(torch.tensor(lp.token_logprobs[1:]), want, **TOL)
    for p, top in enumerate(lp.top_logprobs[1:], start=1):  # the most likely token, plus the prompt's own
        assert max(top.values()) == pytest.approx(float(expected[p - 1].max()), abs=1e-4)
        assert lp.token_logprobs[p] in top.values()


def test_echo_with_generated_tokens_covers_prompt_and_completion(server, tiny_hf):
    out = client(server).completions.create(model="tiny", prompt=TEXTS[0], max_tokens=3, echo=True, logprobs=2,
                                            temperature=0, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(TEXTS[0]) and out.usage.completion_tokens == 3
    assert "".join(lp.tokens) == choice.text
    prompt_len = out.usage.prompt_tokens
    ids = requests.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": TEXTS[0], "max_tokens": 3,
                                                              "temperature": 0, "ignore_eos": True}, timeout=30)
    assert ids.status_code == 200 and ids.json()["choices"][0]["logprobs"] is None  # not asked: none
    assert len(lp.token_logprobs) == prompt_len + 3 and all(v is not None for v in lp.token_logprobs[1:])
    assert all(len(top) <= 3 for top in lp.top_logprobs[1:])  # 2 alternatives + the token itself
    # the generated tokens are greedy: each is its position's most likely token
    assert all(lp.token_logprobs[i] == max(lp.top_logprobs[i].values()) for i in range(prompt_len, prompt_len + 3))


def test_logprobs_without_echo_cover_the_completion_only(server):
    out = client(server).completions.create(model="tiny", prompt=TEXTS[2], max_tokens=4, logprobs=0, temperature=0,
                                            extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 4 and "".join(lp.tokens) == out.choices[0].text
    assert all(len(top) == 1 for top in lp.top_logprobs)


@pytest.mark.parametrize("body, param", [
    ({"prompt": "hi", "max_tokens": 0, "logprobs": 1}, "max_tokens"),  # nothing to return without echo
    ({"prompt": "hi", "echo": True, "stream": True}, None),
    ({"prompt": "hi", "logprobs": 21}, "logprobs"),
])
def test_unsupported_scoring_requests_are_400(server, body, param):
    resp = requests.post(server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_chat_logprobs_are_still_refused(server):
    resp = requests.post(server.url + "/v1/chat/completions", timeout=30,
                         json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "logprobs": True})
    assert resp.status_code == 400 and "logprobs" in resp.json()["error"]["message"]


def test_lm_eval_local_completions_loglikelihood_equals_hflm(server, tiny_model):
    """lm-eval's own API client (echo + logprobs, max_tokens 1) against HFLM on the same weights."""
    from quantkit.eval.lm_tasks import go_offline

    go_offline()
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from transformers import AutoModelForCausalLM

    from quantkit.models import load_tokenizer
    from tests.quantkit.eval.test_runtime_lm import PAIRS, instances

    api = LocalCompletionsAPI(base_url=f"{server.url}/v1/completions", model="tiny", tokenizer_backend="huggingface",
                              tokenizer=str(tiny_model), tokenized_requests=True, max_retries=1, max_length=64)
    hf = HFLM(pretrained=AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval(),
              tokenizer=load_tokenizer(tiny_model), batch_size=2)
    got = api.loglikelihood(instances("loglikelihood", PAIRS), disable_tqdm=True)
    expected = hf.loglikelihood(instances("loglikelihood", PAIRS), disable_tqdm=True)
    assert [g for _, g in got] == [g for _, g in expected]
    torch.testing.assert_close(torch.tensor([s for s, _ in got]), torch.tensor([s for s, _ in expected]),
                               rtol=0, atol=1e-4)
