"""The runtime INT4 layout and its torch reference (what the Triton INT4 GEMM must reproduce).

    qweight int32 [K // 8, N]: nibble j (bits 4j..4j+3) of qweight[r, n] is the unsigned code of input row 8r + j
    scales  [groups, N] in the compute dtype
    zeros   uint8 [groups, N], integer zero points 0..15 (symmetric checkpoints: 8)
    g_idx   int32 [K] or None: the group of input row k, else k // group_size

    W[k, n] = (q[k, n] - zeros[g(k), n]) * scales[g(k), n];   y = x @ W

K-major packing keeps a column's codes contiguous along the reduction, as GPTQ's qweight does, without
AutoAWQ's nibble interleave. Checkpoint formats convert to it at load (from quantkit.formats' QuantizedWeight).
"""

from __future__ import annotations

import torch

PACK = 8  # int4 codes per int32
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def pack_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(qweight, scales, zeros) in the runtime layout from [N, K] codes and [N, groups] scales / zeros."""
    n, k = q.shape
    if k % PACK:
        raise ValueError(f"INT4 input size {k} is not a multiple of {PACK}")
    codes = q.to(torch.int32).T.reshape(k // PACK, PACK, n)
    qweight = (codes << _SHIFTS.view(1, PACK, 1)).sum(1, dtype=torch.int32)  # disjoint bits: sum == or
    return qweight.contiguous(), scales.T.contiguous(), zeros.T.to(torch.uint8).contiguous()


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """[K // 8, N] int32 -> [K, N] int32 codes in 0..15."""
    rows, n = qweight.shape
    shifts = _SHIFTS.to(qweight.device).view(1, PACK, 1)
    return ((qweight.unsqueeze(1) >> shifts) & 0xF).reshape(rows * PACK, n)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor | None,
                    group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """W [K, N] in dtype."""
    q = unpack_int4(qweight)
    groups = g_idx.long() if g_idx is not None else torch.arange(q.shape[0], device=q.device) // group_size
    return ((q.float() - zeros[groups].float()) * scales[groups].float()).to(dtype)


def int4_matmul_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                          g_idx: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W in float32, returned in x's dtype."""
    w = dequantize_int4(qweight, scales, zeros, g_idx, group_size, torch.float32)
    return (x.float() @ w).to(x.dtype)
