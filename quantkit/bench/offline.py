"""Offline throughput: N requests x M output tokens through quantkit.runtime (continuous batching, paged KV)
versus transformers generating one request at a time, on the same prompts, dtype and thread count.

    from quantkit.bench.offline import offline_throughput
    print(offline_throughput("smollm2-135m", num_requests=32, output_len=64, threads=1).summary())

Both sides generate exactly output_len tokens per request (EOS ignored) and are timed without model load.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

SENTENCES = [
    "The customer reported that the invoice total did not match the quote they received last week.",
    "Write a short Python function that returns the median of a list of numbers.",
    "Our storage API returns HTTP 429 when the request rate exceeds the plan limit.",
    "Summarize the meeting: the launch moved to March and Dana owns the checklist.",
    "Explain in simple words why the sky looks blue during the day.",
    "List the steps to reset a password from the account settings page.",
    "The warehouse in Rotterdam ships orders to the Netherlands, Belgium and Germany.",
    "Translate into French: the train to Lyon leaves at eight in the morning.",
]


@dataclass
class OfflineResult:
    model: str
    dtype: str
    threads: int
    num_requests: int
    output_len: int
    prompt_tokens: int  # over all requests
    runtime_seconds: float
    runtime_tokens_per_second: float
    transformers_requests: int  # requests timed on the transformers side (a subset keeps it short)
    transformers_seconds: float
    transformers_tokens_per_second: float
    ratio: float  # runtime / transformers output tokens per second

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (f"{self.model} {self.dtype}, {self.threads} thread(s), {self.num_requests} x {self.output_len} "
                f"tokens: runtime {self.runtime_tokens_per_second:.1f} tok/s, transformers one at a time "
                f"{self.transformers_tokens_per_second:.1f} tok/s ({self.transformers_requests} requests), "
                f"ratio {self.ratio:.2f}x")


def make_prompts(tokenizer, num_requests: int) -> list[list[int]]:
    """Varied prompts of about 20-80 tokens, deterministic."""
    prompts = []
    for i in range(num_requests):
        parts = [SENTENCES[(i + j) % len(SENTENCES)] for j in range(1 + i % 4)]
        prompts.append(tokenizer.encode(f"Request {i}: " + " ".join(parts)))
    return prompts


@contextmanager
def _threads(n: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_runtime(model: str, prompts: list[list[int]], output_len: int, dtype: str, **engine_kwargs) -> float:
    """Seconds for quantkit.runtime to generate output_len tokens for every prompt."""
    from quantkit.runtime import LLM, SamplingParams

    max_len = max(len(p) for p in prompts) + output_len + 1
    llm = LLM(model, dtype=dtype, max_model_len=max_len, **engine_kwargs)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    assert all(len(o.token_ids) == output_len for o in outs)
    return seconds


def run_transformers(model: str, prompts: list[list[int]], output_len: int, dtype: str) -> float:
    """Seconds for transformers generate, one prompt at a time (its KV cache, no batching)."""
    from transformers import AutoModelForCausalLM

    from quantkit.models import resolve_model

    hf = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=getattr(torch, dtype)).eval()
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False)
    with torch.inference_mode():
        hf.generate(torch.tensor([prompts[0]]), **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
        start = time.perf_counter()
        for ids in prompts:
            hf.generate(torch.tensor([ids]), **kwargs)
    return time.perf_counter() - start


def offline_throughput(model: str = "smollm2-135m", num_requests: int = 32, output_len: int = 64,
                       dtype: str = "float32", threads: int = 1, transformers_requests: int | None = None,
                       **engine_kwargs) -> OfflineResult:
    """Output tokens/s of the runtime (all requests at once) and of transformers (one at a time)."""
    from quantkit.models import load_tokenizer, resolve_model

    prompts = make_prompts(load_tokenizer(resolve_model(model)), num_requests)
    hf_prompts = prompts[:transformers_requests or num_requests]
    with _threads(threads):
        runtime_s = run_runtime(model, prompts, output_len, dtype, **engine_kwargs)
        hf_s = run_transformers(model, hf_prompts, output_len, dtype)
    runtime_tps = num_requests * output_len / runtime_s
    hf_tps = len(hf_prompts) * output_len / hf_s
    return OfflineResult(model=model, dtype=dtype, threads=threads, num_requests=num_requests,
                         output_len=output_len, prompt_tokens=sum(map(len, prompts)), runtime_seconds=runtime_s,
                         runtime_tokens_per_second=runtime_tps, transformers_requests=len(hf_prompts),
                         transformers_seconds=hf_s, transformers_tokens_per_second=hf_tps, ratio=runtime_tps / hf_tps)


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--transformers-requests", type=int, default=None)
    args = parser.parse_args()
    result = offline_throughput(args.model, args.num_requests, args.output_len, args.dtype, args.threads,
                                args.transformers_requests)
    print(result.summary())
    print(json.dumps(result.as_dict(), indent=2))
