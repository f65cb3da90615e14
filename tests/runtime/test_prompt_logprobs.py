"""Prompt log-probabilities (SamplingParams.prompt_logprobs), and the sampled tokens' (SamplingParams.logprobs),
against a plain transformers forward, float32."""

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.runtime import SamplingParams
from tests.runtime.conftest import TEXTS

TOL = dict(rtol=1e-4, atol=1e-4)


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row p - 1 is the distribution of the token at p."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def assert_matches_transformers(model, out, first: int = 1, top: int = 0) -> None:
    ids = out.prompt_token_ids
    expected = hf_logprobs(model, ids)
    scored = out.prompt_logprobs
    assert len(scored) == len(ids) and all(s is None for s in scored[:first])
    for p in range(first, len(ids)):
        entry, row = scored[p], expected[p - 1]
        assert entry.token_id == ids[p]
        torch.testing.assert_close(torch.tensor(entry.logprob), row[ids[p]], **TOL)
        assert entry.greedy_token_id == int(row.argmax()) and entry.is_greedy == (int(row.argmax()) == ids[p])
        values, indices = row.topk(top)
        assert [t for t, _ in entry.top] == indices.tolist()
        torch.testing.assert_close(torch.tensor([lp for _, lp in entry.top]), values, **TOL)


@pytest.mark.parametrize("options", [
    dict(),
    dict(max_num_batched_tokens=5, block_size=4),  # every prompt is prefilled in chunks
], ids=["whole", "chunked"])
def test_prompt_logprobs_equal_transformers(make_llm, tiny_hf, options):
    llm = make_llm(**options)
    outs = llm.generate(TEXTS, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))
    for out in outs:
        assert_matches_transformers(tiny_hf, out, top=3)


def test_asking_for_prompt_logprobs_leaves_the_generated_tokens_alone(make_llm):
    llm = make_llm(max_num_batched_tokens=7)
    plain = llm.generate(TEXTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    scored = llm.generate(TEXTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=0))
    assert [o.token_ids for o in scored] == [o.token_ids for o in plain]
    assert all(o.prompt_logprobs is None for o in plain)
    assert all(len(o.prompt_logprobs) == len(o.prompt_token_ids) for o in scored)


def test_a_prefix_cache_hit_stops_before_the_first_scored_position(make_llm, tiny_hf):
    llm = make_llm(block_size=4)
    head = llm.tokenizer.encode(TEXTS[0])
    ids = llm.tokenizer.encode(TEXTS[1])  # starts with TEXTS[0]
    assert ids[:len(head)] == head and len(head) >= 9
    llm.generate([ids], SamplingParams(temperature=0, max_tokens=1))  # caches all of ids' full blocks

    every = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))[0]
    assert every.metrics.cached_prompt_tokens == 0  # position 0's logits score token 1
    assert_matches_transformers(tiny_hf, every)

    first = len(head)  # score the continuation after TEXTS[0]: its blocks before position first - 1 are reused
    tail = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2,
                                              prompt_logprobs_from=first))[0]
    assert tail.metrics.cached_prompt_tokens == (first - 1) // 4 * 4 > 0
    assert_matches_transformers(tiny_hf, tail, first=first, top=2)


def test_only_the_positions_asked_for_pay_the_lm_head(make_llm, monkeypatch):
    llm = make_llm(enable_prefix_caching=False)
    model, rows = llm.engine.runner.model, []
    original = model.compute_logits

    def compute_logits(hidden):
        rows.append(len(hidden))
        return original(hidden)

    monkeypatch.setattr(model, "compute_logits", compute_logits)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS[:3]]
    params = [SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0, prompt_logprobs_from=len(p) - 2)
              for p in prompts]
    outs = llm.generate(prompts, params)
    assert rows == [3, 3 * 2]  # one step: the last row of each prompt to sample from, then 2 scored rows each
    assert all(sum(s is not None for s in o.prompt_logprobs) == 2 for o in outs)


def test_preempted_requests_keep_one_logprob_per_position(make_llm, tiny_hf):
    llm = make_llm(block_size=4, num_kv_blocks=17, max_model_len=64, max_num_batched_tokens=24)
    outs = llm.generate(TEXTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=1))
    assert llm.stats().num_preemptions > 0
    for out in outs:
        assert_matches_transformers(tiny_hf, out, top=1)


def test_a_first_position_past_the_prompt_scores_nothing(make_llm):
    ids = make_llm().tokenizer.encode(TEXTS[2])
    out = make_llm().generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0,
                                                    prompt_logprobs_from=len(ids) + 5))[0]
    assert out.prompt_logprobs == [None] * len(ids)


def test_sampled_token_logprobs_equal_transformers(make_llm, tiny_hf):
    llm = make_llm(max_num_batched_tokens=7)
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=2)
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=5, ignore_eos=True, logprobs=0)
    outs = llm.generate(TEXTS[:4], [greedy, sampled] * 2)
    for out in outs:
        expected = hf_logprobs(tiny_hf, out.prompt_token_ids + out.token_ids)
        assert [e.token_id for e in out.logprobs] == out.token_ids
        for j, entry in enumerate(out.logprobs):
            row = expected[len(out.prompt_token_ids) - 1 + j]
            torch.testing.assert_close(torch.tensor(entry.logprob), row[entry.token_id], **TOL)
            assert entry.greedy_token_id == int(row.argmax())
            assert [t for t, _ in entry.top] == row.topk(len(entry.top)).indices.tolist()
    assert all(e.is_greedy and len(e.top) == 2 for e in outs[0].logprobs)


@pytest.mark.parametrize("bad", [dict(prompt_logprobs=-1), dict(prompt_logprobs_from=-2), dict(logprobs=-1)])
def test_bad_prompt_logprob_options_are_refused(bad):
    with pytest.raises(QuantkitError, match=next(iter(bad))):
        SamplingParams(**bad)
