"""Runtime fixtures: engines over the tiny random Llama, and transformers references to compare with."""

from __future__ import annotations

import pytest
import torch

TEXTS = [
    "How do I reset my password?",
    "How do I reset my password? Go to settings",
    "Your order 12345 shipped yesterday and should arrive on Friday.",
    "def add(a, b):\n    return a + b\n",
    "The meeting decided to move the launch to March; Dana owns the checklist.",
    "退款会在三到五个工作日内原路返回。",
    "The storage API returns 429 when the request rate exceeds the plan limit.",
    "Your order",
]


@pytest.fixture
def make_llm(tiny_model):
    from quantkit.runtime import LLM

    def make(model=None, **kwargs):
        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("max_model_len", 128)
        return LLM(str(model or tiny_model), **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_hf(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_reference(tiny_model, tiny_hf):
    """TEXTS as token ids and transformers' 12 greedy tokens for each (EOS suppressed)."""
    from quantkit.models import load_tokenizer

    prompts = [load_tokenizer(tiny_model).encode(t) for t in TEXTS]
    return prompts, hf_greedy(tiny_hf, prompts, 12)


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int, eos_token_id: int | None = None) -> list[list[int]]:
    """transformers greedy generation, one prompt at a time (no padding), cut after EOS like the engine.
    eos_token_id None: EOS is suppressed, as with ignore_eos."""
    out = []
    for ids in prompts:
        gen = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             min_new_tokens=0 if eos_token_id is not None else max_new_tokens)
        tokens = gen[0, len(ids):].tolist()
        if eos_token_id is not None and eos_token_id in tokens:
            tokens = tokens[:tokens.index(eos_token_id) + 1]
        out.append(tokens)
    return out


def first_token_logits(llm, prompts: list[list[int]]) -> list[torch.Tensor]:
    """The engine's logits at the end of each prompt (what its first output token is sampled from)."""
    from quantkit.runtime import SamplingParams

    runner, recorded = llm.engine.runner, {}
    original = runner.sample

    def sample(scheduled, logits):
        for (seq, n), row in zip(scheduled, logits):
            if seq.num_computed_tokens + n == seq.num_tokens and seq.num_output_tokens == 0:
                recorded[seq.request_id] = row.clone()
        return original(scheduled, logits)

    runner.sample = sample
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1))
    finally:
        runner.sample = original
    return [recorded[o.request_id] for o in outs]
