"""The torch forms of the W8A8 INT8 linear: activation quantization and the reference product the INT8 GEMMs
(Triton, native CPU, torch._int_mm) are checked against.

Activations follow quantkit's convention (quantkit.algorithms.int8, which the runtime does not import; tests
hold the two equal): symmetric, s = absmax / 127 per token or one static scale, x_q = clamp(round(x / s),
-128, 127), rounding half to even. The GEMMs sum x_q * W_q exactly in int32, then rescale in float32:
y = (acc * x_scale[m]) * w_scale[n] + bias[n], cast to the compute dtype.
"""

from __future__ import annotations

import torch

MIN_SCALE = 1e-12  # an all-zero token: any tiny scale is exact for it


def quantize(x: torch.Tensor, static_scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [M, K], scales float32 [M]) for x [M, K]; static_scale None: one scale per row."""
    if static_scale is None:
        scale = (x.abs().amax(dim=-1, keepdim=True).float() / 127.0).clamp(min=MIN_SCALE)
    else:
        scale = torch.full((x.shape[0], 1), static_scale, dtype=torch.float32, device=x.device)
    codes = torch.round(x.float() / scale).clamp(-128, 127).to(torch.int8)
    return codes, scale.reshape(-1)


def rescale(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
            dtype: torch.dtype) -> torch.Tensor:
    """int32 sums [M, N] -> the layer's output, rounding in the order every INT8 backend uses."""
    y = acc.float() * x_scale[:, None] * w_scale
    return (y if bias is None else y + bias).to(dtype)


def int8_matmul_reference(codes: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor,
                          bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Fake-quantized inputs times dequantized weights in float32: codes [M, K], weight int8 [K, N]."""
    y = (codes.float() * x_scale[:, None]) @ (weight.float() * w_scale)
    return (y if bias is None else y + bias).to(dtype)
