"""Attention over the paged KV cache: write this step's K/V by slot, then attend over each sequence's blocks."""

from __future__ import annotations

import torch
from torch import nn

from quantkit.runtime.context import ForwardContext
from quantkit.runtime.kernels import reference


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.scale = head_dim ** -0.5
        # Set by the model runner once the cache is allocated.
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.k_scale: float | None = None
        self.v_scale: float | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """q: [T, heads, D], k and v: [T, kv_heads, D] -> [T, heads * D]."""
        reference.write_kv(self.k_cache, k, ctx.slot_mapping, self.k_scale)
        reference.write_kv(self.v_cache, v, ctx.slot_mapping, self.v_scale)
        b, qlen, h, kvh, g, d = ctx.batch_size, ctx.max_query_len, self.num_heads, self.num_kv_heads, self.group, self.head_dim
        keys = reference.read_kv(self.k_cache, ctx.block_tables, ctx.block_size, q.dtype, self.k_scale)
        values = reference.read_kv(self.v_cache, ctx.block_tables, ctx.block_size, q.dtype, self.v_scale)
        keys, values = keys.transpose(1, 2), values.transpose(1, 2)
        if qlen == 1:  # decode: one query per sequence, no padding
            padded = q.view(b, kvh, g, d)
        else:
            padded = q.new_zeros(b * qlen, h, d)
            padded[ctx.query_index] = q
            padded = padded.view(b, qlen, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * qlen, d)
        out = reference.paged_attention(padded, keys, values, ctx.attn_mask, self.scale)
        if qlen == 1:
            return out.reshape(b, h * d)
        out = out.view(b, kvh, g, qlen, d).permute(0, 3, 1, 2, 4).reshape(b * qlen, h * d)
        return out[ctx.query_index]
