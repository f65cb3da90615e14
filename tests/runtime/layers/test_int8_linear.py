"""Int8Linear: every CPU backend against the exact product of its quantized inputs and weights, fused parts,
static and dynamic input scales, bias; the runtime's activation quantization against quantkit's convention."""

import pytest
import torch

from quantkit.algorithms import int8 as convention
from quantkit.formats.quantized import Int8Weight
from quantkit.runtime.kernels import cpu_int8
from quantkit.runtime.kernels.int8_reference import quantize
from quantkit.runtime.layers.int8_linear import Int8Linear

CPU = torch.device("cpu")
U32 = 2.0 ** -24
BACKENDS = ["reference", "cpu-int-mm"] + (["cpu-native"] if cpu_int8.available() else [])


def random_int8(out_features: int, in_features: int, input_scale: float | None, seed: int) -> Int8Weight:
    gen = torch.Generator().manual_seed(seed)
    return Int8Weight(weight=torch.randint(-128, 128, (out_features, in_features), generator=gen, dtype=torch.int8),
                      scale=torch.rand(out_features, 1, generator=gen) * 0.01 + 1e-3,
                      input_scale=None if input_scale is None else torch.tensor([input_scale]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_runtime_quantization_is_quantkits_int8_convention(dtype):
    x = (torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    x[1] = 0.0
    codes, scales = quantize(x, None)
    want_codes, want_scales = convention.quantize_per_token(x)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales.reshape(-1))
    assert torch.equal(quantize(x, 0.03)[0], convention.quantize(x, torch.tensor(0.03)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("static", [False, True])
def test_int8_linear_fuses_parts_and_equals_the_rescaled_integer_product(backend, rows, static):
    scales = (0.02, 0.05, 0.03) if static else (None, None, None)
    parts = [random_int8(n, 96, s, seed=i) for i, (n, s) in enumerate(zip((48, 16, 16), scales))]
    bias = torch.randn(80)
    layer = Int8Linear(parts, bias, torch.float32, backend, CPU)
    assert layer.backend == backend
    assert layer.input_scale == (float(torch.tensor(0.05)) if static else None)  # the largest part's
    x = torch.randn(rows, 96) * 2
    y = layer(x)
    assert y.shape == (rows, 80) and y.dtype == torch.float32
    codes, x_scale = convention.quantize_per_token(x) if not static else (
        convention.quantize(x, torch.tensor(0.05)), torch.full((rows, 1), 0.05))
    w = torch.cat([p.weight for p in parts]).double()
    w_scale = torch.cat([p.scale for p in parts]).double().reshape(-1)
    product = (codes.double() @ w.T) * x_scale.double() * w_scale
    exact = product + bias.double()
    bound = 3 * U32 * (product.abs() + bias.double().abs())  # the float32 rescale (sums are exact)
    if backend == "reference":  # float32 sums of scaled values: up to 2 K u (|x_fq| @ |W|) more
        a = codes.double().abs() * x_scale.double()
        bound = bound + 2 * 96 * U32 * (a @ (w.abs() * w_scale[:, None]).T)
    assert ((y.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_linear_in_bfloat16_tracks_the_float32_layer(backend):
    part = random_int8(64, 128, None, seed=0)
    x = torch.randn(3, 7, 128)  # any leading shape
    want = Int8Linear([part], None, torch.float32, "reference", CPU)(x.to(torch.bfloat16).float())
    got = Int8Linear([part], None, torch.bfloat16, backend, CPU)(x.to(torch.bfloat16))
    assert got.shape == (3, 7, 64) and got.dtype == torch.bfloat16
    # same codes (bf16 -> float32 is exact), then one bf16 rounding: 2^-8 relative
    assert ((got.float() - want).abs() <= 2.0 ** -8 * want.abs() + 1e-6).all()


def test_int8_linear_keeps_one_byte_weights():
    parts = [random_int8(32, 64, None, seed=0)]
    for backend in BACKENDS:
        layer = Int8Linear(parts, None, torch.bfloat16, backend, CPU)
        weights = [b for b in layer.buffers() if b.dtype == torch.int8]
        assert len(weights) == 1 and weights[0].numel() >= 32 * 64


def test_auto_takes_the_native_kernel_on_cpu_and_int_mm_when_it_cannot_build(monkeypatch):
    part = random_int8(32, 64, None, seed=0)
    if cpu_int8.available():
        assert Int8Linear([part], None, torch.float32, "auto", CPU).backend == "cpu-native"
    monkeypatch.setattr(cpu_int8, "available", lambda: False)
    assert Int8Linear([part], None, torch.float32, "auto", CPU).backend == "cpu-int-mm"
    with pytest.raises(ValueError, match="cannot run"):
        Int8Linear([part], None, torch.float32, "cpu-native", CPU)


def test_fused_parts_must_agree_on_static_or_dynamic():
    with pytest.raises(ValueError, match="mix static and dynamic"):
        Int8Linear([random_int8(16, 32, 0.1, 0), random_int8(16, 32, None, 1)], None, torch.float32, "auto", CPU)
