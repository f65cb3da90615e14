"""The Triton paged decode attention against reference.paged_decode_attention, interpreted on CPU."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from quantkit.runtime.kernels import paged_attention, reference  # noqa: E402
from tests.runtime.kernels.conftest import DEVICE, poisoned_allocations, sqnr_db  # noqa: E402

# fp16: the kernel rounds softmax weights to fp16 for the P @ V product (as flash attention does); bf16 also
# stores through the interpreter's truncating cast.
SQNR_DB = {torch.float32: 110.0, torch.float16: 60.0, torch.bfloat16: 40.0}
K_SCALE, V_SCALE = 0.05, 0.02


def make_case(lens, heads, kv_heads, dim, block_size, cache_dtype, dtype, seed=0, spare_columns=1):
    """Caches with every sequence's tokens in shuffled physical blocks (block 0 is the null block). Returns
    the clean caches (zeros off the sequences) and poisoned ones (NaN there: masking must keep it out)."""
    gen = torch.Generator().manual_seed(seed)
    widths = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(widths) + 3
    table = torch.zeros(len(lens), max(widths) + spare_columns, dtype=torch.int64)
    physical = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    used = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    for b, (n, w) in enumerate(zip(lens, widths)):
        table[b, :w] = torch.tensor([physical.pop() for _ in range(w)])
        for t in range(n):
            used[table[b, t // block_size] * block_size + t % block_size] = True
    caches = []
    for std, scale in ((3.0, K_SCALE), (1.0, V_SCALE)):
        values = torch.randn(num_blocks * block_size, kv_heads, dim, generator=gen) * std
        if cache_dtype == torch.uint8:
            clean = (values / scale).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
            poison = 0x7F  # fp8 NaN
        else:
            clean, poison = values.to(cache_dtype), float("nan")
        clean[~used] = 0
        poisoned = clean.clone()
        poisoned[~used] = poison
        caches.append((clean.to(DEVICE), poisoned.to(DEVICE)))
    q = torch.randn(len(lens), heads, dim, generator=gen).to(DEVICE, dtype)
    return q, caches, table.to(DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE)


def check(lens, heads=6, kv_heads=2, dim=40, block_size=8, fp8=True, dtype=torch.float32, partition=None, seed=0):
    cache_dtype = torch.uint8 if fp8 else dtype
    q, ((k, k_poisoned), (v, v_poisoned)), table, context_lens = make_case(
        lens, heads, kv_heads, dim, block_size, cache_dtype, dtype, seed)
    scale = dim ** -0.5
    expected = reference.paged_decode_attention(q, k, v, table, context_lens, block_size, scale, K_SCALE, V_SCALE)
    with poisoned_allocations():  # the output and the partition workspaces start as NaN
        out = paged_attention.paged_decode_attention(q, k_poisoned, v_poisoned, table, context_lens, block_size,
                                                     scale, K_SCALE, V_SCALE, partition=partition)
    assert out.shape == q.shape and out.dtype == dtype
    assert not out.isnan().any(), "NaN: an output never written, or a key/value past the context attended"
    db = sqnr_db(expected, out)
    assert db >= SQNR_DB[dtype], f"SQNR {db:.1f} dB"
    return db


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "fp16-cache"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_variable_lengths_gqa(dtype, fp8):
    # head_dim 40 pads to 64; lengths end mid-block, one is a single token
    check([1, 37, 90, 16], dtype=dtype, fp8=fp8)


@pytest.mark.parametrize("partition", [16, 32])
def test_partitions_merge(partition):
    # 90 tokens over 6 (or 3) partitions; shorter sequences leave whole partitions empty
    check([1, 37, 90, 16], partition=partition, dtype=torch.float16, seed=1)


@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [(4, 4, 16, 16), (8, 1, 32, 4), (9, 3, 64, 16)])
def test_head_groupings(heads, kv_heads, dim, block_size):
    check([5, 33, 20], heads=heads, kv_heads=kv_heads, dim=dim, block_size=block_size, partition=32, seed=2)


def test_reference_is_softmax_attention_over_the_context():
    """The reference itself, against attention written out per sequence and head."""
    lens, heads, kv_heads, dim, bs = [3, 21], 4, 2, 8, 4
    q, ((k, _), (v, _)), table, context_lens = make_case(lens, heads, kv_heads, dim, bs, torch.uint8, torch.float32)
    out = reference.paged_decode_attention(q, k, v, table, context_lens, bs, 0.3, K_SCALE, V_SCALE)
    for b, n in enumerate(lens):
        slots = [int(table[b, t // bs]) * bs + t % bs for t in range(n)]
        keys = k[slots].view(torch.float8_e4m3fn).float() * K_SCALE
        values = v[slots].view(torch.float8_e4m3fn).float() * V_SCALE
        for h in range(heads):
            weights = torch.softmax(keys[:, h // 2] @ q[b, h] * 0.3, 0)
            torch.testing.assert_close(out[b, h], weights @ values[:, h // 2])


def test_checks_name_the_problem():
    q, ((k, _), (v, _)), table, lens = make_case([5], 6, 2, 16, 8, torch.uint8, torch.float16)
    run = paged_attention.paged_decode_attention
    with pytest.raises(ValueError, match="needs k_scale and v_scale"):
        run(q, k, v, table, lens, 8, 0.25)
    with pytest.raises(ValueError, match="do not group"):
        run(q[:, :5], k, v, table, lens, 8, 0.25, 1.0, 1.0)
    with pytest.raises(ValueError, match="context_lens must be"):
        run(q, k, v, table, lens.float(), 8, 0.25, 1.0, 1.0)
    with pytest.raises(ValueError, match="float cache must be in q's dtype"):
        run(q, k.float(), v.float(), table, lens, 8, 0.25)
