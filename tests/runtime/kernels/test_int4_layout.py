"""The runtime INT4 layout: packing is lossless and the reference computes x @ W of the documented formula."""

import torch

from quantkit.runtime.kernels.int4_layout import dequantize_int4, int4_matmul_reference, pack_int4, unpack_int4


def test_pack_unpack_round_trip_and_documented_nibble_order():
    q = torch.randint(0, 16, (24, 64), dtype=torch.uint8)
    qweight, _, _ = pack_int4(q, torch.ones(24, 1), torch.zeros(24, 1))
    assert qweight.shape == (8, 24) and qweight.dtype == torch.int32
    assert torch.equal(unpack_int4(qweight), q.T.to(torch.int32))
    # Nibble j of qweight[r, n] is the code of input row 8r + j (checked bit by bit, not through unpack_int4).
    r, j, n = 3, 5, 7
    assert (int(qweight[r, n]) >> (4 * j)) & 0xF == int(q[n, 8 * r + j])


def test_reference_matmul_follows_the_formula_with_g_idx():
    n, k, group = 16, 64, 32
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales, zeros = torch.rand(n, 2) + 0.1, torch.randint(0, 16, (n, 2))
    g_idx = (torch.randperm(k) // group).to(torch.int32)
    qweight, scales_kn, zeros_kn = pack_int4(q, scales, zeros)
    w = torch.empty(k, n)
    for kk in range(k):
        g = int(g_idx[kk])
        w[kk] = (q[:, kk].float() - zeros[:, g].float()) * scales[:, g]
    torch.testing.assert_close(dequantize_int4(qweight, scales_kn, zeros_kn, g_idx, group, torch.float32), w)
    x = torch.randn(3, k)
    torch.testing.assert_close(int4_matmul_reference(x, qweight, scales_kn, zeros_kn, g_idx, group), x @ w)
