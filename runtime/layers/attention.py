"""Attention over the paged KV cache: write this step's K/V by slot, then attend over each sequence's blocks.

With the Triton kernels on (see kernels/dispatch.py) K/V are written by the Triton KV-write kernel and a decode
step (one query per sequence) runs the paged decode kernel; on CPU a decode step runs the native kernel
(kernels/cpu_attention.py) under "auto". Prefill and mixed steps stay on the torch path."""

from __future__ import annotations

import torch
from torch import nn

from quantkit.runtime.context import ForwardContext
from quantkit.runtime.kernels import dispatch, reference

# Scales taken from the first batch leave this much headroom above its largest |K| (|V|): fp8 is floating
# point, so headroom costs precision only among the smallest values, which become subnormal.
FIRST_BATCH_HEADROOM = 2.0


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.scale = head_dim ** -0.5
        # Set by the model runner once the cache is allocated.
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.k_scale: float | None = None  # fp8 cache: None until the first batch sets it (no checkpoint scales)
        self.v_scale: float | None = None
        self.kernels: str | None = None  # EngineConfig.kernels; None: QUANTKIT_KERNELS (dispatch.kernel_mode)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """q: [T, heads, D], k and v: [T, kv_heads, D] -> [T, heads * D]."""
        if self.k_cache.dtype == torch.uint8 and self.k_scale is None:
            self.k_scale, self.v_scale = first_batch_scale(k), first_batch_scale(v)
        triton = dispatch.use_triton(self.kernels, q.device)
        mode = "triton" if triton else "reference"
        dispatch.write_kv(self.k_cache, k, ctx.slot_mapping, self.k_scale, mode)
        dispatch.write_kv(self.v_cache, v, ctx.slot_mapping, self.v_scale, mode)
        if ctx.max_query_len == 1 and dispatch.decode_attention_path(self.kernels, q, self.k_cache) != "reference":
            # Decode: sequence b's one query sits at position p, so it attends to p + 1 tokens.
            lens = ctx.context_lens if ctx.context_lens is not None else ctx.positions + 1
            out = dispatch.paged_decode_attention(q, self.k_cache, self.v_cache, ctx.block_tables, lens,
                                                  ctx.block_size, self.scale, self.k_scale, self.v_scale,
                                                  self.kernels)
            return out.reshape(ctx.batch_size, self.num_heads * self.head_dim)
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


def first_batch_scale(x: torch.Tensor) -> float:
    """An fp8 KV scale from the values of one batch: max |x| * headroom lands on fp8's largest value, 448."""
    return max(float(x.abs().max()), 1e-6) * FIRST_BATCH_HEADROOM / reference.FP8_MAX
