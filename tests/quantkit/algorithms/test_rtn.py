import torch

from quantkit.algorithms.rtn import WeightScheme, fake_quantize, grid_params, rtn_quantize


def test_asymmetric_grid_hand_case():
    # range [-1, 2] (0 included): scale = 3 / 15 = 0.2, zero = round(1 / 0.2) = 5
    scale, zero = grid_params(torch.tensor([[-1.0, 0.5, 2.0]]), WeightScheme(4, -1, False, torch.float32))
    assert torch.allclose(scale, torch.tensor([0.2])) and zero.tolist() == [5.0]


def test_symmetric_grid_hand_case_and_range_includes_zero():
    # absmax 3 -> scale 3 / 7.5 = 0.4, zero 8; a positive-only row still includes 0 in its range
    scale, zero = grid_params(torch.tensor([[-3.0, 1.0], [1.0, 2.0]]), WeightScheme(4, -1, True, torch.float32))
    assert torch.allclose(scale, torch.tensor([0.4, 2.0 / 7.5])) and zero.tolist() == [8.0, 8.0]


def test_codes_and_dequantization_are_exact_on_grid_points():
    scheme = WeightScheme(4, 4, False, torch.float32)
    w = torch.tensor([[0.0, 0.2, 0.4, 3.0, -1.0, 0.0, 1.0, 2.0]])
    qw = rtn_quantize(w, scheme)
    assert qw.q.dtype == torch.uint8 and qw.scale.shape == (1, 2) and qw.zero.shape == (1, 2)
    assert torch.allclose(qw.dequantize(), w, atol=1e-6)  # every value lies on its group's grid


def test_scales_are_rounded_to_their_storage_dtype():
    w = torch.randn(16, 64)
    qw = rtn_quantize(w, WeightScheme(4, 32, False, torch.float16))
    assert torch.equal(qw.scale, qw.scale.half().float())


def test_error_bounded_by_half_a_step_and_all_zero_rows_stay_zero():
    torch.manual_seed(0)
    w = torch.randn(32, 128)
    w[3] = 0
    scheme = WeightScheme(4, 64, False, torch.float32)
    qw = rtn_quantize(w, scheme)
    step = qw.scale.repeat_interleave(64, dim=1)
    assert ((fake_quantize(w, scheme) - w).abs() <= step / 2 + 1e-6).all()
    assert (fake_quantize(w, scheme)[3] == 0).all()


def test_mse_grid_never_rounds_worse_and_shrinks_around_an_outlier():
    from quantkit.algorithms.rtn import mse_grid_params, quantize_to_grid

    def squared_error(scale, zero):
        q = quantize_to_grid(w, scale[:, None], zero[:, None], 15)
        return ((q - zero[:, None]) * scale[:, None] - w).square().sum(dim=1)

    torch.manual_seed(0)
    w = torch.randn(64, 32)
    w[0, 0] = 6.0  # one outlier stretches row 0's range
    scheme = WeightScheme(4, -1, False, torch.float32)
    plain = grid_params(w, scheme)
    searched = mse_grid_params(w, scheme)
    assert (squared_error(*searched) <= squared_error(*plain) + 1e-6).all()
    assert searched[0][0] < plain[0][0]  # row 0 trades the outlier for finer steps


def test_weighted_mse_grid_clips_a_large_weight_whose_input_is_quiet():
    # Row: one large weight on a column whose input barely moves, the rest small. Unweighted, clipping
    # the large weight costs more than it gains; weighted by input energy it is nearly free to clip.
    from quantkit.algorithms.rtn import mse_grid_params

    torch.manual_seed(0)
    w = 0.3 * torch.randn(1, 64)
    w[0, 0] = 2.0
    scheme = WeightScheme(4, -1, False, torch.float32)
    full = grid_params(w, scheme)[0]
    plain = mse_grid_params(w, scheme)[0]
    quiet_first = torch.ones(64)
    quiet_first[0] = 1e-4
    weighted = mse_grid_params(w, scheme, column_weights=quiet_first)[0]
    assert plain > 0.9 * full
    assert weighted < 0.85 * full


def test_three_bit_grid_has_eight_levels_per_group():
    torch.manual_seed(0)
    w = torch.randn(8, 128)
    qw = rtn_quantize(w, WeightScheme(3, 64, False, torch.float32))
    assert WeightScheme(3).max_q == 7 and int(qw.q.max()) <= 7 and int(qw.zero.max()) <= 7
    fake = fake_quantize(w, WeightScheme(3, 64, False, torch.float32)).reshape(-1, 64)
    assert max(len(torch.unique(group)) for group in fake) <= 8
