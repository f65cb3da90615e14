"""FP8 (float8_e4m3fn) quantization: weights per output channel, activations per token or per tensor,
and the KV cache per tensor.

The convention everywhere (compressed-tensors, vLLM): the stored value is fp8(x / scale) and it reads
back as fp8 * scale, with scale = absmax / 448 so the largest magnitude lands on e4m3fn's largest
finite value. e4m3fn has no infinity: values beyond +-448 must be clamped before the cast.
"""

from __future__ import annotations

import torch

from quantkit.formats.quantized import Fp8Weight

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
# A scale of exactly 0 (an all-zero row, an unused head) would divide by zero; any tiny value is exact.
MIN_SCALE = 1e-12


def scale_for(absmax: torch.Tensor) -> torch.Tensor:
    """The fp8 scale that maps `absmax` onto the largest finite e4m3fn value."""
    return (absmax.float() / FP8_MAX).clamp(min=MIN_SCALE)


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8(x / scale), clamped to the finite range (scale broadcasts against x)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def round_trip(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """What a consumer reads back after storing x in fp8 at `scale`, in x's dtype."""
    return (to_fp8(x, scale).float() * scale).to(x.dtype)


def round_trip_per_token(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-token activation quantization: one scale per row (the last dim is the channel)."""
    scale = scale_for(x.detach().abs().amax(dim=-1, keepdim=True))
    return round_trip(x, scale)


def quantize_weight(weight: torch.Tensor, scale_dtype: torch.dtype = torch.float16,
                    input_absmax: float | None = None) -> Fp8Weight:
    """Per-output-channel fp8 weight. The scale is rounded to `scale_dtype` (how the checkpoint stores
    it) before the cast, so the stored values dequantize to exactly what was measured; input_absmax
    (static activations) becomes the per-tensor input scale."""
    w = weight.detach().float()
    scale = _stored(scale_for(w.abs().amax(dim=1, keepdim=True)), scale_dtype)
    input_scale = None
    if input_absmax is not None:
        input_scale = _stored(scale_for(torch.tensor([float(input_absmax)])), scale_dtype)
    return Fp8Weight(weight=to_fp8(w, scale), scale=scale, input_scale=input_scale)


def _stored(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`scale` as `dtype` will store it; a scale that underflows to 0 there (an all-zero row) becomes the
    dtype's smallest normal value instead, so dequantizing never computes 0 / 0."""
    stored = scale.to(dtype)
    return torch.where(stored == 0, torch.finfo(dtype).tiny, stored).float()
