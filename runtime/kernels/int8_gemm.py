"""W8A8 INT8 GEMM in Triton: int8 activations [M, K] with a scale per row, int8 weights [K, N] with a scale per
column, int32 sums from tl.dot (exact), rescaled in float32 as int8_reference.rescale does, plus bias, stored
in the compute dtype. int8_reference.py holds the torch forms it must reproduce.

One program per [BLOCK_M, BLOCK_N] output tile; decode-sized M takes a 16-row tile (tl.dot's minimum) and
narrower N tiles so more programs stream the weights. Fixed tilings per M bucket, not tuned yet: nobody has
timed them on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from quantkit.runtime.kernels._triton import check, interpreting

SMALL_M = 16


@dataclass(frozen=True)
class Int8Config:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


CONFIGS = {"small": Int8Config(SMALL_M, 64, 128), "large": Int8Config(128, 128, 64, 8, 3)}
INTERPRETER_CONFIG = Int8Config(16, 32, 32)  # small tiles, so odd shapes cross several of them in tests

_OUT = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _int8_mm_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, b_ptr, out_ptr, M, N, K, HAS_BIAS: tl.constexpr,
                    OUT_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0)
        w = tl.load(w_ptr + offs_k[:, None] * N + offs_n[None, :], mask=k_mask[:, None] & n_mask[None, :], other=0)
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
    x_scale = tl.load(as_ptr + offs_m, mask=m_mask, other=0.0)
    w_scale = tl.load(ws_ptr + offs_n, mask=n_mask, other=0.0)
    y = acc.to(tl.float32) * x_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], y.to(OUT_DTYPE), mask=m_mask[:, None] & n_mask[None, :])


def int8_matmul(codes: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None, dtype: torch.dtype, config: Int8Config | None = None) -> torch.Tensor:
    """y [M, N] in dtype = rescaled codes [M, K] @ weight [K, N] (scales float32 [M] and [N], bias float32 [N])."""
    _check(codes, x_scale, weight, w_scale, bias, dtype)
    (m, k), n = codes.shape, weight.shape[1]
    out = torch.empty(m, n, dtype=dtype, device=codes.device)
    if m == 0:
        return out
    cfg = config or (INTERPRETER_CONFIG if interpreting() else CONFIGS["small" if m <= SMALL_M else "large"])
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n))
    _int8_mm_kernel[grid](codes, x_scale, weight, w_scale, w_scale if bias is None else bias, out, m, n, k,
                          HAS_BIAS=bias is not None, OUT_DTYPE=_OUT[dtype], BLOCK_M=cfg.block_m,
                          BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
                          num_stages=cfg.num_stages)
    return out


def _check(codes, x_scale, weight, w_scale, bias, dtype) -> None:
    check(codes.dtype == torch.int8 and codes.dim() == 2 and codes.is_contiguous(),
          f"codes must be a contiguous int8 [M, K], got {codes.dtype} {tuple(codes.shape)}")
    (m, k) = codes.shape
    check(weight.dtype == torch.int8 and weight.dim() == 2 and weight.shape[0] == k and weight.is_contiguous(),
          f"weight must be a contiguous int8 [{k}, N], got {weight.dtype} {tuple(weight.shape)}")
    n = weight.shape[1]
    for name, t, size in (("x_scale", x_scale, m), ("w_scale", w_scale, n), ("bias", bias, n)):
        check(t is None or (t.dtype == torch.float32 and tuple(t.shape) == (size,) and t.is_contiguous()),
              f"{name} must be a contiguous float32 [{size}], got {None if t is None else (t.dtype, tuple(t.shape))}")
    check(dtype in _OUT, f"output dtype must be float16/bfloat16/float32, got {dtype}")
    tensors = [t for t in (codes, x_scale, weight, w_scale, bias) if t is not None]
    check(len({t.device for t in tensors}) == 1, f"tensors on different devices: {[str(t.device) for t in tensors]}")
    check(codes.is_cuda or interpreting(), "the Triton INT8 GEMM needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)")
