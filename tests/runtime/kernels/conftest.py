"""Kernel tests run the real Triton kernels in the interpreter (TRITON_INTERPRET=1) on CPU tensors. With
TRITON_INTERPRET=0 set on a machine with a GPU they run the compiled kernels on CUDA instead.

Two interpreter defects (triton 3.9) are handled here, not in the kernels: its float32 -> float8e4nv cast
rounds wrongly when rounding up crosses a power of two (fixed_fp8_cast swaps in a correct cast, as a GPU's
hardware has), and its float32 -> bfloat16 cast truncates instead of rounding to nearest (bf16 results are
checked to within one bf16 ulp, which both rounding modes meet)."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported: @triton.jit reads it


def interpreted() -> bool:
    return os.environ["TRITON_INTERPRET"].lower() in ("1", "true", "yes", "on")


DEVICE = torch.device("cpu" if interpreted() else "cuda")


def sqnr_db(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of actual against reference, in dB (inf when equal)."""
    reference, actual = reference.double(), actual.double()
    noise = (reference - actual).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(reference.pow(2).sum() / noise))


def assert_within_one_ulp(actual: torch.Tensor, exact: torch.Tensor, sum_error: torch.Tensor | float = 0.0) -> None:
    """actual (fp16 / bf16) is one of the two representable neighbours of the float32 result `exact`, give or
    take sum_error: what float32 sums taken in another order may differ by (a bound, elementwise)."""
    assert not actual.isnan().any()
    mantissa_bits = {torch.float16: 10, torch.bfloat16: 7}[actual.dtype]
    exponent = torch.floor(torch.log2(exact.abs().clamp_min(2.0 ** -14)))
    ulp = torch.exp2(exponent - mantissa_bits)
    err = (actual.float() - exact).abs()
    assert (err <= ulp + sum_error).all(), f"max error {((err - sum_error) / ulp).max():.3f} ulp"


def dot_error_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bound on how far two float32 evaluations of a @ b (any summation order) can differ: 2 K u (|a| @ |b|)."""
    return 2 * a.shape[-1] * 2.0 ** -24 * (a.abs().float() @ b.abs().float())


@contextlib.contextmanager
def poisoned_allocations():
    """torch.empty / empty_like return NaN-filled float tensors (0xFF bytes for integer ones) inside the block,
    so an output or workspace element a kernel never writes shows up in the result."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t.view(torch.uint8).fill_(0xFF).view(t.dtype)

    torch.empty = lambda *a, **k: poison(empty(*a, **k))
    torch.empty_like = lambda *a, **k: poison(empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


@pytest.fixture
def fixed_fp8_cast(monkeypatch):
    """The interpreter with a correct float32 -> float8e4nv cast (torch's round-to-nearest-even, as the
    hardware cast on a GPU), so a kernel's own fp8 rounding can be checked for exact equality."""
    if not interpreted():
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar == tl.float32:
            data = torch.from_numpy(src.data.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            return interpreter.TensorHandle(data, dst_type.scalar)
        return original(self, src, dst_type, rounding_mode)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fp_to_fp", create_fp_to_fp)
