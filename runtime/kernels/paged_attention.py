"""Paged decode attention in Triton: one query token per sequence over its K/V in the paged cache.

Grid (sequence, KV head, partition): a program loads the query heads of one KV head together (GQA reads
each K/V row once for the whole group), walks its partition of the context in BLOCK_N-token tiles gathered
through the block table, dequantizes fp8 bytes in registers (fp8 * scale, as reference.read_kv) and keeps
an online softmax in float32. Long contexts split into partitions so a small batch still fills the GPU; a
second kernel merges the partitions' (max, sum, weighted V) in a fixed order. The torch reference is
reference.paged_decode_attention.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantkit.runtime.kernels._triton import check, dot_dtype, dot_precision, interpreting

LOG2E = 1.4426950408889634
PARTITION = 512  # tokens per program on a GPU; one partition below this needs no merge
BLOCK_N = 64  # tokens per tile


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, m_ptr, l_ptr,
                   qk_scale, k_scale, v_scale, stride_qb, stride_qh, stride_tb, stride_cs,
                   NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, PARTITION: tl.constexpr, NUM_PARTS: tl.constexpr,
                   GROUP_PAD: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    b, kvh, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    heads = kvh * GROUP + tl.arange(0, GROUP_PAD)  # this KV head's query heads
    dims = tl.arange(0, DIM_PAD)
    h_mask, d_mask = heads < (kvh + 1) * GROUP, dims < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)
    length = tl.load(lens_ptr + b)
    start = part * PARTITION
    end = tl.minimum(length, start + PARTITION)
    m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, DIM_PAD), tl.float32)
    for t0 in range(start, end, BLOCK_N):
        tok = t0 + tl.arange(0, BLOCK_N)
        valid = tok < end
        block = tl.load(table_ptr + b * stride_tb + tok // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        at = (block * BLOCK_SIZE + tok % BLOCK_SIZE)[:, None] * stride_cs + kvh * HEAD_DIM + dims[None, :]
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + at, mask=kv_mask, other=0)
        v = tl.load(v_ptr + at, mask=kv_mask, other=0)
        if FP8:  # uint8 bytes of float8_e4m3fn; the reference dequantizes in float32, then to q's dtype
            k = k.to(tl.float8e4nv, bitcast=True).to(tl.float32) * k_scale
            v = v.to(tl.float8e4nv, bitcast=True).to(tl.float32) * v_scale
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * qk_scale  # log2 units
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
        m_i = m_new
    if NUM_PARTS == 1:
        out = out_ptr + (b * NUM_HEADS + heads[:, None]) * HEAD_DIM + dims[None, :]
        tl.store(out, acc / l_i[:, None], mask=h_mask[:, None] & d_mask[None, :])
    else:
        # Unnormalized partials; a partition past the sequence's end leaves (-inf, 0, 0), which merge ignores.
        row = (b * NUM_HEADS + heads) * NUM_PARTS + part
        tl.store(m_ptr + row, m_i, mask=h_mask)
        tl.store(l_ptr + row, l_i, mask=h_mask)
        tl.store(out_ptr + row[:, None] * HEAD_DIM + dims[None, :], acc, mask=h_mask[:, None] & d_mask[None, :])


@triton.jit
def _merge_kernel(acc_ptr, m_ptr, l_ptr, out_ptr, NUM_PARTS: tl.constexpr, PARTS_PAD: tl.constexpr,
                  HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr):
    row = tl.program_id(0)  # b * num_heads + head
    parts, dims = tl.arange(0, PARTS_PAD), tl.arange(0, DIM_PAD)
    p_mask, d_mask = parts < NUM_PARTS, dims < HEAD_DIM
    m = tl.load(m_ptr + row * NUM_PARTS + parts, mask=p_mask, other=float("-inf"))
    l_p = tl.load(l_ptr + row * NUM_PARTS + parts, mask=p_mask, other=0.0)
    acc = tl.load(acc_ptr + (row * NUM_PARTS + parts)[:, None] * HEAD_DIM + dims[None, :],
                  mask=p_mask[:, None] & d_mask[None, :], other=0.0)
    m_max = tl.max(m, 0)
    w = tl.exp2(m - m_max)  # 0 for empty partitions (m = -inf) and padding
    out = tl.sum(w[:, None] * acc, 0) / tl.sum(w * l_p, 0)
    tl.store(out_ptr + row * HEAD_DIM + dims, out, mask=d_mask)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, scale: float,
                           k_scale: float | None = None, v_scale: float | None = None,
                           partition: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """q [B, heads, D] -> [B, heads, D] in q's dtype: softmax(q k^T * scale) v over each sequence's first
    context_lens[b] (>= 1) cached tokens. Caches [num_slots, kv_heads, D], uint8 (fp8 bytes, dequantized as
    fp8 * k_scale / v_scale) or q's dtype; block_tables [B, max_blocks]. partition / block_n: tests only."""
    _check(q, k_cache, v_cache, block_tables, context_lens, block_size, k_scale, v_scale)
    bsz, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    block_n = block_n or (16 if interpreting() else BLOCK_N)
    partition = partition or PARTITION
    check(partition % block_n == 0, f"partition {partition} must be a multiple of block_n {block_n}")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if bsz == 0:
        return out
    # Upper bound of every context from the table's width: no device sync to read context_lens.
    parts = triton.cdiv(block_tables.shape[1] * block_size, partition)
    dim_pad = triton.next_power_of_2(dim)
    if parts > 1:
        partial = torch.empty(bsz, heads, parts, dim, dtype=torch.float32, device=q.device)
        m = torch.empty(bsz, heads, parts, dtype=torch.float32, device=q.device)
        l_sum = torch.empty_like(m)
    else:
        partial, m, l_sum = out, out, out  # m / l unused with one partition
    fp8 = k_cache.dtype == torch.uint8
    _decode_kernel[(bsz, kv_heads, parts)](
        q, k_cache, v_cache, block_tables, context_lens, partial, m, l_sum, scale * LOG2E,
        float(k_scale) if fp8 else 1.0, float(v_scale) if fp8 else 1.0, q.stride(0), q.stride(1),
        block_tables.stride(0), k_cache.stride(0), NUM_HEADS=heads, GROUP=group, HEAD_DIM=dim,
        BLOCK_SIZE=block_size, PARTITION=partition, NUM_PARTS=parts, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        DIM_PAD=dim_pad, BLOCK_N=block_n, FP8=fp8, DOT_DTYPE=dot_dtype(q.dtype), PRECISION=dot_precision(q.dtype))
    if parts > 1:
        _merge_kernel[(bsz * heads,)](partial, m, l_sum, out, NUM_PARTS=parts,
                                      PARTS_PAD=triton.next_power_of_2(parts), HEAD_DIM=dim, DIM_PAD=dim_pad)
    return out


def _check(q, k_cache, v_cache, block_tables, context_lens, block_size, k_scale, v_scale) -> None:
    check(q.dim() == 3 and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and q.stride(2) == 1,
          f"q must be [B, heads, D] float16/bfloat16/float32 contiguous in D, got {q.dtype} {tuple(q.shape)}")
    bsz, heads, dim = q.shape
    check(k_cache.dim() == 3 and k_cache.shape == v_cache.shape and k_cache.dtype == v_cache.dtype
          and k_cache.stride() == v_cache.stride(), "k_cache and v_cache must be alike [num_slots, kv_heads, D]")
    check(k_cache.shape[2] == dim and k_cache.stride(2) == 1 and k_cache.stride(1) == dim,
          f"caches {tuple(k_cache.shape)} must be contiguous [num_slots, kv_heads, {dim}]")
    check(heads % k_cache.shape[1] == 0, f"{heads} query heads do not group over {k_cache.shape[1]} KV heads")
    fp8 = k_cache.dtype == torch.uint8
    check(fp8 or k_cache.dtype == q.dtype, f"a float cache must be in q's dtype {q.dtype}, got {k_cache.dtype}")
    check(not fp8 or (k_scale is not None and v_scale is not None), "an fp8 cache needs k_scale and v_scale")
    check(k_cache.shape[0] % block_size == 0, f"{k_cache.shape[0]} slots are not whole blocks of {block_size}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == bsz and block_tables.stride(1) == 1
          and block_tables.dtype in (torch.int32, torch.int64),
          f"block_tables must be int32/int64 [{bsz}, max_blocks], got {block_tables.dtype} {tuple(block_tables.shape)}")
    check(context_lens.shape == (bsz,) and context_lens.dtype in (torch.int32, torch.int64),
          f"context_lens must be int32/int64 [{bsz}], got {context_lens.dtype} {tuple(context_lens.shape)}")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, context_lens)}
    check(len(devices) == 1, f"tensors on different devices: {sorted(map(str, devices))}")
    check(q.is_cuda or interpreting(), "the Triton paged attention needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)")
