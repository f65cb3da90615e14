"""The native CPU INT4 GEMM (every path that runs here) against the torch reference of the runtime layout."""

import pytest
import torch

from quantkit.runtime.kernels import cpu_int4
from quantkit.runtime.kernels.int4_layout import int4_matmul_reference, pack_int4, unpack_int4
from tests.runtime.kernels.conftest import sqnr_db

pytestmark = pytest.mark.skipif(not cpu_int4.available(), reason="the native CPU INT4 kernel does not build here")
RUNNABLE = [p for p in cpu_int4.PATHS if p != "amx" or cpu_int4.amx()]


def random_weights(n: int, k: int, group_size: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen)
    scales = torch.rand(n, k // group_size, generator=gen) * 0.02 + 0.005
    zeros = torch.randint(0, 16, (n, k // group_size), generator=gen)
    return q, scales, zeros


def test_pack_tiles_the_runtime_layout_and_pads_columns_with_zero_weights():
    q, scales, zeros = random_weights(80, 64, 32)
    codes, tile_scales, offsets = cpu_int4.pack(q, scales, zeros)
    assert codes.shape == (2, 8, 64) and tile_scales.shape == offsets.shape == (2, 2, 64)
    # Tile 1 holds columns 64..79 and then 48 padding columns.
    unpacked = unpack_int4(codes[1])  # [K, 64]
    assert torch.equal(unpacked[:, :16], q[64:].T.to(torch.int32))
    assert not unpacked[:, 16:].any() and not tile_scales[1, :, 16:].any() and not offsets[1, :, 16:].any()
    torch.testing.assert_close(offsets[0], -(zeros[:64] * scales[:64]).T.float())


# (N, K, group): SmolLM2's q/k/v fused, a narrow layer with padding columns, one group per row (group = K),
# and K = 72, which is not a multiple of 32 (no AMX; the other paths still run).
SHAPES = [(960, 576, 64), (80, 96, 32), (130, 128, 128), (64, 72, 8)]


@pytest.mark.parametrize("path", RUNNABLE)
@pytest.mark.parametrize("n, k, group_size", SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 17, 40])
def test_every_path_matches_the_reference(path, n, k, group_size, rows):
    if path == "amx" and k % 32:
        pytest.skip("AMX takes 32 inputs per step")
    q, scales, zeros = random_weights(n, k, group_size, seed=rows)
    packed = cpu_int4.pack(q, scales, zeros)
    qweight, scales_kn, zeros_kn = pack_int4(q, scales, zeros)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1))
    want = int4_matmul_reference(x, qweight, scales_kn, zeros_kn, None, group_size)
    for dtype in (torch.float32, torch.bfloat16):
        got = cpu_int4.int4_matmul(x.to(dtype), *packed, group_size, n, path)
        assert got.dtype == dtype and got.shape == (rows, n)
        bf16_math = dtype == torch.bfloat16 or path == "amx"
        # bf16 rounding of inputs (and of weights for AMX and bf16 blocks) ~ 45-50 dB; float32 math > 100 dB
        assert sqnr_db(want, got.float()) > (40 if bf16_math else 100), (path, dtype)


def test_the_default_path_follows_the_row_count():
    assert cpu_int4.default_path(cpu_int4.SMALL_M, 576) == "gemv"
    assert cpu_int4.default_path(cpu_int4.SMALL_M + 1, 576) == ("amx" if cpu_int4.amx() else "blocks")
    assert cpu_int4.default_path(64, 72) == "blocks"  # AMX steps 32 inputs at a time


def test_float16_inputs_are_computed_in_float32_and_returned_as_float16():
    q, scales, zeros = random_weights(64, 64, 32)
    x = torch.randn(2, 64)
    qweight, scales_kn, zeros_kn = pack_int4(q, scales, zeros)
    want = int4_matmul_reference(x, qweight, scales_kn, zeros_kn, None, 32)
    got = cpu_int4.int4_matmul(x.half(), *cpu_int4.pack(q, scales, zeros), 32, 64)
    assert got.dtype == torch.float16 and sqnr_db(want, got.float()) > 50


def test_bad_shapes_are_refused_with_the_sizes():
    q, scales, zeros = random_weights(64, 64, 32)
    packed = cpu_int4.pack(q, scales, zeros)
    with pytest.raises(RuntimeError, match="codes hold 64 input rows, x has 96"):
        cpu_int4.int4_matmul(torch.randn(2, 96), *packed, 32, 64)
    with pytest.raises(RuntimeError, match="does not fit 1 tiles"):
        cpu_int4.int4_matmul(torch.randn(2, 64), *packed, 32, 65)
    with pytest.raises(ValueError, match="unknown INT4 CPU path 'fast'"):
        cpu_int4.int4_matmul(torch.randn(2, 64), *packed, 32, 64, "fast")
