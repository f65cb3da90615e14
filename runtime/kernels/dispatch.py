"""Which implementation runs each kernel: Triton or the torch reference.

The mode is "auto" (Triton on CUDA tensors when triton is installed, the torch path elsewhere), "triton"
(always; on a CPU machine that needs TRITON_INTERPRET=1, which runs the real kernels in numpy) or
"reference". An explicit mode (EngineConfig.kernels) wins; None reads QUANTKIT_KERNELS, default "auto".
Triton modules are imported on first use, so the runtime imports and runs without triton.
"""

from __future__ import annotations

import os

import torch

from quantkit.errors import QuantkitError
from quantkit.runtime.kernels import reference
from quantkit.runtime.kernels._triton import interpreting, triton_available
from quantkit.runtime.kernels.int4_layout import int4_matmul_reference
from quantkit.runtime.kernels.int8_reference import int8_matmul_reference

MODES = ("auto", "triton", "reference")
ENV = "QUANTKIT_KERNELS"


def kernel_mode(requested: str | None = None) -> str:
    """The mode in force: `requested` (an engine option) if given, else QUANTKIT_KERNELS, else "auto"."""
    mode = requested if requested is not None else os.environ.get(ENV, "").strip().lower() or "auto"
    if mode not in MODES:
        source = "kernels" if requested is not None else ENV
        raise QuantkitError(f"{source}={mode!r} is not a kernel mode", hint=f"use one of: {', '.join(MODES)}")
    return mode


def use_triton(mode: str | None, device: torch.device) -> bool:
    """Whether the Triton kernels run for tensors on `device` under `mode` (see kernel_mode)."""
    mode = kernel_mode(mode)
    if mode == "reference":
        return False
    if mode == "auto":
        return device.type == "cuda" and triton_available()
    if not triton_available():
        raise QuantkitError("kernels='triton' but triton is not installed", hint="pip install triton, or use 'auto'")
    if device.type != "cuda" and not interpreting():
        raise QuantkitError(f"kernels='triton' on {device.type} tensors needs the Triton interpreter",
                            hint="set TRITON_INTERPRET=1 (slow; for tests), or use kernels='auto'")
    return True


def int4_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                g_idx: torch.Tensor | None, group_size: int, mode: str | None = None) -> torch.Tensor:
    """y = x @ W for the runtime INT4 layout (int4_layout.py)."""
    if use_triton(mode, x.device):
        from quantkit.runtime.kernels import int4_gemm

        return int4_gemm.int4_matmul(x, qweight, scales, zeros, g_idx, group_size)
    return int4_matmul_reference(x, qweight, scales, zeros, g_idx, group_size)


def int8_matmul(codes: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None, dtype: torch.dtype, mode: str | None = None) -> torch.Tensor:
    """W8A8: rescaled int8 codes [M, K] @ int8 weight [K, N] (int8_reference.py)."""
    if use_triton(mode, codes.device):
        from quantkit.runtime.kernels import int8_gemm

        return int8_gemm.int8_matmul(codes, x_scale, weight, w_scale, bias, dtype)
    return int8_matmul_reference(codes, x_scale, weight, w_scale, bias, dtype)


def write_kv(cache: torch.Tensor, x: torch.Tensor, slots: torch.Tensor, scale: float | None,
             mode: str | None = None) -> None:
    """cache[slots] = x (fp8 bytes of x / scale for a uint8 cache)."""
    if use_triton(mode, x.device):
        from quantkit.runtime.kernels import fp8_kv

        fp8_kv.write_kv(cache, x, slots, scale)
    else:
        reference.write_kv(cache, x, slots, scale)


def decode_attention_path(mode: str | None, q: torch.Tensor, k_cache: torch.Tensor) -> str:
    """"triton", "native-cpu" (cpu_attention.py, under "auto" on CPU where it builds) or "reference"."""
    if use_triton(mode, q.device):
        return "triton"
    if kernel_mode(mode) == "auto":
        from quantkit.runtime.kernels import cpu_attention

        if cpu_attention.supports(q, k_cache):
            return "native-cpu"
    return "reference"


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, scale: float,
                           k_scale: float | None = None, v_scale: float | None = None,
                           mode: str | None = None) -> torch.Tensor:
    """One query per sequence, q [B, heads, D] -> [B, heads, D] over the paged cache."""
    args = (q, k_cache, v_cache, block_tables, context_lens, block_size, scale, k_scale, v_scale)
    path = decode_attention_path(mode, q, k_cache)
    if path == "triton":
        from quantkit.runtime.kernels import paged_attention

        return paged_attention.paged_decode_attention(*args)
    if path == "native-cpu":
        from quantkit.runtime.kernels import cpu_attention

        return cpu_attention.paged_decode_attention(*args)
    return reference.paged_decode_attention(*args)
