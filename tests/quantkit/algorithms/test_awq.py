import torch

from quantkit.algorithms import awq
from quantkit.algorithms.gptq import input_hessian
from quantkit.algorithms.rtn import WeightScheme, fake_quantize

SCHEME = WeightScheme(4, 16, False, torch.float32)


def _salient_inputs(tokens=2000, channels=32, salient=(3, 17)):
    torch.manual_seed(0)
    x = torch.randn(tokens, channels)
    x[:, list(salient)] *= 20.0
    return x


def test_output_error_equals_the_error_measured_on_the_tokens():
    x, w, a = torch.randn(50, 8), torch.randn(4, 8), torch.randn(4, 8)
    direct = ((x @ w.T - x @ a.T) ** 2).sum()
    torch.testing.assert_close(torch.tensor(awq.output_error(w, a, input_hessian([x]))), direct,
                               rtol=1e-4, atol=1e-4)


def test_weight_salience_is_relative_to_the_group_absmax():
    w = torch.tensor([[1.0, -2.0, 4.0, 0.0], [2.0, 2.0, 1.0, 1.0]])
    # groups of 2: row 0 -> [1, 2]/2, [4, 0]/4; row 1 -> all ones; mean over rows
    salience = awq.weight_salience([w], WeightScheme(4, 2, False))
    torch.testing.assert_close(salience, torch.tensor([0.75, 1.0, 1.0, 0.5]))


def test_candidate_scales_are_normalized_around_one():
    s = awq.candidate_scales(torch.tensor([1.0, 4.0, 16.0]), torch.tensor([0.5, 0.5, 0.5]), ratio=0.5)
    torch.testing.assert_close(s.max() * s.min(), torch.tensor(1.0))
    assert s[2] > s[1] > s[0]


def test_scale_search_protects_salient_channels_and_beats_rounding():
    x = _salient_inputs()
    w = torch.randn(24, 32)
    h = input_hessian([x])
    x_mean = x.abs().mean(dim=0)
    found = awq.search_scales([w], x_mean, h, SCHEME)
    assert 0 <= found.ratio < 1
    assert found.loss < 0.8 * found.loss_unscaled
    others = torch.ones(32, dtype=torch.bool)
    others[[3, 17]] = False
    assert found.scales[[3, 17]].min() > found.scales[others].max()
    # the scaled weights, divided back, give the error the search reported
    effective = fake_quantize(w * found.scales, SCHEME) / found.scales
    assert abs(awq.output_error(w, effective, h) - found.loss) < 1e-3 * found.loss


def test_scale_search_never_returns_worse_than_plain_rounding():
    x = torch.randn(500, 32)  # no salient channels: scaling has little to offer
    w = torch.randn(8, 32)
    found = awq.search_scales([w], x.abs().mean(dim=0), input_hessian([x]), SCHEME)
    assert found.loss <= found.loss_unscaled


def test_clip_search_lowers_the_group_output_error():
    torch.manual_seed(1)
    x = torch.randn(1000, 32)
    w = torch.randn(16, 32)
    w[:, 5] *= 8.0  # outliers that stretch their groups' ranges
    h = input_hessian([x])
    clipped = awq.search_clip(w, h, SCHEME)
    assert (clipped.abs() <= w.abs()).all()
    assert awq.output_error(w, fake_quantize(clipped, SCHEME), h) < awq.output_error(w, fake_quantize(w, SCHEME), h)


def test_independent_clipping_never_loses_to_symmetric_and_trims_one_side():
    """The [min, max] candidates come on top of the symmetric ones, so no (row, group) error grows; a
    group spread over [-1, 1] with a +6 outlier gains by moving its negative end alone."""
    torch.manual_seed(2)
    x = torch.randn(1000, 32)
    w = torch.randn(16, 32)
    w[:, 5] *= 8.0
    h = input_hessian([x])

    def group_errors(clipped):  # each (row, group)'s output error on H's diagonal blocks
        diff = (w - fake_quantize(clipped, SCHEME)).view(16, 2, 16)
        blocks = torch.stack([h[g * 16:(g + 1) * 16, g * 16:(g + 1) * 16] for g in range(2)])
        return torch.einsum("ogi,gij,ogj->og", diff, blocks, diff)

    symmetric = group_errors(awq.search_clip(w, h, SCHEME))
    independent = group_errors(awq.search_clip(w, h, SCHEME, independent=True))
    assert (independent <= symmetric * (1 + 1e-6)).all() and independent.sum() < symmetric.sum()

    row = torch.linspace(-1, 1, 16)
    row[7] = 6.0
    eye = torch.eye(16)
    trimmed = awq.search_clip(row[None], eye, SCHEME, independent=True)
    assert trimmed.max() == 6.0 and -1.0 < trimmed.min() < -0.8  # only the negative end moved
    assert awq.output_error(row[None], fake_quantize(trimmed, SCHEME), eye) < \
        awq.output_error(row[None], fake_quantize(awq.search_clip(row[None], eye, SCHEME), SCHEME), eye)


def test_scaled_hessian_matches_scaled_inputs():
    x, s = torch.randn(30, 6), torch.rand(6) + 0.5
    torch.testing.assert_close(awq.scale_hessian(input_hessian([x]), s),
                               input_hessian([x / s]), rtol=1e-5, atol=1e-5)
