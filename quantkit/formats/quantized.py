"""The in-memory forms of a quantized linear weight, shared by every format: QuantizedWeight (integer,
weight-only), Fp8Weight (float8 weights, optionally with a static input scale) and Int8Weight (W8A8 INT8:
signed int8 weights whose inputs are quantized to int8 too). QuantizedWeight:

    W[n, k] ~= scale[n, g] * (q[n, k] - zero[n, g]),  g = g_idx[k] (default k // group_size)

q and zero are unsigned integers in [0, 2**bits - 1]; a symmetric scheme has zero = 2**(bits - 1)
everywhere. Each on-disk format converts from and to this form (for example compressed-tensors
stores q - 2**(bits-1) and zero - 2**(bits-1) as signed values; GPTQ v1 stores zero - 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QuantizedWeight:
    q: torch.Tensor  # [out, in] uint8
    scale: torch.Tensor  # [out, n_groups] float32
    zero: torch.Tensor  # [out, n_groups] int32
    bits: int
    group_size: int  # -1: one group spanning all input channels
    symmetric: bool
    g_idx: torch.Tensor | None = None  # [in] int32; None means k // group_size

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def group_width(self) -> int:
        """Input columns per group: the whole row for group_size -1."""
        return self.q.shape[1] if self.group_size == -1 else self.group_size

    def group_index(self) -> torch.Tensor:
        if self.g_idx is not None:
            return self.g_idx.long()
        return torch.arange(self.q.shape[1]) // self.group_width

    def rows(self, start: int, end: int) -> QuantizedWeight:
        """Output rows [start, end) (e.g. one attention head's), sharing this weight's storage."""
        return QuantizedWeight(q=self.q[start:end], scale=self.scale[start:end], zero=self.zero[start:end],
                               bits=self.bits, group_size=self.group_size, symmetric=self.symmetric, g_idx=self.g_idx)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        out_features, in_features = self.q.shape
        groups, width = self.scale.shape[1], self.group_width
        if self.g_idx is None and groups * width == in_features:  # whole contiguous groups: no gather, ~25x faster
            q = self.q.float().view(out_features, groups, width)
            grouped = (q - self.zero.float()[..., None]) * self.scale.float()[..., None]
            return grouped.view(out_features, in_features).to(dtype)
        g = self.group_index()
        scale = self.scale.float()[:, g]
        zero = self.zero.float()[:, g]
        return ((self.q.float() - zero) * scale).to(dtype)


def stack_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """One weight from row blocks quantized separately with the same scheme (e.g. per attention head)."""
    first = parts[0]
    return QuantizedWeight(q=torch.cat([p.q for p in parts]), scale=torch.cat([p.scale for p in parts]),
                           zero=torch.cat([p.zero for p in parts]), bits=first.bits, group_size=first.group_size,
                           symmetric=first.symmetric, g_idx=first.g_idx)


@dataclass
class Fp8Weight:
    """A float8_e4m3fn weight with per-output-channel (or per-tensor) scales:

        W[n, k] ~= float(weight[n, k]) * scale[n]

    input_scale, when set, is the static per-tensor scale of the layer's input activations (W8A8
    static); None means activations are quantized per token at run time (W8A8 dynamic).
    """

    weight: torch.Tensor  # [out, in] float8_e4m3fn
    scale: torch.Tensor  # [out, 1] per channel or [1] per tensor, float32
    input_scale: torch.Tensor | None = None  # [1] float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight.float() * self.scale.float()).to(dtype)  # [out, 1] and [1] both broadcast


@dataclass
class Int8Weight:
    """A W8A8 INT8 linear: signed int8 weights with per-output-channel scales, and int8 inputs:

        W[n, k] ~= weight[n, k] * scale[n]
        x_q = clamp(round(x / s_x), -128, 127), s_x = input_scale (static) or each token's absmax / 127 (dynamic)

    input_scale None means activations are quantized per token at run time (see quantkit.algorithms.int8).
    """

    weight: torch.Tensor  # [out, in] int8
    scale: torch.Tensor  # [out, 1] float32
    input_scale: torch.Tensor | None = None  # [1] float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight.float() * self.scale.float()).to(dtype)

    @classmethod
    def from_codes(cls, codes: QuantizedWeight, input_scale: torch.Tensor | None = None) -> Int8Weight:
        """From symmetric 8-bit per-channel codes (unsigned, zero 128), as RTN and GPTQ make them."""
        if (codes.bits, codes.group_size, codes.symmetric) != (8, -1, True):
            raise ValueError(f"W8A8 INT8 needs symmetric 8-bit per-channel codes, got bits {codes.bits}, "
                             f"group_size {codes.group_size}, symmetric {codes.symmetric}")
        return cls(weight=(codes.q.to(torch.int16) - 128).to(torch.int8), scale=codes.scale.float().reshape(-1, 1),
                   input_scale=input_scale)
