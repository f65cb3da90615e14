"""The native CPU W8A8 INT8 linear (each path that runs here): its activation codes against quantkit's int8
convention, bit for bit, and its outputs against the exact integer product rescaled."""

import pytest
import torch

from quantkit.algorithms import int8 as convention
from quantkit.runtime.kernels import cpu_int8
from tests.runtime.kernels.conftest import assert_within_one_ulp

pytestmark = pytest.mark.skipif(not cpu_int8.available(), reason="the native CPU INT8 kernel does not build here")
RUNNABLE = [p for p in cpu_int8.PATHS if p != "amx" or cpu_int8.amx()]
U32 = 2.0 ** -24  # float32 unit roundoff


def activations(m: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 3
    x[0, : min(k, 8)] = torch.tensor([0.5, -0.5, 1.5, 2.5, -2.5, 127.0, -127.0, 0.0])[: min(k, 8)]
    if m > 2:
        x[2] = 0.0  # an all-zero token: the minimum scale
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m, k", [(1, 576), (5, 100), (17, 7)])
def test_codes_equal_the_int8_convention_dynamic_and_static(m, k, dtype):
    x = activations(m, k, dtype)
    codes, scales = cpu_int8.quantize(x, None)
    want_codes, want_scales = convention.quantize_per_token(x)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales.reshape(-1))
    static = 0.02  # clips: values past 127 * 0.02 saturate to -128 / 127
    codes, scales = cpu_int8.quantize(x, static)
    assert torch.equal(codes, convention.quantize(x, torch.tensor(static)))
    assert codes.min() == -128 and codes.max() == 127 and (scales == torch.tensor(static)).all()


def test_half_way_values_round_to_even():
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.5, 300.0, -300.0]])
    codes, _ = cpu_int8.quantize(x, 1.0)
    assert codes.tolist() == [[0, 2, 2, 0, -2, -2, 126, -128, 127, -128]]


def test_pack_pads_and_interleaves_four_inputs_per_column():
    w = torch.randint(-128, 128, (20, 70), dtype=torch.int8)
    packed, col_sums, w_scale, bias = cpu_int8.pack(w, torch.ones(20), None)
    assert packed.shape == (2, 32, 16, 4) and col_sums.shape == w_scale.shape == (32,) and bias.numel() == 0
    assert packed[1, 3, 2, 1] == w[18, 13] and packed[0, 0, 5].tolist() == w[5, :4].tolist()
    assert not packed[1, :, 4:].any() and not packed[0, 18:].any()  # padding columns and inputs are zero
    assert torch.equal(col_sums[:20], w.sum(1, dtype=torch.int32)) and not col_sums[20:].any()


@pytest.mark.parametrize("path", RUNNABLE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
# 300 rows: more than one AMX row block (M_BLOCK = 256), the last one partial; 24 and 40 columns: an odd
# number of 16-column blocks, the last pair half used.
@pytest.mark.parametrize("m, n, k", [(1, 960, 576), (3, 40, 100), (17, 72, 130), (40, 24, 64), (300, 40, 130)])
@pytest.mark.parametrize("static", [None, 0.05])
def test_outputs_are_the_exact_integer_product_rescaled(path, dtype, m, n, k, static):
    gen = torch.Generator().manual_seed(1)
    w = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    w_scale, bias = torch.rand(n, generator=gen) * 0.01 + 1e-3, torch.randn(n, generator=gen)
    x = activations(m, k, dtype)
    y = cpu_int8.int8_linear(x, static, *cpu_int8.pack(w, w_scale, bias), n, path)
    assert y.shape == (m, n) and y.dtype == dtype
    codes, scales = cpu_int8.quantize(x, static)
    product = (codes.double() @ w.double().T) * scales.double()[:, None] * w_scale.double()  # exact sums
    exact = product + bias.double()
    # float32 rescale: three roundings (the int32 -> float32 conversion is exact below 2^24), each within u.
    bound = 3 * U32 * (product.abs() + bias.double().abs())
    if dtype == torch.float32:
        assert ((y.double() - exact).abs() <= bound).all()
    else:  # then one rounding to bfloat16
        assert_within_one_ulp(y, exact.float(), bound.float())
