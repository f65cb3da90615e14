"""Rotary position embedding (the rotate-half layout of HF Llama), tables precomputed in float32; frequencies
as plain RoPE or with Llama 3's long-context scaling (rope_type "llama3")."""

from __future__ import annotations

import math

import torch
from torch import nn

from quantkit.runtime.kernels import cpu_fused


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None = None):
        """scaling: Llama 3's rope parameters (factor, low_freq_factor, high_freq_factor,
        original_max_position_embeddings), or None for plain RoPE."""
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if scaling:
            inv_freq = llama3_frequencies(inv_freq, **scaling)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.native = True  # the fused CPU op where it runs; False: the torch code (kernels="reference")
        self._step: tuple | None = None  # (positions, dtype, cos, sin) of the current forward

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: [T, heads, D], k: [T, kv_heads, D], positions: [T]. On CPU q and k are rotated in place."""
        cos, sin = self._tables(positions, q.dtype)
        if self.native and cpu_fused.supports(q):
            return cpu_fused.rotary_(q, cos, sin), cpu_fused.rotary_(k, cos, sin)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin rows [T, D] of the step's positions. Every layer shares this module and the step's positions
        tensor, so they are gathered once per forward, not once per layer."""
        if self._step is None or self._step[0] is not positions or self._step[1] != dtype:
            self._step = (positions, dtype, self.cos[positions].to(dtype), self.sin[positions].to(dtype))
        return self._step[2], self._step[3]


def llama3_frequencies(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                       original_max_position_embeddings: float) -> torch.Tensor:
    """Llama 3.x: wavelengths longer than the original context / low_freq_factor slow down by ``factor``,
    shorter than context / high_freq_factor stay, those between are interpolated (Meta's reference)."""
    context = original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > context / low_freq_factor, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < context / high_freq_factor) * ~(wavelength > context / low_freq_factor)
    return torch.where(medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
