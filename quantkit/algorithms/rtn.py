"""Round-to-nearest integer quantization on a per-group affine grid: the baseline every method must beat,
and the grid that GPTQ and AWQ quantize onto.

Grid (as GPTQ and compressed-tensors compute it): the range always includes 0;
symmetric: scale = absmax / (2**(bits-1) - 0.5), zero = 2**(bits-1);
asymmetric: scale = (max - min) / (2**bits - 1), zero = round(-min / scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.algorithms import native as native_loops
from quantkit.formats.quantized import QuantizedWeight


@dataclass(frozen=True)
class WeightScheme:
    bits: int = 4
    group_size: int = 64  # -1: one group per output channel
    symmetric: bool = False
    # Checkpoints store scales in the model dtype; codes are computed against the rounded scale so
    # that what is written dequantizes to exactly what was measured.
    scale_dtype: torch.dtype = torch.float16

    @property
    def max_q(self) -> int:
        return 2**self.bits - 1

    def groups(self, in_features: int) -> int:
        return 1 if self.group_size == -1 else in_features // self.group_size

    def width(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size


def grid_params(w: torch.Tensor, scheme: WeightScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero for each row of ``w`` [rows, columns] (one group per row)."""
    w = w.float()
    low = w.amin(dim=1).clamp(max=0)
    high = w.amax(dim=1).clamp(min=0)
    if scheme.symmetric:
        absmax = torch.maximum(-low, high)
        scale = absmax / (2 ** (scheme.bits - 1) - 0.5)
        zero = torch.full_like(scale, 2 ** (scheme.bits - 1))
    else:
        scale = (high - low) / scheme.max_q
        zero = torch.round(-low / scale.clamp(min=torch.finfo(torch.float32).tiny))
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # an all-zero row stays exactly zero
    scale = scale.clamp(min=torch.finfo(scheme.scale_dtype).tiny).to(scheme.scale_dtype).float()
    return scale, zero.clamp(0, scheme.max_q)


def mse_grid_params(w: torch.Tensor, scheme: WeightScheme, steps: int = 20, max_shrink: float = 0.2,
                    column_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Like grid_params, but shrink each row's range by up to ``max_shrink`` where that lowers the
    squared rounding error (GPTQ's "mse" grid: clipping a few outliers buys resolution for the rest).
    All candidate ranges are scored in one batched pass. ``column_weights`` (broadcast to [rows, columns])
    weigh each column's squared error, e.g. by its input's energy, so the range favours the columns that
    matter for the layer's output."""
    w = w.float()
    factors = 1 - max_shrink * torch.arange(steps + 1, dtype=torch.float32) / steps  # 1.0 first
    native = native_loops.module() if scheme.scale_dtype in native_loops.SCALE_DTYPES else None
    if native is not None:  # the same search row by row (equal up to the errors' summation order)
        weights = torch.empty(0) if column_weights is None else column_weights.float().contiguous()
        if weights.numel() == 0 or weights.shape in (w.shape[1:], w.shape):
            scale, zero = native.mse_grid(w.contiguous(), weights, factors, scheme.bits, scheme.symmetric,
                                          native_loops.SCALE_DTYPES[scheme.scale_dtype])
            return scale, zero
    return mse_grid_params_torch(w, scheme, factors, column_weights)


def mse_grid_params_torch(w: torch.Tensor, scheme: WeightScheme, factors: torch.Tensor,
                          column_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch form of mse_grid_params: all candidate ranges (``factors`` of each row's range) in one pass."""
    rows, steps = w.shape[0], factors.numel() - 1
    low, high = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
    candidates = torch.stack([low[None] * factors[:, None], high[None] * factors[:, None]], dim=-1)
    scale, zero = grid_params(candidates.reshape(-1, 2), scheme)
    scale, zero = scale.view(steps + 1, rows, 1), zero.view(steps + 1, rows, 1)
    q = quantize_to_grid(w[None], scale, zero, scheme.max_q)
    error = ((q - zero) * scale - w[None]).square()
    if column_weights is not None:
        error = error * column_weights
    error = error.sum(dim=2)  # [candidates, rows]
    best = error.argmin(dim=0)  # ties keep the widest range (factor 1.0 comes first)
    pick = torch.arange(rows)
    return scale[best, pick, 0], zero[best, pick, 0]


def quantize_to_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, max_q: int) -> torch.Tensor:
    """Integer codes for ``w`` [rows, cols] on per-row (or broadcastable) scale and zero."""
    return torch.clamp(torch.round(w.float() / scale) + zero, 0, max_q)


def fake_quantize(w: torch.Tensor, scheme: WeightScheme) -> torch.Tensor:
    """Quantize and dequantize in one go, in the input's shape and dtype."""
    return rtn_quantize(w, scheme).dequantize(w.dtype)


def rtn_quantize(w: torch.Tensor, scheme: WeightScheme) -> QuantizedWeight:
    out, in_features = w.shape
    groups, width = scheme.groups(in_features), scheme.width(in_features)
    grouped = w.float().reshape(out * groups, width)
    scale, zero = grid_params(grouped, scheme)
    q = quantize_to_grid(grouped, scale[:, None], zero[:, None], scheme.max_q)
    return QuantizedWeight(
        q=q.reshape(out, in_features).to(torch.uint8), scale=scale.reshape(out, groups),
        zero=zero.reshape(out, groups).to(torch.int32), bits=scheme.bits, group_size=scheme.group_size,
        symmetric=scheme.symmetric,
    )
