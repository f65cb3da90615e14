"""Native CPU W4A16 INT4 GEMM (cpu_int4_gemm.cpp) and the tiled layout it reads.

    codes    int32 [tiles, K // 8, 64]: nibble j of codes[t, r, c] is the code of input row 8r + j, output
             column 64t + c (N padded with zero columns to a multiple of 64)
    scales   float32 [tiles, groups, 64];  offsets: the same, offset = -zero * scale
    W[k, n] = code[k, n] * scale[g(k), n] + offset[g(k), n]

Each 64-column tile is one contiguous block, read front to back. Groups must be contiguous runs of input rows
(act-order checkpoints are permuted at load, runtime/layers/linear.py). Built on first use (cpu_extension.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit.runtime.kernels import cpu_extension
from quantkit.runtime.kernels.int4_layout import pack_int4

SOURCE = Path(__file__).with_name("cpu_int4_gemm.cpp")
TILE = 64
# Up to this many rows the register GEMV beats decoding a tile for AMX (`quantkit bench kernels`, AMX Xeon:
# at M = 4 0.62 vs 0.93 ms, at M = 8 1.2 vs 0.65 ms for one SmolLM2 layer).
SMALL_M = 4
BLOCK_TILES = 4  # int4_blocks: 256 columns per torch matmul
PATHS = ("gemv", "amx", "blocks")


def _extension():
    return cpu_extension.load(SOURCE)


def available() -> bool:
    """Whether the kernel is built here (building it on the first call, ~45 s; later processes load it)."""
    return _extension() is not None


def amx() -> bool:
    """Whether this CPU and build run the AMX path."""
    return available() and _extension().amx_available()


def pack(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, scales, offsets) in the tiled layout from [N, K] codes and [N, groups] scales / zero points."""
    qweight, scales_kn, zeros_kn = pack_int4(q, scales, zeros)  # [K // 8, N], [groups, N], [groups, N]
    scales_kn = scales_kn.float()
    offsets_kn = -zeros_kn.float() * scales_kn
    pad = -qweight.shape[1] % TILE

    def tiled(t: torch.Tensor) -> torch.Tensor:
        t = torch.nn.functional.pad(t, (0, pad))
        return t.view(t.shape[0], -1, TILE).transpose(0, 1).contiguous()

    return tiled(qweight), tiled(scales_kn), tiled(offsets_kn)


def default_path(m: int, k: int) -> str:
    if m <= SMALL_M:
        return "gemv"
    return "amx" if k % 32 == 0 and amx() else "blocks"


def int4_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                group_size: int, n: int, path: str | None = None) -> torch.Tensor:
    """y [M, n] = x [M, K] @ W in x's dtype (float32 or bfloat16; the AMX path computes in bfloat16).
    path: one of PATHS, or None for the fastest here."""
    if x.dtype not in (torch.float32, torch.bfloat16):  # float16: computed in float32
        return int4_matmul(x.float(), codes, scales, offsets, group_size, n, path).to(x.dtype)
    x = x.contiguous()
    path = path or default_path(x.shape[0], x.shape[1])
    ext = _extension()
    if path == "gemv":
        return ext.int4_gemv(x, codes, scales, offsets, group_size, n)
    if path == "amx":
        return ext.int4_amx(x, codes, scales, offsets, group_size, n)
    if path == "blocks":
        return ext.int4_blocks(x, codes, scales, offsets, group_size, n, BLOCK_TILES)
    raise ValueError(f"unknown INT4 CPU path {path!r}; expected one of {PATHS}")
