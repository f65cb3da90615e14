"""Int4Linear and Fp8Linear against the dequantized weights of quantkit.formats' in-memory forms."""

import pytest
import torch

from quantkit.formats.quantized import Fp8Weight, QuantizedWeight
from quantkit.runtime.layers.linear import Fp8Linear, Int4Linear

CPU = torch.device("cpu")


def random_int4(out_features: int, in_features: int, group_size: int, act_order: bool, seed: int) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    groups = in_features // group_size
    g_idx = None
    if act_order:  # GPTQ act-order without static groups: group g holds a scattered set of input rows
        g_idx = (torch.randperm(in_features, generator=gen) // group_size).to(torch.int32)
    return QuantizedWeight(q=torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.uint8),
                           scale=torch.rand(out_features, groups, generator=gen) * 0.02 + 0.005,
                           zero=torch.randint(0, 16, (out_features, groups), generator=gen, dtype=torch.int32),
                           bits=4, group_size=group_size, symmetric=False, g_idx=g_idx)


def sqnr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum()))


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_linear_fuses_parts_and_matches_the_dequantized_weights(group_size, act_order):
    parts = [random_int4(n, 192, group_size, act_order, seed=i) for i, n in enumerate((48, 24, 24))]
    if act_order:  # fused parts share one input, hence one act-order permutation
        for p in parts[1:]:
            p.g_idx = parts[0].g_idx
    bias = torch.randn(96)
    dense = torch.cat([p.dequantize() for p in parts])  # [N, K]
    x = torch.randn(5, 192)
    want = x @ dense.T + bias
    exact = Int4Linear(parts, bias, torch.float32, "reference", CPU)
    torch.testing.assert_close(exact(x), want, rtol=1e-5, atol=1e-5)
    fast = Int4Linear(parts, bias, torch.float32, "auto", CPU)
    assert fast.backend == "cpu-int4pack"
    got = fast(x)
    assert got.dtype == torch.float32 and got.shape == (5, 96)
    assert sqnr_db(want, got) > 35  # bf16 activations and bf16 scales


@pytest.mark.parametrize("out_features, in_features, group_size", [(16, 96, 48), (24, 64, 32)])
def test_int4_linear_outside_the_native_kernel_shapes_uses_the_reference_path(out_features, in_features, group_size):
    part = random_int4(out_features, in_features, group_size, False, seed=0)
    layer = Int4Linear([part], None, torch.float32, "auto", CPU)
    assert layer.backend == "reference"
    x = torch.randn(3, in_features)
    torch.testing.assert_close(layer(x), x @ part.dequantize().T, rtol=1e-5, atol=1e-5)


def test_fp8_linear_keeps_one_byte_weights_and_matches_the_dequantized_weights():
    gen = torch.Generator().manual_seed(0)
    weights = [Fp8Weight(weight=(torch.randn(n, 64, generator=gen) * 100).to(torch.float8_e4m3fn),
                         scale=torch.rand(n, 1, generator=gen) * 0.01) for n in (24, 8)]
    layer = Fp8Linear(weights, None, torch.float32, CPU)
    assert layer.weight.dtype == torch.float8_e4m3fn
    x = torch.randn(4, 64)
    want = x @ torch.cat([w.dequantize() for w in weights]).T
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
