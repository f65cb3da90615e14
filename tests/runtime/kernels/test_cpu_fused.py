"""The native fused ops against the torch code they replace (the layers' own fallback), float32 and bf16."""

import pytest
import torch

from quantkit.runtime.kernels import cpu_fused
from quantkit.runtime.layers.norm import RMSNorm
from quantkit.runtime.layers.rotary import RotaryEmbedding, _rotate_half

pytestmark = pytest.mark.skipif(not cpu_fused.supports(torch.zeros(1)), reason="the fused CPU ops do not build here")
DTYPES = [torch.float32, torch.bfloat16]


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units of the last place of the dtype (a and b of one dtype, same signs where they differ)."""
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    return (a.view(bits).int() - b.view(bits).int()).abs()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_torch(dtype, with_residual, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data = (torch.rand(576, generator=gen) + 0.5).to(dtype)
    x = (torch.randn(7, 576, generator=gen) * 3).to(dtype)
    residual = (torch.randn(7, 576, generator=gen) * 3).to(dtype) if with_residual else None
    got, got_h = norm(x, residual)
    monkeypatch.setattr(cpu_fused, "supports", lambda x: False)
    want, want_h = norm(x, residual)
    assert torch.equal(got_h, want_h)  # the residual stream is bit-exact: one rounded add
    # The mean of squares sums in another order: a few float32 ulps, which bf16's rounding hides but for a tie.
    assert got.dtype == dtype and ulps_apart(got, want).max() <= (8 if dtype == torch.float32 else 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_rotates_strided_views_in_place_as_torch_does(dtype, monkeypatch):
    rotary = RotaryEmbedding(64, 256, 10000.0)
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, (9 + 3 + 3) * 64, generator=gen).to(dtype)
    positions = torch.tensor([0, 7, 100, 255, 3])
    q, k = qkv[:, :576].view(5, 9, 64), qkv[:, 576:768].view(5, 3, 64)
    q_before, k_before, v_before = q.clone(), k.clone(), qkv[:, 768:].clone()
    got_q, got_k = rotary(positions, q, k)
    assert got_q.data_ptr() == q.data_ptr() and torch.equal(qkv[:, 768:], v_before)  # in place, v untouched
    cos, sin = rotary.cos[positions].to(dtype)[:, None], rotary.sin[positions].to(dtype)[:, None]
    for before, got in ((q_before, got_q), (k_before, got_k)):
        want = before * cos + _rotate_half(before) * sin
        assert torch.equal(got, want)
    assert not torch.equal(got_q[1:], q_before[1:])  # position 0 is the identity; the others rotate


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_torch(dtype):
    gate_up = (torch.randn(6, 2 * 1536, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    got = cpu_fused.silu_mul(gate_up)
    assert got.shape == (6, 1536) and got.dtype == dtype
    # exp from another vector libm (glibc's libmvec, <= 4 ulp): a few float32 ulps, bf16 ties aside exact
    assert ulps_apart(got, want).max() <= (8 if dtype == torch.float32 else 1)


def test_bad_inputs_are_refused():
    with pytest.raises(RuntimeError, match="residual must match x"):
        cpu_fused.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8), 1e-5)
    with pytest.raises(RuntimeError, match="cos and sin must be"):
        cpu_fused.rotary_(torch.randn(2, 1, 8), torch.randn(2, 4), torch.randn(2, 4))


def test_greedy_tokens_take_the_first_index_of_each_rows_maximum():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 49152, generator=gen)
    logits[0, [5, 17, 40000]] = 50.0  # ties: the first wins
    logits[1, -1] = 50.0  # the last column
    logits[2] = -7.0  # a constant row: index 0
    logits[3, :] = torch.randint(-2, 3, (49152,), generator=gen).float()  # heavy ties
    got = cpu_fused.greedy_tokens(logits)
    assert got.tolist() == logits.argmax(dim=-1).tolist()
    assert got[:3].tolist() == [5, 49151, 0]
