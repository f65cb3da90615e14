"""W4A16 INT4 GEMM in Triton over the runtime INT4 layout (int4_layout.py holds the layout and the torch
reference this kernel must reproduce).

One kernel body, three launch shapes:
- M = 1 may also run as a GEMV without tl.dot (BLOCK_M = 1): float32 products accumulate in registers and are
  summed over K once at the end, with no tensor-core operand shuffling; tuning decides against the next one.
- small M (decode, M <= 16): one 16-row tile (tl.dot's minimum), narrow N tiles and split-K, so a GEMV over a
  4096-wide layer still keeps every SM streaming packed weights: that read is what bounds it.
- larger M (prefill): a tiled GEMM, one program per [BLOCK_M, BLOCK_N] output tile.
Split-K partials go to a float32 workspace that a second kernel sums in a fixed order: deterministic, where
atomics would let the last bit of a logit depend on scheduling. Configurations are timed per (M bucket, N, K,
group size) on the first call on a GPU; the interpreter runs one fixed configuration.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from quantkit.runtime.kernels._triton import check, dot_dtype, dot_precision, interpreting

log = logging.getLogger("quantkit.runtime")
SMALL_M = 16  # the decode path's one row tile


@dataclass(frozen=True)
class Int4Config:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    # Unpacking: False loads each packed word once and repeats it in registers (a reshape the compiler may
    # route through shared memory); True loads it once per row it holds (8 loads that L1 serves). Which
    # is faster depends on the GPU and tiling, so both are tuning candidates.
    reload: bool = False


# Hopper (H100/H200) candidates. Decode: narrow N tiles and split-K trade partial-sum traffic for more
# programs in flight; BLOCK_K up to 128 loads 64 contiguous bytes of packed weights per column per step.
SMALL_M_CONFIGS = [Int4Config(SMALL_M, bn, bk, split, 4, 4, reload) for reload in (False, True)
                   for bn in (32, 64, 128) for bk in (32, 64, 128) for split in (1, 2, 4)]
GEMV_CONFIGS = [Int4Config(1, bn, bk, split, warps, 4) for bn, warps in ((64, 4), (128, 8))
                for bk in (32, 64, 128) for split in (1, 2, 4)]
LARGE_M_CONFIGS = [Int4Config(bm, bn, bk, 1, warps, stages, reload) for reload in (False, True)
                   for bm, bn, bk, warps, stages in (
                       (32, 64, 128, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 128, 128, 8, 3),
                       (128, 64, 64, 4, 4), (128, 128, 64, 8, 3), (128, 128, 32, 8, 4), (64, 256, 64, 8, 3),
                       (128, 256, 64, 8, 3))]
# The interpreter's: small, and split-K on, so tests run both the split and the summing kernel.
INTERPRETER_CONFIGS = {1: Int4Config(1, 32, 32, 2), SMALL_M: Int4Config(SMALL_M, 32, 32, 2),
                       "large": Int4Config(16, 32, 32, 1)}
_TUNED: dict[tuple, Int4Config] = {}


@triton.jit
def _int4_mm_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, g_ptr, out_ptr, M, N, K, stride_xm,
                    GROUP_SIZE: tl.constexpr, HAS_GIDX: tl.constexpr, PER_ROW_GROUPS: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, RELOAD: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    # This program's share of K, in whole BLOCK_K tiles, so no tile straddles two splits.
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    shifts = ((tl.arange(0, BLOCK_K) % 8) * 4)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_k = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)  # GEMV (BLOCK_M == 1): summed over K at the end
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0).to(DOT_DTYPE)
        # Tile row k is nibble k % 8 of packed row k // 8: repeat each packed row 8 times, shift, mask.
        if RELOAD:
            q = tl.load(qw_ptr + (offs_k // 8)[:, None] * N + offs_n[None, :],
                        mask=k_mask[:, None] & n_mask[None, :], other=0)
        else:
            rows = k0 // 8 + tl.arange(0, BLOCK_K // 8)
            packed = tl.load(qw_ptr + rows[:, None] * N + offs_n[None, :],
                             mask=(rows < K // 8)[:, None] & n_mask[None, :], other=0)
            q = tl.reshape(tl.broadcast_to(packed[:, None, :], (BLOCK_K // 8, 8, BLOCK_N)), (BLOCK_K, BLOCK_N))
        q = (q >> shifts) & 0xF
        if PER_ROW_GROUPS:  # act-order g_idx, or groups narrower than the tile: a scale per weight
            if HAS_GIDX:
                g = tl.load(g_ptr + offs_k, mask=k_mask, other=0)
            else:
                g = offs_k // GROUP_SIZE
            at = g[:, None] * N + offs_n[None, :]
            w_mask = k_mask[:, None] & n_mask[None, :]
            s = tl.load(s_ptr + at, mask=w_mask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + at, mask=w_mask, other=0).to(tl.int32)
            w = (q - z).to(tl.float32) * s
            if BLOCK_M == 1:
                acc_k += tl.reshape(x, (BLOCK_K, 1)).to(tl.float32) * w
            else:
                acc += tl.dot(x, w.to(DOT_DTYPE), input_precision=PRECISION)
        else:
            # The tile lies in one group: multiply by exact integer weights, scale once per column.
            g = k0 // GROUP_SIZE
            s = tl.load(s_ptr + g * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + g * N + offs_n, mask=n_mask, other=0).to(tl.int32)
            w = q - z[None, :]
            if BLOCK_M == 1:
                acc_k += tl.reshape(x, (BLOCK_K, 1)).to(tl.float32) * w.to(tl.float32) * s[None, :]
            else:
                acc += tl.dot(x, w.to(DOT_DTYPE), input_precision=PRECISION) * s[None, :]
    if BLOCK_M == 1:
        acc = tl.reshape(tl.sum(acc_k, 0), (1, BLOCK_N))
    out = out_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc, mask=mask)


def int4_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                g_idx: torch.Tensor | None, group_size: int, config: Int4Config | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W in x's dtype, float32 accumulation (W as in int4_layout.py).
    config: a fixed tiling (tests, benchmarks); None tunes once per shape on a GPU."""
    _check(x, qweight, scales, zeros, g_idx, group_size)
    out = torch.empty(x.shape[0], qweight.shape[1], dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    args = (x, qweight, scales, zeros, g_idx, group_size, out)
    _launch(config or _pick_config(*args), *args)
    return out


def _launch(cfg: Int4Config, x, qweight, scales, zeros, g_idx, group_size, out) -> None:
    (m, k), n = x.shape, qweight.shape[1]
    target = out if cfg.split_k == 1 else torch.empty(cfg.split_k, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
    _int4_mm_kernel[grid](
        x, qweight, scales, zeros, qweight if g_idx is None else g_idx, target, m, n, k, x.stride(0),
        GROUP_SIZE=group_size, HAS_GIDX=g_idx is not None,
        PER_ROW_GROUPS=g_idx is not None or group_size % cfg.block_k != 0,
        DOT_DTYPE=dot_dtype(x.dtype), PRECISION=dot_precision(x.dtype), BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, RELOAD=cfg.reload,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.split_k > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](target, out, m * n, SPLIT_K=cfg.split_k, BLOCK=block)


def _pick_config(x, qweight, scales, zeros, g_idx, group_size, out) -> Int4Config:
    bucket = _bucket(x.shape[0])
    if interpreting():
        return INTERPRETER_CONFIGS[bucket if bucket <= SMALL_M else "large"]
    key = _tuning_key(x, qweight, g_idx, group_size)
    if key not in _TUNED:
        _TUNED[key] = _fastest(candidates(bucket, group_size, g_idx is not None),
                               x, qweight, scales, zeros, g_idx, group_size, out)
    return _TUNED[key]


def _bucket(m: int) -> int:
    """M = 1 (the GEMV candidates), 2..16 (one 16-row tile, so one tuning serves them all), else a power of 2."""
    return m if m == 1 else SMALL_M if m <= SMALL_M else triton.next_power_of_2(m)


def candidates(bucket: int, group_size: int, has_g_idx: bool) -> list[Int4Config]:
    """The configurations tuning times for an M bucket. Without g_idx, tiles inside one group (a scale per
    column rather than per weight), and 32-row tiles only for groups that narrow: compiling is most of a first
    call's cost."""
    configs = {1: GEMV_CONFIGS + SMALL_M_CONFIGS, SMALL_M: SMALL_M_CONFIGS}.get(bucket, LARGE_M_CONFIGS)
    if has_g_idx:
        return configs
    return [c for c in configs if group_size % c.block_k == 0 and (c.block_k >= 64 or group_size < 64)] or configs


def _fastest(configs: list[Int4Config], *args) -> Int4Config:
    from triton.testing import do_bench

    times = {}
    for cfg in configs:
        try:
            times[cfg] = do_bench(lambda: _launch(cfg, *args), warmup=5, rep=20)
        except Exception as e:  # out of shared memory, or a tiling this compiler rejects: try the others
            log.debug("INT4 GEMM candidate %s skipped: %s", cfg, e)
    if not times:
        raise RuntimeError(f"no INT4 GEMM configuration compiled and ran for x {tuple(args[0].shape)}, "
                           f"qweight {tuple(args[1].shape)}")
    return min(times, key=times.get)


def tuned_config(x: torch.Tensor, qweight: torch.Tensor, g_idx: torch.Tensor | None,
                 group_size: int) -> Int4Config | None:
    """The configuration tuning chose for calls like this one (None before the first such call)."""
    return _TUNED.get(_tuning_key(x, qweight, g_idx, group_size))


def _tuning_key(x, qweight, g_idx, group_size) -> tuple:
    return _bucket(x.shape[0]), qweight.shape[1], x.shape[1], group_size, g_idx is not None, x.dtype, x.device


def _check(x, qweight, scales, zeros, g_idx, group_size) -> None:
    check(x.dim() == 2 and x.dtype in (torch.float16, torch.bfloat16, torch.float32),
          f"x must be [M, K] float16/bfloat16/float32, got {tuple(x.shape)} {x.dtype}")
    check(x.stride(1) == 1, f"x must be contiguous along K, got strides {x.stride()}")
    k = x.shape[1]
    check(qweight.dtype == torch.int32 and qweight.dim() == 2 and qweight.is_contiguous(),
          f"qweight must be a contiguous int32 [K // 8, N], got {qweight.dtype} {tuple(qweight.shape)}")
    check(qweight.shape[0] * 8 == k, f"qweight {tuple(qweight.shape)} packs {qweight.shape[0] * 8} input rows, "
                                     f"x has K = {k}")
    n = qweight.shape[1]
    check(group_size >= 1, f"group_size must be >= 1, got {group_size}")
    groups = scales.shape[0] if scales.dim() == 2 else -1
    check(scales.dtype == x.dtype and scales.dim() == 2 and scales.shape[1] == n and scales.is_contiguous(),
          f"scales must be a contiguous {x.dtype} [groups, {n}], got {scales.dtype} {tuple(scales.shape)}")
    check(zeros.dtype == torch.uint8 and tuple(zeros.shape) == (groups, n) and zeros.is_contiguous(),
          f"zeros must be a contiguous uint8 [{groups}, {n}], got {zeros.dtype} {tuple(zeros.shape)}")
    if g_idx is None:
        check(groups == triton.cdiv(k, group_size),
              f"{groups} scale groups, but K = {k} in groups of {group_size} makes {triton.cdiv(k, group_size)}")
    else:
        check(g_idx.dtype == torch.int32 and tuple(g_idx.shape) == (k,) and g_idx.is_contiguous(),
              f"g_idx must be a contiguous int32 [{k}], got {g_idx.dtype} {tuple(g_idx.shape)}")
    tensors = [t for t in (x, qweight, scales, zeros, g_idx) if t is not None]
    check(len({t.device for t in tensors}) == 1, f"tensors on different devices: {[str(t.device) for t in tensors]}")
    check(x.is_cuda or interpreting(), "the Triton INT4 GEMM needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)")
