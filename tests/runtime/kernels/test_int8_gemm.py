"""The Triton W8A8 INT8 GEMM against the exact integer product rescaled, interpreted on CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from quantkit.runtime.kernels import dispatch  # noqa: E402
from quantkit.runtime.kernels.int8_gemm import Int8Config, int8_matmul  # noqa: E402
from tests.runtime.kernels.conftest import DEVICE, assert_within_one_ulp, poisoned_allocations  # noqa: E402

U32 = 2.0 ** -24


def operands(m: int, n: int, k: int, bias: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    weight = torch.randint(-128, 128, (k, n), generator=gen, dtype=torch.int8)
    x_scale, w_scale = torch.rand(m, generator=gen) * 0.05, torch.rand(n, generator=gen) * 0.01
    b = torch.randn(n, generator=gen) if bias else None
    return [None if t is None else t.to(DEVICE) for t in (codes, x_scale, weight, w_scale, b)]


def exact_and_bound(codes, x_scale, weight, w_scale, bias):
    product = (codes.double() @ weight.double()) * x_scale.double()[:, None] * w_scale.double()
    b = 0.0 if bias is None else bias.double()
    return product + b, 3 * U32 * (product.abs() + abs(b))  # the float32 rescale's three roundings


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m, n, k", [(1, 40, 100), (3, 72, 33), (17, 48, 130), (40, 33, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_gemm_is_the_rescaled_integer_product(m, n, k, dtype, bias):
    args = operands(m, n, k, bias)
    with poisoned_allocations():  # the output starts as NaN: every element must be written
        y = int8_matmul(*args, dtype)
    assert y.shape == (m, n) and y.dtype == dtype and not y.isnan().any()
    exact, bound = exact_and_bound(*args)
    if dtype == torch.float32:
        assert ((y.double() - exact).abs() <= bound).all()
    else:
        assert_within_one_ulp(y.cpu(), exact.float().cpu(), bound.float().cpu())


def test_int8_gemm_with_a_tile_wider_than_the_matrix():
    args = operands(5, 20, 24, True)
    y = int8_matmul(*args, torch.float32, config=Int8Config(16, 64, 64))
    exact, bound = exact_and_bound(*args)
    assert ((y.double() - exact).abs() <= bound).all()


def test_int8_gemm_checks_its_operands():
    codes, x_scale, weight, w_scale, _ = operands(4, 16, 32, False)
    with pytest.raises(ValueError, match="weight must be"):
        int8_matmul(codes, x_scale, weight.T.contiguous(), w_scale, None, torch.float32)
    with pytest.raises(ValueError, match="x_scale must be"):
        int8_matmul(codes, x_scale.double(), weight, w_scale, None, torch.float32)


def test_dispatch_runs_the_kernel_or_the_reference_alike():
    args = operands(9, 24, 48, True)
    triton_y = dispatch.int8_matmul(*args, torch.float32, mode="triton")
    reference_y = dispatch.int8_matmul(*args, torch.float32, mode="reference")
    exact, bound = exact_and_bound(*args)
    assert ((triton_y.double() - exact).abs() <= bound).all()
    # the reference multiplies in float32 after scaling: summation rounding, up to 2 K u (|a| @ |b|)
    codes, x_scale, weight, w_scale, _ = args
    a, b = codes.double() * x_scale.double()[:, None], weight.double() * w_scale.double()
    assert ((reference_y.double() - exact).abs() <= 2 * 48 * U32 * (a.abs() @ b.abs()) + bound).all()
