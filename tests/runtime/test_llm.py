"""LLM / LLMEngine end to end on the tiny random Llama (fast); the real-model checks are in tests/e2e."""

import logging

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.runtime import SamplingParams
from tests.runtime.conftest import TEXTS, first_token_logits

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize("options", [
    dict(),
    dict(enable_prefix_caching=False),
    dict(block_size=4, num_kv_blocks=17, max_model_len=64, max_num_batched_tokens=24),  # preempts, chunks
], ids=["prefix-cache", "no-prefix-cache", "preempt-chunked"])
def test_greedy_equals_transformers(make_llm, tiny_reference, options):
    llm = make_llm(**options)
    prompts, expected = tiny_reference
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert all(o.finish_reason == "length" and o.finished for o in outs)
    stats = llm.stats()
    assert stats.num_running == stats.num_waiting == 0 and stats.kv_cache_usage == 0.0
    if "num_kv_blocks" in options:
        assert stats.num_preemptions > 0 and sum(o.metrics.preemptions for o in outs) == stats.num_preemptions


def test_first_token_logits_match_transformers_chunked_or_not(make_llm, tiny_hf):
    llm = make_llm(max_num_batched_tokens=5)
    ids = llm.tokenizer.encode(TEXTS[4] + " " + TEXTS[6])
    chunked = first_token_logits(llm, [ids])[0]
    whole = first_token_logits(make_llm(), [ids])[0]
    reference = tiny_hf(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(whole, reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-4)


def test_prefix_cache_hits_are_reported(make_llm):
    llm = make_llm(block_size=4)
    first = llm.generate(TEXTS[0], GREEDY)[0]
    second = llm.generate(TEXTS[1], GREEDY)[0]  # starts with TEXTS[0]
    assert first.metrics.cached_prompt_tokens == 0
    shared = len(llm.tokenizer.encode(TEXTS[0])) // 4 * 4
    assert second.metrics.cached_prompt_tokens == shared > 0
    stats = llm.stats()
    assert stats.prefix_cache_hits == shared and 0 < stats.prefix_cache_hit_rate < 1


def test_metrics_of_a_request(make_llm):
    out = make_llm().generate([TEXTS[2]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    m = out.metrics
    assert (m.prompt_tokens, m.output_tokens, m.preemptions) == (len(out.prompt_token_ids), 5, 0)
    assert m.ttft_ms > 0 and m.tpot_ms > 0 and m.tokens_per_second > 0
    assert out.prompt == TEXTS[2] and out.text


def test_prompts_over_max_model_len_are_refused(make_llm):
    llm = make_llm(max_model_len=16)
    with pytest.raises(QuantkitError, match="max_model_len is 16"):
        llm.generate(TEXTS[4] * 3)
    with pytest.raises(QuantkitError, match="empty"):
        llm.generate([[]])


def test_generation_stops_at_max_model_len(make_llm):
    llm = make_llm(max_model_len=20)
    ids = llm.tokenizer.encode(TEXTS[0])
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(ids) + len(out.token_ids) == 20


def test_stop_strings_stop_tokens_and_eos(make_llm):
    llm = make_llm()
    full = llm.generate(TEXTS[3], GREEDY)[0]
    stop_token = full.token_ids[4]
    out = llm.generate(TEXTS[3], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                stop_token_ids=[stop_token]))[0]
    first = full.token_ids.index(stop_token)
    assert out.token_ids == full.token_ids[:first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_token)
    stop = full.text[len(full.text) // 2:][:3]
    out = llm.generate(TEXTS[3], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))[0]
    assert out.text == full.text[:full.text.index(stop)] and (out.finish_reason, out.stop_reason) == ("stop", stop)
    llm.engine.eos_token_ids = {stop_token}
    eos = llm.generate(TEXTS[3], SamplingParams(temperature=0, max_tokens=12))[0]
    assert eos.token_ids == full.token_ids[:first + 1] and (eos.finish_reason, eos.stop_reason) == ("stop", None)
    assert llm.generate(TEXTS[3], GREEDY)[0].token_ids == full.token_ids  # ignore_eos


def test_abort_frees_the_request(make_llm):
    llm = make_llm()
    engine = llm.engine
    keep = engine.add_request(TEXTS[2], GREEDY)
    drop = engine.add_request(TEXTS[4], GREEDY)
    engine.step()
    aborted = engine.abort(drop)
    assert aborted.finished and aborted.finish_reason == "abort" and len(aborted.token_ids) == 1
    assert engine.abort(drop) is None and engine.abort("nope") is None
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in done] == [keep] and engine.stats().kv_cache_usage == 0.0


def test_streaming_deltas_add_up(make_llm):
    llm = make_llm()
    final = llm.generate(TEXTS[5], GREEDY)[0]
    chunks = list(llm.stream(TEXTS[5], GREEDY))
    assert len(chunks) == 12 and chunks[-1].finished and not any(c.finished for c in chunks[:-1])
    assert "".join(c.delta_text for c in chunks) == final.text
    assert sum((c.delta_token_ids for c in chunks), []) == final.token_ids


def test_chat_uses_the_chat_template(make_llm):
    llm = make_llm()
    messages = [{"role": "user", "content": "Where is my order?"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt_token_ids == llm.tokenizer.encode(text, add_special_tokens=False)


def test_seeded_sampling_ignores_the_batch(make_llm):
    llm = make_llm()
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=10, ignore_eos=True)
    alone = llm.generate(TEXTS[6], seeded)[0].token_ids
    batch = llm.generate([TEXTS[6], TEXTS[2], TEXTS[3]],
                         [seeded, SamplingParams(temperature=1.0, max_tokens=10), GREEDY])
    assert batch[0].token_ids == alone
    assert llm.generate(TEXTS[6], SamplingParams(temperature=1.0, top_p=0.9, seed=8, max_tokens=10,
                                                 ignore_eos=True))[0].token_ids != alone


def test_startup_logs_kv_capacity(make_llm, caplog):
    with caplog.at_level(logging.INFO, logger="quantkit.runtime"):
        llm = make_llm(num_kv_blocks=33, block_size=16, max_model_len=128)
    # tiny model: 2 layers x 2 KV heads x head_dim 16, float32
    assert "512 bytes/token (2 x 2 layers x 2 KV heads x 16 x 4 B), 32 blocks x 16 = 512 tokens" in caplog.text
    assert "max concurrency at max_model_len 128: 4.00x" in caplog.text
    assert llm.engine.capacity.max_concurrency == 4.0


def test_kv_cache_smaller_than_one_sequence_is_refused(make_llm):
    with pytest.raises(QuantkitError, match="fewer than one sequence of max_model_len 128"):
        make_llm(num_kv_blocks=5, block_size=16)
    with pytest.raises(QuantkitError, match="kv_cache_dtype"):
        make_llm(kv_cache_dtype="int8")
