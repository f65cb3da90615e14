"""SmoothQuant's scale search: what it folds preserves the product, and it moves outliers where int8 absorbs them."""

import pytest
import torch

from quantkit.algorithms import int8, smoothquant
from quantkit.algorithms.rtn import WeightScheme

INT8_CHANNEL = WeightScheme(bits=8, group_size=-1, symmetric=True, scale_dtype=torch.float32)


def outlier_inputs(tokens: int = 256, width: int = 64, seed: int = 0) -> torch.Tensor:
    """Activations with a few channels ~50x the rest, as LLM residual streams have (SmoothQuant's Fig. 4)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, width, generator=generator)
    x[:, :3] *= 50
    return x


def test_smoothing_scales_follow_the_formula():
    x, w = torch.tensor([4.0, 1.0]), torch.tensor([1.0, 4.0])
    torch.testing.assert_close(smoothquant.smoothing_scales(x, w, 0.5), torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(smoothquant.smoothing_scales(x, w, 1.0), x)


@pytest.mark.parametrize("static", [False, True])
def test_search_cuts_the_w8a8_error_of_outlier_channels(static):
    x = outlier_inputs()
    weights = [torch.randn(32, 64, generator=torch.Generator().manual_seed(1)) for _ in range(2)]
    search = smoothquant.search_smoothing(weights, x.abs().amax(dim=0), x, INT8_CHANNEL, static)
    assert search.alpha is not None and 0 < search.alpha <= 1
    # per-tensor int8 on inputs whose outliers are 50x the rest loses most of the small channels
    assert search.error < search.error_unsmoothed / (4 if static else 2)


def test_search_keeps_no_smoothing_when_nothing_is_gained():
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(2))  # no outliers
    weights = [torch.randn(32, 64, generator=torch.Generator().manual_seed(3))]
    search = smoothquant.search_smoothing(weights, x.abs().amax(dim=0), x, INT8_CHANNEL, static=False)
    assert search.error <= search.error_unsmoothed
    direct = smoothquant.w8a8_error(weights, x, x.abs().amax(dim=0), search.scales, INT8_CHANNEL, False)
    energy = float(((x @ weights[0].T) ** 2).sum())
    assert direct / energy == pytest.approx(search.error)


def test_fixed_strength_is_used_as_given():
    x = outlier_inputs()
    weights = [torch.randn(16, 64)]
    search = smoothquant.search_smoothing(weights, x.abs().amax(dim=0), x, INT8_CHANNEL, False, alpha=0.5)
    assert search.alpha == 0.5
    expected = smoothquant.smoothing_scales(x.abs().amax(dim=0), weights[0].abs().amax(dim=0), 0.5)
    torch.testing.assert_close(search.scales, expected)


def test_sample_rows_spread_over_every_sample():
    inputs = [torch.arange(10.0)[:, None].expand(10, 2), torch.arange(10.0, 16.0)[:, None].expand(6, 2)]
    rows = smoothquant.sample_rows(inputs, 8)
    assert rows[:, 0].tolist() == [0, 2, 4, 6, 8, 10, 12, 14]


def test_int8_round_trips_follow_vllms_convention():
    x = torch.tensor([[1.27, -0.5, 0.005], [0.0, 0.0, 0.0]])
    codes, scale = int8.quantize_per_token(x)
    assert codes[0].tolist() == [127, -50, 0]  # absmax onto 127, half to even
    assert codes[1].tolist() == [0, 0, 0] and torch.isfinite(scale).all()
    assert int8.quantize(torch.tensor([300.0, -300.0]), torch.tensor(1.0)).tolist() == [127, -128]
