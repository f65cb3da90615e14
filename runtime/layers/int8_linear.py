"""W8A8 INT8 linear: int8 weights resident (1 byte each), activations quantized to int8 on every call.

Forward: x_q, x_scale = quantize(x) (per token, or the checkpoint's static input scale); acc = x_q @ W_q^T
summed exactly in int32; y = (acc * x_scale) * w_scale + bias in float32, cast to the compute dtype.

`kernels` picks the backend, as for Int4Linear:
- "reference": the torch float product of the fake-quantized inputs and the dequantized weights (the check);
- "triton": the Triton kernel (CUDA, or the interpreter on CPU); "auto" takes it on CUDA;
- "cpu-native": cpu_int8.py, quantization fused in, AMX int8 tiles (AVX-512 VNNI without AMX); "auto" takes
  it on CPU where it builds;
- "cpu-int-mm": torch._int_mm after torch-op quantization, "auto"'s CPU choice when the native kernel cannot
  be built (no AMX int8 path in torch 2.13: 0.25-0.5x bf16 at 512 rows, 1 thread).
"""

from __future__ import annotations

import torch
from torch import nn

from quantkit.formats.quantized import Int8Weight
from quantkit.runtime.kernels import cpu_int8
from quantkit.runtime.kernels.int8_reference import int8_matmul_reference, quantize, rescale

CPU_BACKENDS = ("cpu-native", "cpu-int-mm")  # in the order "auto" prefers them


class Int8Linear(nn.Module):
    def __init__(self, weights: list[Int8Weight], bias: torch.Tensor | None, dtype: torch.dtype, kernels: str,
                 device: torch.device):
        """One linear from row blocks (q/k/v or gate/up fused along N), all static or all dynamic."""
        super().__init__()
        statics = [w.input_scale for w in weights]
        if len({s is None for s in statics}) != 1:
            raise ValueError("fused INT8 parts mix static and dynamic input scales")
        self.in_features = weights[0].shape[1]
        self.out_features = sum(w.shape[0] for w in weights)
        # Fused parts share one input, so one scale quantizes it: the largest, which clips none of the parts'
        # calibrated ranges (vLLM takes the same max over a fused layer's static int8 input scales).
        self.input_scale = None if statics[0] is None else max(float(s.max()) for s in statics)
        self.dtype = dtype
        self.backend = _backend(kernels, device)
        weight = torch.cat([w.weight for w in weights])  # [N, K]
        w_scale = torch.cat([w.scale.float().reshape(-1, 1).expand(w.shape[0], 1) for w in weights]).reshape(-1)
        bias = None if bias is None else bias.float()
        if self.backend == "cpu-native":
            for name, t in zip(("packed", "col_sums", "w_scale", "bias"), cpu_int8.pack(weight, w_scale, bias)):
                self.register_buffer(name, t)
            return
        self.register_buffer("weight", weight.T.contiguous().to(device))  # [K, N], as tl.dot and _int_mm take it
        self.register_buffer("w_scale", w_scale.to(device))
        self.register_buffer("bias", None if bias is None else bias.to(device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        if self.backend == "cpu-native":
            y = cpu_int8.int8_linear(x, self.input_scale, self.packed, self.col_sums, self.w_scale,
                                     self.bias, self.out_features)
        else:
            codes, x_scale = quantize(x, self.input_scale)
            if self.backend == "cpu-int-mm":
                y = rescale(torch._int_mm(codes, self.weight), x_scale, self.w_scale, self.bias, x.dtype)
            elif self.backend == "triton":
                from quantkit.runtime.kernels import dispatch

                y = dispatch.int8_matmul(codes, x_scale, self.weight, self.w_scale, self.bias, x.dtype, "triton")
            else:
                y = int8_matmul_reference(codes, x_scale, self.weight, self.w_scale, self.bias, x.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        scheme = "dynamic per token" if self.input_scale is None else f"static input scale {self.input_scale:.4g}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, {scheme}, "
                f"backend={self.backend}")


def _backend(kernels: str, device: torch.device) -> str:
    """kernels: "auto", "triton", "reference", or a CPU backend by name (benchmarks and tests compare them)."""
    if kernels == "triton" or (kernels == "auto" and device.type == "cuda"):
        return "triton"
    if kernels in CPU_BACKENDS:
        if device.type != "cpu" or (kernels == "cpu-native" and not cpu_int8.available()):
            raise ValueError(f"INT8 backend {kernels} cannot run on {device} here")
        return kernels
    if kernels == "auto" and device.type == "cpu":
        return "cpu-native" if cpu_int8.available() else "cpu-int-mm"
    return "reference"
