"""Native CPU versions of a decoder layer's small elementwise ops (cpu_fused_ops.cpp): residual add + RMSNorm,
rotary embedding in place, SiLU-and-mul; and the greedy sampler's row maximum. Same arithmetic as the torch code in runtime/layers (rounded to the
dtype where torch rounds), one call instead of 5-7 torch ops each. Built on first use (cpu_extension.py);
layers take their torch code where `supports` says no."""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit.runtime.kernels import cpu_extension

SOURCE = Path(__file__).with_name("cpu_fused_ops.cpp")
DTYPES = (torch.float32, torch.bfloat16)


def _extension():
    return cpu_extension.load(SOURCE)


def available() -> bool:
    """Whether the ops are built here (building them on the first call, ~45 s; later processes load them)."""
    return _extension() is not None


def supports(x: torch.Tensor) -> bool:
    """Whether the native ops run for x (CPU, float32 or bfloat16, the kernel built here)."""
    return x.device.type == "cpu" and x.dtype in DTYPES and available()


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(h), h) for h = x + residual (h = x without a residual); x, residual [T, hidden]."""
    empty = x.new_empty(0)
    normed, h = _extension().add_rms_norm(x.contiguous(), empty if residual is None else residual.contiguous(),
                                          weight, eps)
    return normed, h


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated in place by cos / sin [T, D] (x's dtype); returns x."""
    _extension().rotary_(x, cos, sin)
    return x


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> silu(gate) * up, [T, I]."""
    return _extension().silu_mul(gate_up.contiguous())


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] float32 -> [B] int64, the first index of each row's maximum."""
    return _extension().greedy_tokens(logits.contiguous())
