"""PagedAttention on its own: fp8 scales from the first batch when the checkpoint has none."""

import torch

from quantkit.runtime.context import ForwardContext
from quantkit.runtime.kernels import reference
from quantkit.runtime.layers.attention import FIRST_BATCH_HEADROOM, PagedAttention


def test_fp8_scales_come_from_the_first_batch_and_stay():
    attn = PagedAttention(num_heads=4, num_kv_heads=2, head_dim=8)
    attn.k_cache = torch.zeros(16, 2, 8, dtype=torch.uint8)
    attn.v_cache = torch.zeros_like(attn.k_cache)
    attn.kernels = "reference"
    ctx = ForwardContext(positions=torch.arange(3), slot_mapping=torch.tensor([4, 5, 6]),
                         query_index=torch.arange(3), block_tables=torch.tensor([[1]]),
                         attn_mask=torch.ones(1, 1, 2 * 3, 4, dtype=torch.bool),
                         batch_size=1, max_query_len=3, block_size=4)
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8) * 700, torch.randn(3, 2, 8) * 0.01
    attn(q, k, v, ctx)
    assert attn.k_scale == float(k.abs().max()) * FIRST_BATCH_HEADROOM / 448
    assert attn.v_scale == float(v.abs().max()) * FIRST_BATCH_HEADROOM / 448
    stored = reference.read_kv(attn.k_cache, ctx.block_tables, 4, torch.float32, attn.k_scale)[0, :3]
    assert (stored - k).abs().max() <= k.abs().max() / 16  # within fp8 rounding; a scale of 1 would clip at 448
    first = attn.k_scale
    attn(q, k * 10, v, ctx)  # later batches reuse the scale
    assert attn.k_scale == first
