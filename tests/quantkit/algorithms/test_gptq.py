import torch

from quantkit.algorithms.gptq import gptq_quantize, input_hessian, inverse_hessian_factor
from quantkit.algorithms.rtn import WeightScheme, fake_quantize

SCHEME = WeightScheme(4, 8, True, torch.float32)


def test_hessian_is_the_sum_of_outer_products():
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    assert torch.equal(input_hessian([x[:1], x[1:]]), torch.tensor([[10.0, -1.0], [-1.0, 5.0]]))


def test_blocked_hessian_equals_the_full_product():
    xs = [torch.randn(40, 70), torch.randn(13, 70)]
    full = sum(x.T @ x for x in xs)
    torch.testing.assert_close(input_hessian(xs, block=16), full, rtol=1e-5, atol=1e-4)


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
