"""Kernel selection: QUANTKIT_KERNELS / EngineConfig.kernels, and what each mode runs."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.runtime.config import EngineConfig
from quantkit.runtime.kernels import dispatch, reference
from quantkit.runtime.kernels.int4_layout import int4_matmul_reference, pack_int4

CPU = torch.device("cpu")


def test_mode_explicit_wins_env_otherwise(monkeypatch):
    monkeypatch.delenv("QUANTKIT_KERNELS", raising=False)
    assert dispatch.kernel_mode() == "auto"
    monkeypatch.setenv("QUANTKIT_KERNELS", "triton")
    assert dispatch.kernel_mode() == "triton"
    assert dispatch.kernel_mode("reference") == "reference"
    assert EngineConfig(model="m").kernels == "triton"  # the engine option defaults to the variable
    monkeypatch.setenv("QUANTKIT_KERNELS", "cuda")
    with pytest.raises(QuantkitError, match="QUANTKIT_KERNELS='cuda' is not a kernel mode"):
        dispatch.kernel_mode()
    with pytest.raises(QuantkitError, match="kernels='fast'"):
        dispatch.kernel_mode("fast")


def test_auto_is_reference_on_cpu_and_triton_needs_the_interpreter_there(monkeypatch):
    assert not dispatch.use_triton("auto", CPU)
    assert not dispatch.use_triton("reference", CPU)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(QuantkitError, match="needs the Triton interpreter"):
        dispatch.use_triton("triton", CPU)


def test_reference_mode_runs_the_torch_functions():
    cache, expected = torch.zeros(8, 2, 4, dtype=torch.uint8), torch.zeros(8, 2, 4, dtype=torch.uint8)
    x, slots = torch.randn(3, 2, 4) * 10, torch.tensor([5, 0, 2])
    dispatch.write_kv(cache, x, slots, 0.5, mode="reference")
    reference.write_kv(expected, x, slots, 0.5)
    assert torch.equal(cache, expected)
    q = torch.randn(2, 4, 4)
    table, lens = torch.tensor([[1], [0]]), torch.tensor([3, 4])
    torch.testing.assert_close(
        dispatch.paged_decode_attention(q, cache, cache, table, lens, 4, 0.5, 0.5, 0.5, mode="reference"),
        reference.paged_decode_attention(q, cache, cache, table, lens, 4, 0.5, 0.5, 0.5), rtol=0, atol=0)
    qweight, scales, zeros = pack_int4(torch.randint(0, 16, (8, 32)), torch.rand(8, 1), torch.full((8, 1), 8))
    x = torch.randn(2, 32)
    assert torch.equal(dispatch.int4_matmul(x, qweight, scales, zeros, None, 32, mode="reference"),
                       int4_matmul_reference(x, qweight, scales, zeros, None, 32))


def test_triton_mode_runs_the_kernels(monkeypatch):
    pytest.importorskip("triton")
    from quantkit.runtime.kernels import int4_gemm

    calls = []
    monkeypatch.setattr(int4_gemm, "int4_matmul", lambda *a: calls.append(a) or "kernel")
    assert dispatch.int4_matmul(torch.randn(1, 8), *[None] * 4, 8, mode="triton") == "kernel" and calls
