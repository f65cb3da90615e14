"""AWQ (Lin et al., 2023): scale salient input channels up before quantizing and fold the inverse
scale into the previous op, so the quantization error lands on channels the activations make small.

The objective is AWQ's: the output error of the layers over the calibration tokens,
||X W^T - (X / s) Q(W s)^T||^2. With H = X^T X it equals trace(dW H dW^T), dW = W - Q(W s) / s,
so every candidate is scored on all calibration tokens at the cost of one [out, in] x [in, in]
product, without re-running the module. Clipping is scored the same way on H's diagonal blocks
(each group's partial output, as AutoAWQ's clip search does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.algorithms import native as native_loops
from quantkit.algorithms.rtn import WeightScheme, fake_quantize, grid_params, quantize_to_grid

N_GRID = 20
CLIP_STEPS = 10  # shrink the range by up to 50% in steps of 5%
NATIVE_CLIP_WIDTHS = (16, 32, 64, 128)  # group widths native.cpp's clip_search is compiled for


@dataclass
class ScaleSearch:
    scales: torch.Tensor  # [in] multiply the layers' input columns, divide the previous op's outputs
    ratio: float
    loss: float  # output error with the chosen scales
    loss_unscaled: float  # output error of plain rounding with no scales (s = 1)


def output_error(weight: torch.Tensor, approx: torch.Tensor, hessian: torch.Tensor) -> float:
    """||X W^T - X A^T||^2 = trace(dW H dW^T) for dW = W - A."""
    diff = (weight - approx).float()
    return float(((diff @ hessian) * diff).sum())


def weight_salience(weights: list[torch.Tensor], scheme: WeightScheme) -> torch.Tensor:
    """Per input channel: mean over output rows of |W| relative to the absmax of its group."""
    w = torch.cat([x.float() for x in weights], dim=0)
    rows, in_features = w.shape
    grouped = w.abs().reshape(rows, scheme.groups(in_features), scheme.width(in_features))
    normalized = grouped / grouped.amax(dim=2, keepdim=True).clamp(min=1e-8)
    return normalized.reshape(rows, in_features).mean(dim=0)


def candidate_scales(x_mean: torch.Tensor, w_mean: torch.Tensor, ratio: float, duo: bool = True) -> torch.Tensor:
    x_mean = x_mean.float().clamp(min=1e-8)
    if duo:
        s = x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)
    else:
        s = x_mean.pow(ratio)
    s = s.clamp(min=1e-4)
    s = s / (s.max() * s.min()).sqrt()
    return torch.where(torch.isfinite(s), s, torch.ones_like(s))


def search_scales(weights: list[torch.Tensor], x_mean: torch.Tensor, hessian: torch.Tensor,
                  scheme: WeightScheme, duo: bool = True, n_grid: int = N_GRID) -> ScaleSearch:
    """Grid-search the ratio in s = x_mean^r / w_mean^(1-r) (r = 0, 1/n, ..., (n-1)/n) for layers that
    share one input (q/k/v, gate/up, or a single linear)."""
    w_mean = weight_salience(weights, scheme)
    best: ScaleSearch | None = None
    for step in range(n_grid):
        ratio = step / n_grid
        s = candidate_scales(x_mean, w_mean, ratio, duo)
        loss = sum(output_error(w, fake_quantize(w.float() * s, scheme) / s, hessian) for w in weights)
        if best is None or loss < best.loss:
            best = ScaleSearch(scales=s, ratio=ratio, loss=loss, loss_unscaled=0.0)
    best.loss_unscaled = sum(output_error(w, fake_quantize(w.float(), scheme), hessian) for w in weights)
    if best.loss_unscaled <= best.loss:  # scaling must never make a layer worse than plain rounding
        best = ScaleSearch(scales=torch.ones_like(x_mean, dtype=torch.float32), ratio=-1.0,
                           loss=best.loss_unscaled, loss_unscaled=best.loss_unscaled)
    return best


def search_clip(weight: torch.Tensor, hessian: torch.Tensor, scheme: WeightScheme,
                steps: int = CLIP_STEPS, n_grid: int = N_GRID, independent: bool = False) -> torch.Tensor:
    """Per (output row, group) clipping range: shrink [-absmax, absmax] by i/n_grid (i < steps) and keep
    the one with the least error in that group's partial output. With ``independent`` (asymmetric
    grids only) the group's [min, max] is also tried with its two ends shrunk by separate steps
    (steps^2 more candidates): a group whose outlier sits on one side can trim that side alone. The
    symmetric candidates stay in, so no group's error grows. Returns the clipped weight.

    Runs natively where the kernel builds (2-3x faster; the same candidates and rounding, errors summed
    in another order), else search_clip_torch."""
    native = native_loops.module() if scheme.scale_dtype in native_loops.SCALE_DTYPES else None
    if native is None or scheme.width(weight.shape[1]) not in NATIVE_CLIP_WIDTHS:
        return search_clip_torch(weight, hessian, scheme, steps, n_grid, independent)
    grouped, blocks = _groups_and_blocks(weight, hessian, scheme)
    factors = torch.tensor([1 - i / n_grid for i in range(steps)], dtype=torch.float32)
    low, high = native.clip_search(grouped.contiguous(), blocks.contiguous(), factors,
                                   independent and not scheme.symmetric, scheme.bits, scheme.symmetric,
                                   native_loops.SCALE_DTYPES[scheme.scale_dtype])
    return torch.maximum(torch.minimum(grouped, high[..., None]), low[..., None]).reshape(weight.shape).to(weight.dtype)


def search_clip_torch(weight: torch.Tensor, hessian: torch.Tensor, scheme: WeightScheme,
                      steps: int = CLIP_STEPS, n_grid: int = N_GRID, independent: bool = False) -> torch.Tensor:
    """The torch form of search_clip: each candidate range for every (row, group) at once."""
    grouped, blocks = _groups_and_blocks(weight, hessian, scheme)
    out_features, groups, width = grouped.shape
    absmax = grouped.abs().amax(dim=2, keepdim=True)
    ranges = [(-absmax * (1 - i / n_grid), absmax * (1 - i / n_grid)) for i in range(steps)]
    if independent and not scheme.symmetric:
        low, high = grouped.amin(dim=2, keepdim=True).clamp(max=0), grouped.amax(dim=2, keepdim=True).clamp(min=0)
        ranges += [(low * (1 - i / n_grid), high * (1 - j / n_grid)) for i in range(steps) for j in range(steps)]
    best_loss = torch.full((out_features, groups), float("inf"))
    best_low, best_high = ranges[0][0].clone(), ranges[0][1].clone()
    for low, high in ranges:
        clipped = torch.maximum(torch.minimum(grouped, high), low)
        flat = clipped.reshape(out_features * groups, width)
        scale, zero = grid_params(flat, scheme)
        approx = ((quantize_to_grid(flat, scale[:, None], zero[:, None], scheme.max_q) - zero[:, None])
                  * scale[:, None]).reshape(out_features, groups, width)
        diff = grouped - approx
        loss = torch.einsum("ogi,gij,ogj->og", diff, blocks, diff)
        better = loss < best_loss
        best_loss = torch.where(better, loss, best_loss)
        best_low = torch.where(better[..., None], low, best_low)
        best_high = torch.where(better[..., None], high, best_high)
    return torch.maximum(torch.minimum(grouped, best_high), best_low).reshape(weight.shape).to(weight.dtype)


def _groups_and_blocks(weight: torch.Tensor, hessian: torch.Tensor,
                       scheme: WeightScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight as [out, groups, width] float32, and H's diagonal block of each group [groups, width, width]."""
    out_features, in_features = weight.shape
    groups, width = scheme.groups(in_features), scheme.width(in_features)
    blocks = torch.stack([hessian[g * width:(g + 1) * width, g * width:(g + 1) * width] for g in range(groups)])
    return weight.float().reshape(out_features, groups, width), blocks.float()


def scale_hessian(hessian: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The Gram matrix of inputs divided by ``scales``: diag(1/s) H diag(1/s)."""
    inv = 1.0 / scales.float()
    return hessian * inv[:, None] * inv[None, :]
