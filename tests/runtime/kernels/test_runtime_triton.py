"""The runtime with kernels="triton" (the real Triton kernels, interpreted on CPU) generates what the torch
reference path generates, through LLM.generate on the tiny random Llama (float32). The model's linears are
dense here; the INT4 layer's end-to-end check lives with the INT4 layer."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from quantkit.runtime import SamplingParams  # noqa: E402
from quantkit.runtime.kernels import fp8_kv, paged_attention  # noqa: E402
from tests.runtime.conftest import TEXTS  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def count_calls(monkeypatch, module, name: str) -> list:
    calls, original = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def record_logits(llm) -> list[torch.Tensor]:
    """The logits of every engine step (greedy tokens of a tiny random model hardly move with attention)."""
    runner, steps = llm.engine.runner, []
    original = runner.sample

    def sample(scheduled, logits):
        steps.append(logits.clone())
        return original(scheduled, logits)

    runner.sample = sample
    return steps


@pytest.mark.filterwarnings("ignore:kv_cache_dtype='fp8' but the checkpoint has no KV-cache scales")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_greedy_outputs_equal_the_reference_path(make_llm, monkeypatch, fixed_fp8_cast, kv_cache_dtype):
    # block_size 4 and a small token budget: sequences span many shuffled blocks, prefill is chunked beside
    # decodes (those mixed steps attend on the torch path, but write K/V with the kernel).
    options = dict(kv_cache_dtype=kv_cache_dtype, block_size=4, max_num_batched_tokens=32, max_model_len=64)
    reference = make_llm(kernels="reference", **options)
    prompts = [reference.tokenizer.encode(t) for t in TEXTS[:6]]
    expected_logits = record_logits(reference)
    expected = [o.token_ids for o in reference.generate(prompts, GREEDY)]
    decodes = count_calls(monkeypatch, paged_attention, "paged_decode_attention")
    writes = count_calls(monkeypatch, fp8_kv, "write_kv")
    triton = make_llm(kernels="triton", **options)
    logits = record_logits(triton)
    assert [o.token_ids for o in triton.generate(prompts, GREEDY)] == expected
    assert len(logits) == len(expected_logits)  # same schedule, step by step
    for step, (got, want) in enumerate(zip(logits, expected_logits)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"step {step}: {m}")
    assert decodes and writes  # the kernels ran, not the reference


def test_auto_on_cpu_runs_no_triton_kernel(make_llm, monkeypatch):
    monkeypatch.delenv("QUANTKIT_KERNELS", raising=False)
    decodes = count_calls(monkeypatch, paged_attention, "paged_decode_attention")
    writes = count_calls(monkeypatch, fp8_kv, "write_kv")
    make_llm().generate(TEXTS[:2], GREEDY)
    assert not decodes and not writes


@pytest.fixture(scope="module")
def int4_checkpoint(tiny_model, tmp_path_factory):
    from quantkit.quantize.run import QuantizeOptions, quantize

    out = tmp_path_factory.mktemp("int4") / "ckpt"
    quantize(QuantizeOptions(model=str(tiny_model), recipe="rtn-w4a16-g64", out=out))
    return out


def test_int4_checkpoint_greedy_outputs_equal_the_reference_path(make_llm, monkeypatch, int4_checkpoint):
    """Int4Linear on the Triton INT4 GEMM (float32 activations: ieee dots) against its per-call dequantizing
    reference, and the attention kernels with it."""
    from quantkit.runtime.kernels import int4_gemm

    monkeypatch.delenv("QUANTKIT_KERNELS", raising=False)  # the engine option alone selects the kernels
    options = dict(block_size=4, max_num_batched_tokens=32, max_model_len=64)
    reference = make_llm(int4_checkpoint, kernels="reference", **options)
    prompts = [reference.tokenizer.encode(t) for t in TEXTS[:3]]
    expected_logits = record_logits(reference)
    expected = [o.token_ids for o in reference.generate(prompts, GREEDY)]
    gemms = count_calls(monkeypatch, int4_gemm, "int4_matmul")
    triton = make_llm(int4_checkpoint, kernels="triton", **options)
    logits = record_logits(triton)
    assert [o.token_ids for o in triton.generate(prompts, GREEDY)] == expected
    assert gemms  # the INT4 kernel ran
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"step {step}: {m}")
