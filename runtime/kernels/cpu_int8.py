"""Native CPU W8A8 INT8 linear (cpu_int8_gemm.cpp): activations quantized per row in the same call, then an
AVX-512 VNNI GEMV for a few rows or AMX int8 tiles for more, int32 sums rescaled to x's dtype.

    packed    int8 [N / 16, K / 4, 16, 4]: packed[b, r, c, j] = W_q[16 b + c, 4 r + j], K padded with zeros to a
              multiple of 64 and N to a multiple of 16
    col_sums  int32 [N_pad]: sum over k of W_q[n, k] (VNNI multiplies x_q + 128, then subtracts 128 * col_sums)
    w_scale   float32 [N_pad];  bias float32 [N_pad] or empty

Built on first use (cpu_extension.py) with exact float flags: its activation codes must equal the torch
convention (int8_reference.py) bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from quantkit.runtime.kernels import cpu_extension

SOURCE = Path(__file__).with_name("cpu_int8_gemm.cpp")
COLS, K_STEP = 16, 64
PATHS = ("vnni", "amx")


def _extension():
    return cpu_extension.load(SOURCE, cpu_extension.EXACT_CFLAGS)


def available() -> bool:
    """Whether the kernel is built here with its VNNI path (building it on the first call)."""
    ext = _extension()
    return ext is not None and ext.native_available()


def amx() -> bool:
    return available() and _extension().amx_available()


def pack(weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed, col_sums, w_scale, bias) from int8 weight [N, K], scales [N], bias [N] or None."""
    n, k = weight.shape
    pad_n, pad_k = -n % COLS, -k % K_STEP
    w = F.pad(weight, (0, pad_k, 0, pad_n))
    packed = w.view(-1, COLS, (k + pad_k) // 4, 4).transpose(1, 2).contiguous()
    col_sums = w.sum(1, dtype=torch.int32)
    w_scale = F.pad(scale.float().reshape(-1), (0, pad_n))
    bias = torch.empty(0) if bias is None else F.pad(bias.float().reshape(-1), (0, pad_n))
    return packed, col_sums, w_scale, bias


def default_path() -> str:
    """AMX wherever it runs: it beat the VNNI GEMV at every M measured, 1 to 512, even one row (SmolLM2 shapes,
    1 thread, Xeon with AMX: 22 against 31 us at M = 1 on qkv_proj)."""
    return "amx" if amx() else "vnni"


def int8_linear(x: torch.Tensor, static_scale: float | None, packed: torch.Tensor, col_sums: torch.Tensor,
                w_scale: torch.Tensor, bias: torch.Tensor, n: int, path: str | None = None) -> torch.Tensor:
    """y [M, n] in x's dtype (float16 runs in float32). static_scale None: per-token dynamic scales."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        return int8_linear(x.float(), static_scale, packed, col_sums, w_scale, bias, n, path).to(x.dtype)
    path = path or default_path()
    if path not in PATHS:
        raise ValueError(f"unknown INT8 CPU path {path!r}; expected one of {PATHS}")
    return _extension().int8_linear(x.contiguous(), static_scale or 0.0, packed, col_sums, w_scale, bias, n,
                                    path == "amx")


def quantize(x: torch.Tensor, static_scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [M, K], scales float32 [M]) exactly as int8_linear quantizes x."""
    return _extension().int8_quantize(x.contiguous(), static_scale or 0.0)
