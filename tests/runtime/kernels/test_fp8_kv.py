"""The Triton KV-cache write against reference.write_kv, interpreted on CPU: exact equality throughout, the
interpreter's fp8 rounding defect handled as conftest.py describes."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from quantkit.runtime.kernels import fp8_kv, reference  # noqa: E402
from tests.runtime.kernels.conftest import DEVICE, interpreted  # noqa: E402

FP8 = torch.float8_e4m3fn
NUM_SLOTS = 48


def setup(tokens: int, kv_heads: int, dim: int, cache_dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(NUM_SLOTS, generator=gen)[:tokens].to(DEVICE)
    # Poison: NaN everywhere (0x7F is an fp8 NaN), so a slot the kernel should have written stands out,
    # and one it should not have touched must still hold the poison.
    cache = torch.full((NUM_SLOTS, kv_heads, dim), 0x7F if cache_dtype == torch.uint8 else float("nan"),
                       dtype=cache_dtype, device=DEVICE)
    return slots, cache


def write_both(cache, x, slots, scale):
    expected, actual = cache.clone(), cache.clone()
    reference.write_kv(expected, x, slots, scale)
    fp8_kv.write_kv(actual, x, slots, scale)
    assert not actual[slots].view(torch.uint8).eq(0x7F).all(-1).any() if cache.dtype == torch.uint8 else True
    return expected, actual


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)  # NaN payloads compare equal bit for bit


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_float_cache_is_an_exact_copy(dtype):
    slots, cache = setup(13, 3, 24, dtype)
    fused = torch.randn(13, 3 * 3, 24).to(DEVICE, dtype)  # x as a view into a fused qkv row: strided tokens
    x = fused[:, 3:6]
    expected, actual = write_both(cache, x, slots, None)
    assert torch.equal(as_bytes(actual), as_bytes(expected))
    assert not actual[slots].isnan().any()


@pytest.mark.parametrize("scale", [0.25, 1.0, 8.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_fp8_exact_on_representable_values(dtype, scale):
    """x / scale exactly on the fp8 grid (all 254 finite codes, power-of-two scales), plus values past 448
    that must clamp to 448: no rounding happens, so the interpreter's defect cannot bite."""
    codes = torch.arange(256, dtype=torch.uint8)
    grid = codes.view(FP8).float()
    grid = grid[grid.isfinite()]
    values = torch.cat([grid, torch.tensor([600.0, -1000.0, 448.0 * 4])])
    values = values[torch.randperm(len(values), generator=torch.Generator().manual_seed(1))]
    kv_heads, dim = 2, 8
    tokens = -(-len(values) // (kv_heads * dim))
    x = torch.zeros(tokens * kv_heads * dim)
    x[:len(values)] = values * scale
    x = x.view(tokens, kv_heads, dim).to(DEVICE, dtype)
    assert torch.equal(x.float().cpu().flatten()[:len(values)], values * scale)  # exact in dtype
    slots, cache = setup(tokens, kv_heads, dim, torch.uint8, seed=2)
    expected, actual = write_both(cache, x, slots, scale)
    assert torch.equal(actual, expected)
    assert actual[slots].view(FP8).float().abs().max() == 448


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_fp8_random_values_with_a_correct_cast(dtype, fixed_fp8_cast):
    """Random values at a scale off the power-of-two grid, row wider than one program (5 x 256 > 1024):
    bit-exact once the interpreter's cast rounds like the hardware's."""
    slots, cache = setup(9, 5, 256, torch.uint8)
    x = (torch.randn(9, 5, 256, generator=torch.Generator().manual_seed(3)) * 40).to(DEVICE, dtype)
    expected, actual = write_both(cache, x, slots, 0.37)
    assert torch.equal(actual, expected)


def test_interpreter_fp8_cast_defect_only_at_binade_edges():
    """Without the fix, on N(0, 50) inputs: every byte away from a binade edge is exact; at an edge (x rounds
    up to a power of two) the value is right or, with the interpreter's defect, half of it. Nothing else."""
    slots, cache = setup(40, 3, 32, torch.uint8)
    x = (torch.randn(40, 3, 32, generator=torch.Generator().manual_seed(4)) * 50).to(DEVICE)
    expected, actual = write_both(cache, x, slots, 1.0)
    x, want, got = x.flatten(), expected[slots].flatten(), actual[slots].flatten()
    want_v, got_v = want.view(FP8).float(), got.view(FP8).float()
    mantissa_zero = (want & 0x07) == 0
    edge = mantissa_zero & (x.abs() < want_v.abs())  # rounded up onto a power of two from the binade below
    assert 0.005 < edge.float().mean() < 0.1  # the random input does reach the edges
    assert torch.equal(got[~edge], want[~edge])
    wrong = got != want
    assert torch.equal(got_v[wrong], want_v[wrong] / 2)
    if not interpreted():
        assert not wrong.any()  # a GPU's cast has no such defect
    print(f"binade-edge values {int(edge.sum())} of {edge.numel()}, halved by the interpreter {int(wrong.sum())}")


def test_checks_name_the_problem():
    slots, cache = setup(4, 2, 8, torch.uint8)
    x = torch.randn(4, 2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="positive scale"):
        fp8_kv.write_kv(cache, x, slots, None)
    with pytest.raises(ValueError, match=r"must be \[T, kv_heads, D\]"):
        fp8_kv.write_kv(cache, x[:, :1], slots, 1.0)
    with pytest.raises(ValueError, match="slots must be"):
        fp8_kv.write_kv(cache, x, slots[:3], 1.0)
    with pytest.raises(ValueError, match="takes torch.float16 K/V"):
        fp8_kv.write_kv(cache.half(), x, slots, None)
