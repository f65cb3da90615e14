"""The Triton INT4 GEMM against the torch reference (int4_layout.int4_matmul_reference), interpreted on CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from quantkit.runtime.kernels import int4_gemm  # noqa: E402
from quantkit.runtime.kernels.int4_gemm import (GEMV_CONFIGS, INTERPRETER_CONFIGS, LARGE_M_CONFIGS,  # noqa: E402
                                              SMALL_M, SMALL_M_CONFIGS, Int4Config, int4_matmul)
from quantkit.runtime.kernels.int4_layout import dequantize_int4, int4_matmul_reference, pack_int4  # noqa: E402
from tests.runtime.kernels.conftest import (DEVICE, assert_within_one_ulp, dot_error_bound,  # noqa: E402
                                            interpreted, poisoned_allocations, sqnr_db)

SQNR_DB = {torch.float32: 110.0, torch.float16: 60.0, torch.bfloat16: 40.0}  # vs the reference in the same dtype


def make_weights(n: int, k: int, group: int, symmetric: bool, act_order: bool, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    q = torch.randint(0, 16, (n, k), generator=gen)
    scales = torch.rand(n, groups, generator=gen) * 0.02 + 0.002
    zeros = torch.full((n, groups), 8) if symmetric else torch.randint(0, 16, (n, groups), generator=gen)
    qweight, scales, zeros = pack_int4(q, scales, zeros)
    # act-order: each group still holds `group` rows, scattered over K
    g_idx = (torch.randperm(k, generator=gen) // group).to(torch.int32) if act_order else None
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return to(qweight), to(scales.to(dtype)), to(zeros), to(g_idx)


def check_against_reference(m, n, k, group, symmetric, act_order, dtype, config=None, seed=0):
    qweight, scales, zeros, g_idx = make_weights(n, k, group, symmetric, act_order, dtype, seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE, dtype)
    with poisoned_allocations():  # the output and split-K partials start as NaN
        y = int4_matmul(x, qweight, scales, zeros, g_idx, group, config=config)
    assert y.shape == (m, n) and y.dtype == dtype
    assert not y.isnan().any(), "an output element was never written"
    # Inputs are exact in float32, so the float32 reference is the exact result up to summation order.
    # With a scale per weight (act-order, or groups narrower than the tile) the kernel rounds each weight to
    # the dot operand dtype, as tensor cores take it; per-tile groups keep exact integer weights, and so
    # does the GEMV (float32 products, no dot).
    bucket = int4_gemm._bucket(m)
    config = config or INTERPRETER_CONFIGS[bucket if bucket <= SMALL_M else "large"]
    per_row = (act_order or group % config.block_k != 0) and config.block_m != 1
    operand = torch.float32 if not per_row or (dtype == torch.bfloat16 and interpreted()) else dtype
    w = dequantize_int4(qweight, scales.float(), zeros, g_idx, group, operand).float()
    exact, bound = x.float() @ w, dot_error_bound(x, w)
    if dtype == torch.float32:
        assert ((y - exact).abs() <= bound).all()
    else:
        assert_within_one_ulp(y, exact, bound)
    db = sqnr_db(int4_matmul_reference(x, qweight, scales, zeros, g_idx, group), y)
    assert db >= SQNR_DB[dtype], f"SQNR {db:.1f} dB"
    return db


@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_odd_shapes_each_dtype(m, dtype):
    # N = 72: a partial N tile; K = 192 in groups of 64; M = 17 takes the tiled (prefill) path with a partial M tile
    check_against_reference(m, 72, 192, 64, symmetric=False, act_order=False, dtype=dtype)


@pytest.mark.parametrize("group,symmetric,act_order", [
    (32, True, False), (128, False, False), (32, False, True), (64, True, True)])
@pytest.mark.parametrize("m", [2, 17])
def test_group_sizes_symmetry_and_act_order(m, group, symmetric, act_order):
    # K = 192 in groups of 128: the last group is half full
    check_against_reference(m, 72, 192, group, symmetric, act_order, torch.float16, seed=group + m)


@pytest.mark.parametrize("config", [
    Int4Config(16, 32, 32, split_k=4),  # K = 136 is 5 tiles: the 4th split gets one, the 5th nothing
    Int4Config(16, 64, 64, split_k=3),  # tile of 64 rows over groups of 32: a scale per row
    Int4Config(16, 16, 128, split_k=1),
    Int4Config(32, 32, 64, split_k=1),
    Int4Config(16, 32, 32, split_k=4, reload=True),  # packed words loaded per row
    Int4Config(32, 64, 64, split_k=2, reload=True),
    Int4Config(1, 64, 64, split_k=3),  # GEMV over groups of 32: a scale per row
], ids=lambda c: f"m{c.block_m}n{c.block_n}k{c.block_k}s{c.split_k}{'r' if c.reload else ''}")
def test_tilings_with_k_tail(config):
    # K = 136 = 4 groups of 32 + 8 rows: the last tile is mostly masked, the last group one packed row
    check_against_reference(5, 40, 136, 32, symmetric=False, act_order=False, dtype=torch.float16, config=config)


def test_act_order_differs_from_contiguous_groups():
    """g_idx is really read: the same weights with shuffled group membership give another product."""
    qweight, scales, zeros, g_idx = make_weights(24, 128, 32, False, True, torch.float32, seed=3)
    x = torch.randn(2, 128).to(DEVICE)
    with_g = int4_matmul(x, qweight, scales, zeros, g_idx, 32)
    without = int4_matmul(x, qweight, scales, zeros, None, 32)
    assert sqnr_db(with_g, without) < 20


def test_checks_name_the_problem():
    qweight, scales, zeros, _ = make_weights(16, 64, 32, True, False, torch.float16, seed=0)
    x = torch.randn(2, 64, dtype=torch.float16, device=DEVICE)
    cases = [
        ((x.float(), qweight, scales, zeros, None, 32), "scales must be a contiguous torch.float32"),
        ((x[:, :56], qweight, scales, zeros, None, 32), "packs 64 input rows, x has K = 56"),
        ((x.t().contiguous().t(), qweight, scales, zeros, None, 32), "contiguous along K"),
        ((x, qweight, scales, zeros, None, 16), "K = 64 in groups of 16 makes 4"),
        ((x, qweight, scales, zeros.int(), None, 32), "zeros must be a contiguous uint8"),
        ((x, qweight, scales, zeros, torch.zeros(64, dtype=torch.int64, device=DEVICE), 32), "g_idx must be"),
        ((x, qweight.t(), scales, zeros, None, 32), "qweight must be a contiguous int32"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            int4_matmul(*args)


def distinct_tilings(configs: list[Int4Config]) -> list[Int4Config]:
    """One config per tiling and unpacking (warps and stages change nothing in the interpreter)."""
    seen = {}
    for c in configs:
        seen.setdefault((c.block_m, c.block_n, c.block_k, c.reload), c)
    return list(seen.values())


@pytest.mark.parametrize("config", distinct_tilings(GEMV_CONFIGS + SMALL_M_CONFIGS + LARGE_M_CONFIGS),
                         ids=lambda c: f"m{c.block_m}n{c.block_n}k{c.block_k}s{c.split_k}{'r' if c.reload else ''}")
def test_every_gpu_tuning_candidate_computes_the_product(config):
    # groups of 64: K tiles of 128 take the scale-per-row path, narrower ones the per-tile one
    m = {1: 1, SMALL_M: 3}.get(config.block_m, 20)
    check_against_reference(m, 72, 256, 64, symmetric=False, act_order=False, dtype=torch.float16, config=config)


def test_tuning_candidates_and_the_fastest(monkeypatch):
    from triton.runtime.errors import OutOfResources

    assert {c.block_k for c in int4_gemm.candidates(16, 128, False)} == {64, 128}
    assert {c.block_k for c in int4_gemm.candidates(16, 32, False)} == {32}
    assert {c.block_k for c in int4_gemm.candidates(64, 48, False)} == {32, 64, 128}  # no tile fits: any
    assert int4_gemm.candidates(256, 128, True) == LARGE_M_CONFIGS
    assert {c.block_m for c in int4_gemm.candidates(1, 64, False)} == {1, SMALL_M}  # M = 1: GEMV or a tile
    assert [int4_gemm._bucket(m) for m in (1, 2, 16, 17, 64, 100)] == [1, 16, 16, 32, 64, 128]
    configs = int4_gemm.candidates(16, 64, False)[:4]
    timings = iter([3.0, OutOfResources(1, 2, "shared"), 1.0, 2.0])

    def fake_do_bench(fn, **_):
        fn()  # the launch really runs (interpreted)
        t = next(timings)
        if isinstance(t, Exception):
            raise t
        return t

    monkeypatch.setattr("triton.testing.do_bench", fake_do_bench)
    qweight, scales, zeros, _ = make_weights(40, 128, 64, False, False, torch.float16, seed=5)
    x = torch.randn(2, 128, dtype=torch.float16, device=DEVICE)
    out = torch.empty(2, 40, dtype=torch.float16, device=DEVICE)
    assert int4_gemm._fastest(configs, x, qweight, scales, zeros, None, 64, out) == configs[2]
    timings = iter([OutOfResources(1, 2, "shared")] * 2)
    with pytest.raises(RuntimeError, match="no INT4 GEMM configuration compiled and ran"):
        int4_gemm._fastest(configs[:2], x, qweight, scales, zeros, None, 64, out)
