"""RMSNorm computed in float32, as Llama's reference does, with the residual add in front of it fused."""

from __future__ import annotations

import torch
from torch import nn

from quantkit.runtime.kernels import cpu_fused


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.native = True  # the fused CPU op where it runs; False: the torch code (kernels="reference")

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(h), h) for h = x + residual, or h = x without one: h is the next residual stream."""
        if self.native and cpu_fused.supports(x) and self.weight.dtype == x.dtype:
            return cpu_fused.add_rms_norm(x, residual, self.weight, self.eps)
        h = x if residual is None else x + residual
        dtype = h.dtype
        normed = h.float()
        normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(dtype), h
