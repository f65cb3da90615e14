"""INT8 activations for W8A8: per token at run time (dynamic) or by one calibrated scale per tensor (static).

The convention is vLLM's: symmetric, no zero point, x_q = clamp(round(x / s), -128, 127) with s = absmax / 127,
rounding half to even (torch.round), so the largest magnitude lands on 127 and -128 is never produced by a
dynamic scale. compressed-tensors' own fake quantization (what transformers runs) divides a dynamic token's
absmax by 127.5 instead; static scales are read from the checkpoint by both.
"""

from __future__ import annotations

import torch

INT8_MAX = 127.0
MIN_SCALE = 1e-12  # an all-zero token would divide by zero; any tiny scale is exact for it


def scale_for(absmax: torch.Tensor) -> torch.Tensor:
    return (absmax.float() / INT8_MAX).clamp(min=MIN_SCALE)


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 codes of x at `scale` (broadcasting against x)."""
    return torch.round(x.float() / scale).clamp(-128, 127).to(torch.int8)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales [..., 1]): one scale per row, the last dim being the channels."""
    scale = scale_for(x.detach().abs().amax(dim=-1, keepdim=True))
    return quantize(x, scale), scale


def round_trip(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """What an int8 GEMM multiplies x as, at a static scale, in x's dtype."""
    return (quantize(x, scale).float() * scale).to(x.dtype)


def round_trip_per_token(x: torch.Tensor) -> torch.Tensor:
    return round_trip(x, scale_for(x.detach().abs().amax(dim=-1, keepdim=True)))
