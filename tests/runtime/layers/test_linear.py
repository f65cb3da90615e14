"""Int4Linear and Fp8Linear against the dequantized weights of quantkit.formats' in-memory forms."""

import pytest
import torch

from quantkit.formats.quantized import Fp8Weight, QuantizedWeight
from quantkit.runtime.kernels import cpu_int4
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


@pytest.mark.parametrize("backend, rows", [("cpu-native", 3), ("cpu-native", 40), ("cpu-int4pack", 5)])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_linear_fuses_parts_and_matches_the_dequantized_weights(group_size, act_order, backend, rows):
    parts = [random_int4(n, 192, group_size, act_order, seed=i) for i, n in enumerate((48, 24, 24))]
    if act_order:  # fused parts share one input, hence one act-order permutation
        for p in parts[1:]:
            p.g_idx = parts[0].g_idx
    bias = torch.randn(96)
    dense = torch.cat([p.dequantize() for p in parts])  # [N, K]
    x = torch.randn(rows, 192)
    want = x @ dense.T + bias
    exact = Int4Linear(parts, bias, torch.float32, "reference", CPU)
    torch.testing.assert_close(exact(x), want, rtol=1e-5, atol=1e-5)
    fast = Int4Linear(parts, bias, torch.float32, backend, CPU)
    got = fast(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 96)
    bf16_math = backend == "cpu-int4pack" or cpu_int4.default_path(rows, 192) == "amx"
    assert sqnr_db(want, got) > (35 if bf16_math else 100)  # else float32 throughout
    got_bf16 = Int4Linear(parts, bias, torch.bfloat16, backend, CPU)(x.to(torch.bfloat16))
    assert got_bf16.dtype == torch.bfloat16 and sqnr_db(want, got_bf16.float()) > 35


def test_auto_takes_the_native_kernel_on_cpu_and_int4pack_when_it_cannot_build(monkeypatch):
    part = random_int4(64, 128, 64, False, seed=0)
    assert Int4Linear([part], None, torch.float32, "auto", CPU).backend == "cpu-native"
    monkeypatch.setattr(cpu_int4, "available", lambda: False)
    assert Int4Linear([part], None, torch.float32, "auto", CPU).backend == "cpu-int4pack"


@pytest.mark.parametrize("out_features, in_features, group_size", [(16, 96, 12), (24, 72, 36)])
def test_int4_linear_outside_the_cpu_kernel_shapes_uses_the_reference_path(out_features, in_features, group_size):
    """Groups of 12 and 36 rows straddle the 8-row packed words, and int4pack takes only 32..256."""
    part = random_int4(out_features, in_features, group_size, False, seed=0)
    layer = Int4Linear([part], None, torch.float32, "auto", CPU)
    assert layer.backend == "reference"
    x = torch.randn(3, in_features)
    torch.testing.assert_close(layer(x), x @ part.dequantize().T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot run a"):
        Int4Linear([part], None, torch.float32, "cpu-native", CPU)


def test_fp8_linear_keeps_one_byte_weights_and_matches_the_dequantized_weights():
    gen = torch.Generator().manual_seed(0)
    weights = [Fp8Weight(weight=(torch.randn(n, 64, generator=gen) * 100).to(torch.float8_e4m3fn),
                         scale=torch.rand(n, 1, generator=gen) * 0.01) for n in (24, 8)]
    layer = Fp8Linear(weights, None, torch.float32, CPU)
    assert layer.weight.dtype == torch.float8_e4m3fn
    x = torch.randn(4, 64)
    want = x @ torch.cat([w.dequantize() for w in weights]).T
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
