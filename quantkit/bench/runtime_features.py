"""Two runtime workloads behind `quantkit bench prefix-cache` and `quantkit bench kv-capacity`.

prefix-cache: a support assistant whose every request starts with the same ~1k-token system prompt
(product documentation from the shipped rag_product_docs_en set), followed by a different question. Requests
arrive one after another, as they would to a quiet service; mean TTFT with prefix caching on versus off.

kv-capacity: one fixed KV-cache budget, cache dtypes side by side: bytes per token, blocks, how many
sequences of max_model_len fit, and, running the same batch of requests, how many ran at once at the peak
and how many preemptions the budget forced.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from quantkit.bench.offline import make_prompts

QUESTIONS = [
    "How do I rotate an API key without downtime?",
    "What does HTTP 429 mean for my plan?",
    "Can I restore a deleted bucket?",
    "Which regions support object locking?",
    "How are egress fees billed?",
    "What is the maximum object size?",
    "How do I enable versioning from the CLI?",
    "Why does my upload fail with a checksum error?",
]


def system_prompt_ids(tokenizer, target_tokens: int = 1024) -> list[int]:
    """target_tokens of real product documentation."""
    from quantkit.data.readers import read_records

    text = "You answer questions using this documentation.\n\n"
    for record in read_records("rag_product_docs_en:train"):
        text += record.plain_text() + "\n\n"
        ids = tokenizer.encode(text)
        if len(ids) >= target_tokens:
            return ids[:target_tokens]
    raise ValueError(f"the documentation set has fewer than {target_tokens} tokens")


@dataclass
class PrefixRow:
    prefix_caching: bool
    requests: int
    prompt_tokens: int  # mean per request
    mean_ttft_ms: float
    first_ttft_ms: float  # the first request: nothing cached yet either way
    mean_ttft_after_first_ms: float
    cached_prompt_tokens: int  # mean per request


def prefix_cache_bench(model: str = "smollm2-135m", num_requests: int = 16, system_tokens: int = 1024,
                       output_len: int = 8, dtype: str = "float32", threads: int = 1) -> dict:
    from quantkit.models import load_tokenizer, resolve_model
    from quantkit.runtime import LLM, SamplingParams

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(resolve_model(model))
    system = system_prompt_ids(tokenizer, system_tokens)
    prompts = [system + tokenizer.encode(f"Question {i}: {QUESTIONS[i % len(QUESTIONS)]}\nAnswer:")
               for i in range(num_requests)]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    rows = []
    for caching in (False, True):
        llm = LLM(model, dtype=dtype, enable_prefix_caching=caching, max_model_len=max(map(len, prompts)) + output_len)
        llm.generate([tokenizer.encode("warm up")], SamplingParams(temperature=0, max_tokens=2))
        outs = [llm.generate([p], params)[0] for p in prompts]  # one at a time: each arrives after the last
        ttft = [o.metrics.ttft_ms for o in outs]
        rows.append(PrefixRow(prefix_caching=caching, requests=num_requests,
                              prompt_tokens=round(statistics.mean(map(len, prompts))),
                              mean_ttft_ms=round(statistics.mean(ttft), 1), first_ttft_ms=round(ttft[0], 1),
                              mean_ttft_after_first_ms=round(statistics.mean(ttft[1:]), 1),
                              cached_prompt_tokens=round(statistics.mean(o.metrics.cached_prompt_tokens for o in outs))))
    off, on = rows
    return {"system_prompt_tokens": len(system), "rows": [asdict(r) for r in rows],
            "ttft_speedup": round(off.mean_ttft_ms / on.mean_ttft_ms, 2)}


@dataclass
class CapacityRow:
    dtype: str
    kv_cache_dtype: str
    bytes_per_token: int
    blocks: int
    max_concurrency: float  # sequences of max_model_len that fit
    peak_running: int  # most requests running in one step of the workload
    preemptions: int
    seconds: float


def kv_capacity_bench(model: str = "smollm2-135m", kv_budget_mib: float = 32.0, num_requests: int = 32,
                      output_len: int = 64, max_model_len: int = 256, threads: int = 1,
                      configs: tuple[tuple[str, str], ...] = (("float32", "auto"), ("float32", "fp8"),
                                                              ("bfloat16", "auto"), ("bfloat16", "fp8"))) -> dict:
    from quantkit.models import load_tokenizer, resolve_model
    from quantkit.runtime import LLM, SamplingParams

    torch.set_num_threads(threads)
    prompts = make_prompts(load_tokenizer(resolve_model(model)), num_requests)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    rows = []
    for dtype, kv_dtype in configs:
        llm = LLM(model, dtype=dtype, kv_cache_dtype=kv_dtype, kv_cache_memory_gb=kv_budget_mib / 1024,
                  max_model_len=max_model_len, max_num_seqs=num_requests)
        engine, cap = llm.engine, llm.engine.capacity
        for p in prompts:
            engine.add_request(p, params)
        peak, start = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            peak = max(peak, engine.stats().num_running)
        rows.append(CapacityRow(dtype=dtype, kv_cache_dtype=cap.dtype, bytes_per_token=cap.bytes_per_token,
                                blocks=cap.num_blocks, max_concurrency=round(cap.max_concurrency, 2),
                                peak_running=peak, preemptions=engine.stats().num_preemptions,
                                seconds=round(time.perf_counter() - start, 1)))
    return {"kv_budget_mib": kv_budget_mib, "max_model_len": max_model_len, "requests": num_requests,
            "output_len": output_len, "rows": [asdict(r) for r in rows]}
