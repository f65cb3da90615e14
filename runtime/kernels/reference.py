"""Torch reference kernels for the paged KV cache: write K/V by slot, read them back by slot, attend.

The cache of one layer is [num_slots, num_kv_heads, head_dim] with slot = block_id * block_size + offset;
reads gather whole blocks through the block tables.
An FP8 cache is held as uint8 bytes of float8_e4m3fn values (index writes on float8 tensors are not
supported everywhere) and reads back as fp8 * scale, the compressed-tensors / vLLM convention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448


def write_kv(cache: torch.Tensor, x: torch.Tensor, slots: torch.Tensor, scale: float | None) -> None:
    """cache[slots] = x, stored as fp8(x / scale) when the cache is a uint8 (fp8) cache."""
    if cache.dtype == torch.uint8:
        x = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(torch.uint8)
    cache[slots] = x


def read_kv(cache: torch.Tensor, block_tables: torch.Tensor, block_size: int, dtype: torch.dtype,
            scale: float | None) -> torch.Tensor:
    """The K or V of each sequence's blocks, [B, max_blocks * block_size, kv_heads, D] in `dtype`
    (block_tables [B, max_blocks], padded with the null block), dequantizing an fp8 cache."""
    slots, heads, dim = cache.shape
    b, n = block_tables.shape
    x = cache.view(slots // block_size, block_size, heads, dim)[block_tables].view(b, n * block_size, heads, dim)
    if cache.dtype == torch.uint8:
        return (x.view(FP8_DTYPE).float() * scale).to(dtype)
    return x


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """Batched attention with grouped KV heads folded into the query axis.

    q: [B, kv_heads, group * Q, D] (query heads of one KV head, then query positions),
    k, v: [B, kv_heads, L, D], mask: [B, 1, group * Q, L] bool (True attends). Returns q's shape.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, scale: float,
                           k_scale: float | None = None, v_scale: float | None = None) -> torch.Tensor:
    """One query per sequence, q [B, heads, D] -> [B, heads, D], over each sequence's first context_lens[b]
    cached tokens (the reference of kernels.paged_attention; PagedAttention's decode path computes the same)."""
    b, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    keys = read_kv(k_cache, block_tables, block_size, q.dtype, k_scale).transpose(1, 2)
    values = read_kv(v_cache, block_tables, block_size, q.dtype, v_scale).transpose(1, 2)
    mask = torch.arange(keys.shape[2], device=q.device)[None, :] < context_lens[:, None].to(q.device)
    out = paged_attention(q.view(b, kv_heads, heads // kv_heads, dim), keys, values, mask[:, None, None, :], scale)
    return out.reshape(b, heads, dim)
