"""QuantizedWeight.dequantize: scale[n, g] * (q[n, k] - zero[n, g]) with g = g_idx[k], default k // group_size."""

import pytest
import torch

from quantkit.formats.quantized import QuantizedWeight, stack_rows
from tests.quantkit.formats.test_compressed_tensors import random_qweight


def test_a_hand_checked_weight():
    qw = QuantizedWeight(q=torch.tensor([[0, 15, 8, 9]], dtype=torch.uint8), scale=torch.tensor([[0.5, 2.0]]),
                         zero=torch.tensor([[8, 9]], dtype=torch.int32), bits=4, group_size=2, symmetric=False)
    assert torch.equal(qw.dequantize(), torch.tensor([[-4.0, 3.5, -2.0, 0.0]]))


@pytest.mark.parametrize("in_features, group_size", [(64, 16), (64, -1), (60, 16)])
def test_contiguous_groups_equal_the_explicit_group_index(in_features, group_size):
    """Without g_idx, groups are k // group_size; the broadcast path must give what the gather path gives
    for the same groups spelled out (60 / 16: the last group is short, so the gather path runs)."""
    implicit = random_qweight(24, in_features, 4, group_size, False, seed=1)
    size = in_features if group_size == -1 else group_size
    explicit = QuantizedWeight(**{**implicit.__dict__, "g_idx": (torch.arange(in_features) // size).int()})
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(implicit.dequantize(dtype), explicit.dequantize(dtype))


def test_permuted_groups_follow_g_idx():
    qw = random_qweight(8, 32, 4, 16, False, seed=2)
    permuted = QuantizedWeight(**{**qw.__dict__, "g_idx": torch.tensor([1, 0] * 16, dtype=torch.int32)})
    dense = permuted.dequantize()
    assert torch.equal(dense[:, 0], (qw.q[:, 0].float() - qw.zero[:, 1].float()) * qw.scale[:, 1])
    assert not torch.equal(dense, qw.dequantize())


def test_row_blocks_stack_back_into_the_weight_they_came_from():
    qw = random_qweight(12, 32, 4, 16, False, seed=3)
    blocks = [qw.rows(0, 4), qw.rows(4, 8), qw.rows(8, 12)]
    assert torch.equal(blocks[1].dequantize(), qw.dequantize()[4:8])
    stacked = stack_rows(blocks)
    assert all(torch.equal(getattr(stacked, f), getattr(qw, f)) for f in ("q", "scale", "zero"))
