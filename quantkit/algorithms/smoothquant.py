"""SmoothQuant (Xiao et al., 2023): divide each input channel of a group of linears by s and multiply the
weights' columns by s, so activation outliers (a few channels many times larger than the rest, which a
per-token or per-tensor int8 scale must also cover) move partly into the weights, which quantize per output
channel and absorb them more cheaply:

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

The paper fixes alpha per model (0.5 for most); here it is searched per group of linears: each candidate is
scored by the W8A8 product's output error, ||Q(X / s) Q(W s)^T - X W^T||^2, on a sample of calibration tokens,
with quantized activations as the checkpoint will run them (per token, or one static scale from the whole
calibration set's absmax). No smoothing (s = 1) is a candidate too, so the chosen scales never score worse
than none on that sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.algorithms import int8
from quantkit.algorithms.rtn import WeightScheme, fake_quantize

N_GRID = 20  # alpha in 0, 0.05, ..., 1
MIN_MAGNITUDE = 1e-5  # a dead channel (all-zero input or weight column) keeps a finite scale


@dataclass
class SmoothingSearch:
    scales: torch.Tensor | None  # [in]; None: no smoothing scored best
    alpha: float | None
    error: float  # relative output error of the chosen candidate on the sample
    error_unsmoothed: float


def smoothing_scales(x_absmax: torch.Tensor, w_absmax: torch.Tensor, alpha: float) -> torch.Tensor:
    x = x_absmax.float().clamp(min=MIN_MAGNITUDE)
    w = w_absmax.float().clamp(min=MIN_MAGNITUDE)
    return (x.pow(alpha) / w.pow(1 - alpha)).clamp(min=MIN_MAGNITUDE)


def w8a8_error(weights: list[torch.Tensor], sample: torch.Tensor, x_absmax: torch.Tensor,
               scales: torch.Tensor | None, scheme: WeightScheme, static: bool) -> float:
    """Summed squared output error of the group's linears run as W8A8 after smoothing by ``scales``."""
    x = sample if scales is None else sample / scales
    if static:  # the calibration set's absmax of the smoothed inputs sets the one scale
        absmax = x_absmax if scales is None else x_absmax / scales
        x_q = int8.round_trip(x, int8.scale_for(absmax.max()))
    else:
        x_q = int8.round_trip_per_token(x)
    error = 0.0
    for w in weights:
        w_q = fake_quantize(w if scales is None else w * scales, scheme)
        error += float(((x_q @ w_q.T - sample @ w.T) ** 2).sum())
    return error


def search_smoothing(weights: list[torch.Tensor], x_absmax: torch.Tensor, sample: torch.Tensor,
                     scheme: WeightScheme, static: bool, alpha: float | None = None,
                     n_grid: int = N_GRID) -> SmoothingSearch:
    """weights: the group's [out, in] weights (all fed by one op); x_absmax: [in] over every calibration token;
    sample: [tokens, in] calibration rows to score on. alpha: fixed instead of searched."""
    weights = [w.float() for w in weights]
    sample = sample.float()
    energy = max(sum(float(((sample @ w.T) ** 2).sum()) for w in weights), 1e-30)
    w_absmax = torch.cat(weights).abs().amax(dim=0)
    unsmoothed = w8a8_error(weights, sample, x_absmax, None, scheme, static) / energy
    best = SmoothingSearch(None, None, unsmoothed, unsmoothed)
    alphas = [alpha] if alpha is not None else [i / n_grid for i in range(n_grid + 1)]
    for a in alphas:
        scales = smoothing_scales(x_absmax, w_absmax, a)
        error = w8a8_error(weights, sample, x_absmax, scales, scheme, static) / energy
        if error < best.error or alpha is not None:
            best = SmoothingSearch(scales, a, error, unsmoothed)
    return best


def sample_rows(inputs, count: int) -> torch.Tensor:
    """About ``count`` rows spread evenly over the samples' tokens ([tokens, in] each), every sample's first
    token among them."""
    total = sum(x.shape[0] for x in inputs)
    step = max(1, -(-total // count))
    return torch.cat([x[::step].float() for x in inputs])
