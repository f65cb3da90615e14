"""The native loops (quantkit/algorithms/native.cpp) against their torch forms: equal results, bit for bit
(AWQ's clip search: equal up to the summation order of its errors)."""

import pytest
import torch

from quantkit.algorithms import awq, gptq, native, rtn
from quantkit.algorithms.rtn import WeightScheme

pytestmark = pytest.mark.skipif(native.module() is None, reason="the native loops do not build here")


def _block(rows: int, n: int, groups: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    block = torch.randn(rows, n, generator=g)
    x = torch.randn(3 * n, n, generator=g)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(x.T @ x + torch.eye(n))), upper=True)
    scale, zero = rtn.grid_params(torch.randn(rows * groups, 16, generator=g), WeightScheme())
    return block, hinv.contiguous(), scale.view(rows, groups).contiguous(), zero.view(rows, groups).contiguous()


@pytest.mark.parametrize("first, last", [(0, 96), (32, 64), (95, 96)])
def test_quantize_columns_equals_the_torch_loop(first, last):
    rows, n, groups = 37, 96, 5
    block, hinv, scale, zero = _block(rows, n, groups, seed=first)
    column_group = torch.randint(0, groups, (n,), generator=torch.Generator().manual_seed(1))  # act-order: any order
    results = []
    for run in (native.module().quantize_columns, None):
        b = block.clone()
        codes, errors = torch.full_like(b, float("nan")), torch.full_like(b, float("nan"))
        if run is None:
            gptq.quantize_columns_torch(b, hinv, first, last, scale, zero, column_group, 15, codes, errors)
        else:
            run(b, hinv, first, last, scale, zero, column_group, 15.0, codes, errors)
        results.append((b, codes[:, first:last], errors[:, first:last]))
    (b_native, codes_native, errors_native), (b_torch, codes_torch, errors_torch) = results
    assert torch.equal(codes_native, codes_torch) and torch.equal(errors_native, errors_torch)
    assert torch.equal(b_native, b_torch)
    assert not torch.equal(b_native[:, first:], block[:, first:])  # the errors did move the later columns
    assert codes_native.min() >= 0 and codes_native.max() <= 15 and len(codes_native.unique()) > 8


def test_quantize_columns_rejects_bad_shapes():
    block, hinv, scale, zero = _block(8, 16, 2, seed=0)
    out = torch.empty_like(block)
    with pytest.raises(RuntimeError, match="hinv"):
        native.module().quantize_columns(block, hinv[:8, :8].contiguous(), 0, 16, scale, zero,
                                         torch.zeros(16, dtype=torch.int64), 15.0, out, out.clone())
    with pytest.raises(RuntimeError, match="group out of range"):
        native.module().quantize_columns(block, hinv, 0, 16, scale, zero, torch.full((16,), 2, dtype=torch.int64),
                                         15.0, out, out.clone())


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weights", ["none", "columns", "rows"])
def test_mse_grid_equals_the_torch_search(symmetric, scale_dtype, weights):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(500, 64, generator=g) * torch.rand(500, 1, generator=g) * 0.05
    w[3] = 0.0  # an all-zero row
    w[4] = w[4].abs()  # a row with no negative values
    column_weights = {"none": None, "columns": torch.rand(64, generator=g) * 4,
                      "rows": torch.rand(500, 64, generator=g)}[weights]
    scheme = WeightScheme(4, 64, symmetric, scale_dtype)
    factors = 1 - 0.2 * torch.arange(21, dtype=torch.float32) / 20
    scale, zero = rtn.mse_grid_params(w, scheme, column_weights=column_weights)
    scale_torch, zero_torch = rtn.mse_grid_params_torch(w, scheme, factors, column_weights)
    assert torch.equal(scale, scale_torch) and torch.equal(zero, zero_torch)
    shrunk = scale < rtn.grid_params(w, scheme)[0]
    assert 0 < int(shrunk.sum()) < len(w)  # some rows' ranges were shrunk, not all


@pytest.mark.parametrize("symmetric, independent", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("group_size, scale_dtype", [(64, torch.bfloat16), (32, torch.float16), (128, torch.float32)])
def test_clip_search_equals_the_torch_search(symmetric, independent, group_size, scale_dtype):
    """The same candidates, grids and codes; the errors are summed in another order, so a near-tie may
    pick another range, never a worse one (beyond float rounding)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(96, 4 * group_size, generator=g)
    w[:, 5] *= 8.0  # outliers that stretch their groups' ranges
    w[3] = 0.0  # an all-zero row
    x = torch.randn(512, 4 * group_size, generator=g) * torch.rand(4 * group_size, generator=g) * 3
    h = x.T @ x
    scheme = WeightScheme(4, group_size, symmetric, scale_dtype)
    ours = awq.search_clip(w, h, scheme, independent=independent)
    theirs = awq.search_clip_torch(w, h, scheme, independent=independent)

    def group_errors(clipped):
        grouped, blocks = awq._groups_and_blocks(w, h, scheme)
        diff = grouped - rtn.fake_quantize(clipped, scheme).view(grouped.shape)
        return torch.einsum("ogi,gij,ogj->og", diff, blocks, diff)

    same = (ours == theirs).view(96, 4, group_size).all(dim=-1)
    assert same.float().mean() > 0.99
    assert (group_errors(ours) <= group_errors(theirs) * (1 + 1e-5) + 1e-6).all()
    assert not torch.equal(ours, w)  # some groups were clipped


@pytest.mark.parametrize("act_order, mse, group_size", [(False, False, 64), (False, True, 32), (True, True, 64),
                                                        (False, True, -1)])
def test_gptq_gives_the_same_weights_with_and_without_the_native_loops(monkeypatch, act_order, mse, group_size):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(48, 256, generator=g)
    x = torch.randn(1024, 256, generator=g) * torch.rand(256, generator=g) * 2
    scheme = WeightScheme(4, group_size, False)
    with_native = gptq.gptq_quantize(w, x.T @ x, scheme, act_order=act_order, mse=mse).weight
    monkeypatch.setattr(native, "module", lambda: None)
    with_torch = gptq.gptq_quantize(w, x.T @ x, scheme, act_order=act_order, mse=mse).weight
    assert torch.equal(with_native.q, with_torch.q)
    assert torch.equal(with_native.scale, with_torch.scale) and torch.equal(with_native.zero, with_torch.zero)


def test_coordinate_descent_equals_the_torch_loop():
    g = torch.Generator().manual_seed(5)
    rows, n, groups = 29, 80, 5
    x = torch.randn(4 * n, n, generator=g) @ torch.randn(n, n, generator=g)
    h = (x.T @ x / (4 * n) + torch.eye(n)).contiguous()
    scale = (torch.rand(rows, groups, generator=g) * 0.1 + 0.01).contiguous()
    codes = torch.randint(0, 16, (rows, n), generator=g).float()
    column_group = (torch.arange(n) // (n // groups)).contiguous()
    # codes a few steps off a target: (Q - T) H, as gptq.coordinate_descent starts it
    offsets = torch.randn(rows, n, generator=g) * 2 * scale[:, column_group]
    gradient = (offsets @ h).contiguous()
    order = torch.randperm(n, generator=g)
    results = []
    for run in (native.module().coordinate_descent, gptq.coordinate_descent_torch):
        c, grad = codes.clone(), gradient.clone()
        moved = run(c, grad, h, scale, column_group, order, 15.0, 4)
        results.append((c, grad, moved))
    (c_native, g_native, moved_native), (c_torch, g_torch, moved_torch) = results
    assert torch.equal(c_native, c_torch) and torch.equal(g_native, g_torch) and moved_native == moved_torch > 0
    assert c_native.min() >= 0 and c_native.max() <= 15
