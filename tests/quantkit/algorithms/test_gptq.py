import torch

from quantkit.algorithms import gptq
from quantkit.algorithms.gptq import (coordinate_descent, fp_target_weight, gptq_quantize, input_hessian,
                                      input_error_cross, inverse_hessian_factor, refit_scales,
                                      target_errors)
from quantkit.algorithms.rtn import WeightScheme, fake_quantize, rtn_quantize
from quantkit.formats.quantized import QuantizedWeight

SCHEME = WeightScheme(4, 8, True, torch.float32)


def test_hessian_is_the_sum_of_outer_products():
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    assert torch.equal(input_hessian([x[:1], x[1:]]), torch.tensor([[10.0, -1.0], [-1.0, 5.0]]))


def test_token_weights_count_each_token_that_many_times_in_the_hessian_and_the_cross_product():
    x, x_ref = torch.randn(9, 5), torch.randn(9, 5)
    w = torch.rand(9) * 3
    torch.testing.assert_close(input_hessian([x[:4], x[4:]], token_weights=[w[:4], w[4:]]), x.T @ torch.diag(w) @ x)
    torch.testing.assert_close(input_error_cross([x_ref[:4], x_ref[4:]], [x[:4], x[4:]], [w[:4], w[4:]]),
                               (x_ref - x).T @ torch.diag(w) @ x)


def test_blocked_hessian_equals_the_full_product():
    xs = [torch.randn(40, 70), torch.randn(13, 70)]
    full = sum(x.T @ x for x in xs)
    torch.testing.assert_close(input_hessian(xs, block=16), full, rtol=1e-5, atol=1e-4)


def test_stacked_samples_give_the_same_hessian_as_one_product_each(monkeypatch):
    # stacks of 50 rows: a sample that would overflow a stack starts the next, a longer one comes alone (the stack waits)
    monkeypatch.setattr(gptq, "STACKED_ROWS", 50)
    xs = [torch.randn(tokens, 24) for tokens in (20, 20, 20, 70, 5, 45, 1)]
    weights = [torch.rand(len(x)) for x in xs]
    torch.testing.assert_close(input_hessian(xs), sum(x.T @ x for x in xs), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(input_hessian(xs, weights), sum(x.T @ torch.diag(w) @ x for x, w in zip(xs, weights)),
                               rtol=1e-5, atol=1e-4)
    stacks = [len(rows) for rows in gptq._stacked_rows(xs, None, torch.float32)]
    assert stacks == [40, 70, 25, 46]


def test_identity_hessian_reduces_to_round_to_nearest():
    # with H = I no column's error can be compensated by another: GPTQ must equal plain rounding
    torch.manual_seed(0)
    w = torch.randn(6, 8)
    result = gptq_quantize(w, torch.eye(8) * 3.0, SCHEME, damp=0.01)
    assert torch.equal(result.weight.dequantize(), fake_quantize(w, SCHEME))


def test_first_column_error_moves_to_a_correlated_column():
    # Inputs x0 == x1 always. Grid step 0.3 / 7.5 = 0.04. Column 0: 0.3 -> code +7 = 0.28 (error 0.02);
    # GPTQ hands the error to column 1: 0.1 + 0.02 = 0.12, exactly on the grid, so the output is exact.
    # Plain rounding gives 0.28 + 0.08 (2.5 steps rounds to even): the output is off by 0.04 x.
    x = torch.randn(100, 1).repeat(1, 2)
    w = torch.tensor([[0.3, 0.1]])
    scheme = WeightScheme(4, -1, True, torch.float32)
    result = gptq_quantize(w, input_hessian([x]), scheme, damp=1e-6)
    torch.testing.assert_close(result.weight.dequantize(), torch.tensor([[0.28, 0.12]]))
    torch.testing.assert_close(fake_quantize(w, scheme), torch.tensor([[0.28, 0.08]]))


def test_gptq_beats_rtn_out_of_sample_with_and_without_act_order():
    torch.manual_seed(0)
    mix = torch.randn(64, 64) / 8
    x_train, x_test = torch.randn(4000, 64) @ mix, torch.randn(2000, 64) @ mix
    w = torch.randn(32, 64)
    h = input_hessian([x_train])
    rtn_error = (x_test @ (w - fake_quantize(w, SCHEME)).T).pow(2).mean()
    for act_order in (False, True):
        result = gptq_quantize(w, h, SCHEME, block_size=16, act_order=act_order)
        assert result.weight.g_idx is None  # static groups stay contiguous
        error = (x_test @ (w - result.weight.dequantize()).T).pow(2).mean()
        assert error < 0.7 * rtn_error, (act_order, error, rtn_error)


def test_bfloat16_products_give_the_hessian_to_bfloat16_precision():
    # Channels a thousand times apart, as in a model's massive activations: the error stays at
    # bfloat16's rounding, entry by entry on the diagonal.
    torch.manual_seed(0)
    xs = [torch.randn(300, 200) * torch.logspace(-1, 2, 200) for _ in range(4)]
    exact = sum(x.double().T @ x.double() for x in xs)
    for dtype in (torch.float32, torch.bfloat16):
        h = input_hessian(xs, dtype=dtype)
        assert h.dtype == torch.float32 and torch.equal(h, h.T)
        relative = (h.double() - exact).norm() / exact.norm()
        diagonal = ((h.double().diagonal() - exact.diagonal()) / exact.diagonal()).abs().max()
        # bfloat16: each input and each sample's product rounds by at most 2^-9, so no entry is off
        # by more than 3 x 2^-9 = 5.9e-3, and the whole by far less
        overall, entry = (1e-6, 1e-6) if dtype == torch.float32 else (2e-3, 5.9e-3)
        assert relative < overall and diagonal < entry, (dtype, relative, diagonal)
    # Earlier layers' error is a few percent of the inputs: it is rounded relative to its own size (a
    # cross product x_ref^T x in bfloat16 minus H in bfloat16 is off by 43% of it here).
    x_ref = [x * (1 + 0.02 * torch.randn_like(x)) for x in xs]
    exact_cross = sum((r.double() - x.double()).T @ x.double() for r, x in zip(x_ref, xs))
    cross = input_error_cross(x_ref, xs, dtype=torch.bfloat16)
    assert cross.dtype == torch.float32 and (cross.double() - exact_cross).norm() / exact_cross.norm() < 5e-3


def test_gptq_on_a_bfloat16_hessian_is_as_good_as_on_a_float32_one():
    torch.manual_seed(1)
    mix = torch.randn(64, 64) / 8
    x_train, x_test = torch.randn(4000, 64) @ mix, torch.randn(2000, 64) @ mix
    w = torch.randn(32, 64)
    errors = {}
    for dtype in (torch.float32, torch.bfloat16):
        result = gptq_quantize(w, input_hessian([x_train[:2000], x_train[2000:]], dtype=dtype), SCHEME,
                               block_size=16, damp=0.1)
        errors[dtype] = float((x_test @ (w - result.weight.dequantize()).T).pow(2).mean())
    # rounding decisions cascade, so the two land a percent or so apart (-0.5..+1.3% over seeds 1-4 here);
    # a wrong Hessian would be far off
    assert abs(errors[torch.bfloat16] / errors[torch.float32] - 1) < 0.05, errors


def test_dead_inputs_zero_their_columns():
    x = torch.randn(100, 8)
    x[:, 2] = 0
    result = gptq_quantize(torch.randn(4, 8), input_hessian([x]), SCHEME)
    assert (result.weight.dequantize()[:, 2] == 0).all()


def test_damping_is_raised_until_cholesky_succeeds():
    # mean diagonal 0.7: H + d * 0.7 * I is positive definite once d * 0.7 > 0.2, i.e. d >= 0.29 in 0.01 steps
    factor, damp = inverse_hessian_factor(torch.diag(torch.tensor([1.0, 1.0, -0.2, 1.0])), 0.01)
    assert factor is not None and damp == 0.29


def test_hopeless_hessian_falls_back_to_rounding_and_says_so():
    hessian = torch.diag(torch.tensor([1.0, 1.0, -5.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    w = torch.randn(3, 8)
    result = gptq_quantize(w, hessian, SCHEME)
    assert result.rtn_fallback
    assert torch.equal(result.weight.dequantize(), fake_quantize(w, SCHEME))


def test_fp_target_weight_is_the_weight_when_inputs_are_unchanged():
    torch.manual_seed(0)
    x, w = torch.randn(200, 12), torch.randn(5, 12)
    h = input_hessian([x])
    torch.testing.assert_close(fp_target_weight(w, h, input_error_cross([x], [x]), damp=0.01), w,
                               rtol=1e-4, atol=1e-4)


def test_fp_target_weight_without_inputs_is_the_weight():
    # a linear whose inputs were all zero on the calibration tokens: nothing to fit, no failed factorization
    w = torch.randn(4, 8)
    torch.testing.assert_close(fp_target_weight(w, torch.zeros(8, 8), torch.zeros(8, 8), 0.1), w)


def test_fp_target_weight_undoes_a_known_input_distortion():
    # The quantized model's inputs are a mixed copy of the full-precision ones, x = x_ref M^T: the
    # weight that maps x to the full-precision outputs x_ref W^T is W M^-1.
    torch.manual_seed(0)
    x_ref, w = torch.randn(300, 8), torch.randn(4, 8)
    mix = torch.eye(8) + 0.2 * torch.randn(8, 8)
    x = x_ref @ mix.T
    v = fp_target_weight(w, input_hessian([x]), input_error_cross([x_ref], [x]), damp=1e-7)
    torch.testing.assert_close(v, w @ torch.linalg.inv(mix), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(x @ v.T, x_ref @ w.T, rtol=1e-3, atol=1e-3)


def test_target_error_is_the_output_error_against_the_full_precision_outputs():
    torch.manual_seed(0)
    x_ref = torch.randn(50, 6)
    x, w = x_ref + 0.1 * torch.randn(50, 6), torch.randn(3, 6)
    approxes = [w + 0.05 * torch.randn(3, 6), torch.randn(3, 6)]
    energy, ours = target_errors(w, approxes, input_hessian([x_ref]), input_error_cross([x_ref], [x]),
                                 input_hessian([x]))
    direct_energy = float(((x_ref.double() @ w.double().T) ** 2).sum())
    assert abs(energy - direct_energy) <= 1e-4 * direct_energy
    for a, error in zip(approxes, ours):
        direct = float(((x_ref.double() @ w.double().T - x.double() @ a.double().T) ** 2).sum())
        assert abs(error - direct) <= 1e-4 * direct


def test_gptq_on_the_fp_target_beats_gptq_on_the_weight_against_full_precision_outputs():
    # Earlier layers left an error in the inputs (x = x_ref + drift correlated with x_ref); measured
    # against the full-precision outputs on held-out tokens, fitting the target must win.
    torch.manual_seed(0)
    mix = torch.eye(32) + 0.15 * torch.randn(32, 32)
    x_ref, x_ref_test = torch.randn(2000, 32), torch.randn(2000, 32)
    x, x_test = x_ref @ mix.T, x_ref_test @ mix.T
    w = torch.randn(16, 32)
    h, cross = input_hessian([x]), input_error_cross([x_ref], [x])
    plain = gptq_quantize(w, h, SCHEME).weight.dequantize()
    fitted = gptq_quantize(fp_target_weight(w, h, cross, damp=0.01), h, SCHEME).weight.dequantize()

    def error(q):
        return float(((x_ref_test @ w.T - x_test @ q.T) ** 2).sum())

    assert error(fitted) < 0.5 * error(plain)


def test_refit_scales_solves_the_least_squares_for_fixed_codes():
    # With identity H and one group per row, the best scale for codes A is <A, w> / <A, A>.
    scheme = WeightScheme(4, -1, False, torch.float32)
    w = torch.tensor([[0.3, -0.7, 1.1, 0.05]])
    quantized = gptq_quantize(w, torch.eye(4), scheme, damp=1e-6).weight
    codes = quantized.q.float() - quantized.zero.float()
    best = float((codes * w).sum() / (codes * codes).sum())
    refit = refit_scales(quantized, w, torch.eye(4), damp=1e-6, scale_dtype=torch.float32)
    assert torch.equal(refit.q, quantized.q) and torch.equal(refit.zero, quantized.zero)
    assert abs(float(refit.scale) - best) <= 1e-5 * best


def test_refit_scales_never_raises_a_rows_output_error():
    torch.manual_seed(0)
    scheme = WeightScheme(4, 16, False, torch.float16)
    x = torch.randn(1000, 64) @ torch.randn(64, 64) + torch.randn(64)
    w, h = torch.randn(24, 64), input_hessian([x])
    quantized = gptq_quantize(w, h, scheme, act_order=True, mse=True).weight
    refit = refit_scales(quantized, w, h, damp=0.01, scale_dtype=torch.float16)
    hd = h + 0.01 * h.diagonal().mean() * torch.eye(64)

    def row_errors(q):
        d = (w - q.dequantize()).double()
        return ((d @ hd.double()) * d).sum(dim=1)

    before, after = row_errors(quantized), row_errors(refit)
    assert torch.all(after <= before * (1 + 1e-9))
    assert after.sum() < 0.98 * before.sum()
    assert torch.equal(refit.scale, refit.scale.half().float())  # stored scales stay representable


def test_coordinate_descent_moves_a_code_that_rounding_fixed_too_early():
    # Two strongly correlated inputs (H = [[1, .9], [.9, 1]]), grid step 1, zero 0, target [0.6, 0.6].
    # Rounding gives codes [1, 1]: error e = [0.4, 0.4], e H e^T = 0.608. The gradient e H = [0.76, 0.76]
    # moves the first column visited down by one step: e = [-0.6, 0.4], error 0.088, and then neither
    # code has a better integer (gradients -0.24 and -0.14 are under half a step's curvature).
    h = torch.tensor([[1.0, 0.9], [0.9, 1.0]])
    start = QuantizedWeight(q=torch.tensor([[1, 1]], dtype=torch.uint8), scale=torch.ones(1, 1),
                            zero=torch.zeros(1, 1, dtype=torch.int32), bits=4, group_size=-1, symmetric=False)
    moved = coordinate_descent(start, torch.tensor([[0.6, 0.6]]), h, damp=0.0, sweeps=5)
    assert sorted(moved.q[0].tolist()) == [0, 1]
    e = moved.dequantize() - torch.tensor([[0.6, 0.6]])
    assert abs(float(e @ h @ e.T) - 0.088) < 1e-6


def test_coordinate_descent_lowers_gptqs_error_to_where_no_single_code_move_helps():
    torch.manual_seed(0)
    scheme = WeightScheme(4, 16, False, torch.float16)
    x = torch.randn(1000, 48) @ torch.randn(48, 48) + torch.randn(48)
    w, h = torch.randn(12, 48), input_hessian([x])
    damp = 0.1
    hd = (h + damp * h.diagonal().mean() * torch.eye(48)).double()
    quantized = gptq_quantize(w, h, scheme, damp=damp, act_order=True, mse=True).weight
    refined = coordinate_descent(quantized, w, h, damp, sweeps=50)

    def row_errors(q: torch.Tensor) -> torch.Tensor:  # q: dequantized [rows, in]
        d = (q.double() - w.double())
        return ((d @ hd) * d).sum(dim=1)

    before, after = row_errors(quantized.dequantize()), row_errors(refined.dequantize())
    assert torch.all(after <= before * (1 + 1e-9)) and after.sum() < 0.99 * before.sum()
    assert torch.equal(refined.scale, quantized.scale) and torch.equal(refined.zero, quantized.zero)
    # converged: moving any one code one step either way raises its row's error (or leaves the grid)
    base = refined.dequantize()
    step = refined.scale.float().repeat_interleave(16, dim=1)
    for sign in (1, -1):
        for j in range(48):
            codes = refined.q[:, j].float() + sign
            on_grid = (codes >= 0) & (codes <= 15)
            moved = base.clone()
            moved[:, j] += sign * step[:, j]
            assert torch.all((row_errors(moved) >= after * (1 - 1e-9)) | ~on_grid)


def test_coordinate_descent_keeps_codes_already_at_their_best():
    # With H = I each code's best integer is plain rounding's: nothing moves.
    torch.manual_seed(0)
    w = torch.randn(6, 32)
    scheme = WeightScheme(4, 16, False, torch.float32)
    rounded = rtn_quantize(w, scheme)
    assert torch.equal(coordinate_descent(rounded, w, torch.eye(32), damp=0.01, sweeps=3).q, rounded.q)
