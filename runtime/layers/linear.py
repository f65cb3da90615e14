"""Linear layers for quantized checkpoints: W4A16 INT4 and FP8 weights, kept quantized in memory.

Int4Linear holds one of three forms, chosen once at load:
- the runtime INT4 layout (what the Triton kernel and the torch reference read):
    qweight int32 [K // 8, N], nibble j of row r = the unsigned code of input row 8r + j;
    scales [groups, N] in the compute dtype; zeros uint8 [groups, N]; g_idx int32 [K] or None;
    W[k, n] = (q[k, n] - zeros[g(k), n]) * scales[g(k), n]
- quantkit's native CPU kernel's 64-column tiles (kernels/cpu_int4.py): a register GEMV for a few rows,
  AMX bf16 tiles (or torch matmul over decoded blocks) for more;
- torch's CPU INT4 form (`_weight_int4pack_mm_for_cpu`, bf16 activations, groups of 32..256), used when the
  native kernel cannot be built here.
The CPU forms need each group to be a contiguous run of input rows: act-order checkpoints (g_idx) are
permuted on K at load, and the input with them.

`kernels` decides: "reference" dequantizes per call in the compute dtype (exact, slow, the float-tolerance
check), "triton" runs the Triton kernel (CUDA, or the interpreter on CPU), "auto" takes Triton on CUDA and
a CPU form elsewhere when the shape allows it. The whole model is never dequantized at load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quantkit.formats.quantized import Fp8Weight, QuantizedWeight
from quantkit.runtime.kernels import cpu_int4
from quantkit.runtime.kernels.int4_layout import dequantize_int4, pack_int4

CPU_INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's CPU int4pack kernel accepts
CPU_INT4_N_MULTIPLE = 16  # ... and output sizes that are multiples of 16
CPU_INT4_ACTIVATIONS = torch.bfloat16  # its fast path; its float32 path is ~10x slower on AVX2
CPU_BACKENDS = ("cpu-native", "cpu-int4pack")  # in the order "auto" prefers them


class Int4Linear(nn.Module):
    def __init__(self, qweights: list[QuantizedWeight], bias: torch.Tensor | None, dtype: torch.dtype,
                 kernels: str, device: torch.device):
        """One linear from row blocks quantized with the same scheme (q/k/v or gate/up fused along N)."""
        super().__init__()
        first = qweights[0]
        self.in_features = first.shape[1]
        self.out_features = sum(w.shape[0] for w in qweights)
        self.group_size = first.group_size if first.group_size != -1 else self.in_features
        q = torch.cat([w.q for w in qweights])  # [N, K] codes
        scales = torch.cat([w.scale for w in qweights])  # [N, groups]
        zeros = torch.cat([w.zero for w in qweights])
        g_idx = first.g_idx
        self.bias = None if bias is None else nn.Parameter(bias.to(device, dtype), requires_grad=False)
        self.backend = _backend(kernels, device, self.in_features, self.out_features, self.group_size, g_idx)
        if self.backend in CPU_BACKENDS:
            self._init_cpu(q, scales, zeros, g_idx)
        else:
            qweight, scales_kn, zeros_kn = pack_int4(q, scales, zeros)
            self.register_buffer("qweight", qweight.to(device))
            self.register_buffer("scales", scales_kn.to(device, dtype))
            self.register_buffer("zeros", zeros_kn.to(device))
            self.register_buffer("g_idx", None if g_idx is None else g_idx.to(device, torch.int32))

    def _init_cpu(self, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor | None):
        perm = None
        if g_idx is not None:
            # Sort input rows by group so each group is contiguous; x is permuted the same way per call.
            perm = torch.argsort(g_idx.long(), stable=True)
            q = q[:, perm]
        self.register_buffer("perm", perm)
        if self.backend == "cpu-native":
            for name, tensor in zip(("codes", "tile_scales", "tile_offsets"), cpu_int4.pack(q, scales, zeros)):
                self.register_buffer(name, tensor)
            return
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
        # The kernel computes (q - 8) * scale + offset: offset = (8 - zero) * scale.
        scale = scales.float().T.contiguous()
        offset = (8 - zeros.float().T) * scale
        self.register_buffer("scales_and_zeros", torch.stack([scale, offset], -1).to(CPU_INT4_ACTIVATIONS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend in CPU_BACKENDS and self.perm is not None:
            x = x[:, self.perm]
        if self.backend == "cpu-native":
            y = cpu_int4.int4_matmul(x, self.codes, self.tile_scales, self.tile_offsets, self.group_size,
                                     self.out_features)
        elif self.backend == "cpu-int4pack":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(CPU_INT4_ACTIVATIONS), self.packed,
                                                            self.group_size, self.scales_and_zeros).to(x.dtype)
        elif self.backend == "triton":
            from quantkit.runtime.kernels import dispatch

            y = dispatch.int4_matmul(x, self.qweight, self.scales, self.zeros, self.g_idx, self.group_size, "triton")
        else:
            w = dequantize_int4(self.qweight, self.scales, self.zeros, self.g_idx, self.group_size, x.dtype)
            y = x @ w
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, backend={self.backend}")


class Fp8Linear(nn.Module):
    """float8_e4m3fn weights with per-channel (or per-tensor) scales, dequantized per call: 1 byte per weight
    resident. Activations stay in the compute dtype (W8A8 checkpoints run weight-only)."""

    def __init__(self, weights: list[Fp8Weight], bias: torch.Tensor | None, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.register_buffer("weight", torch.cat([w.weight for w in weights]).to(device))
        scales = [w.scale.float().reshape(-1, 1).expand(w.shape[0], 1) for w in weights]
        self.register_buffer("weight_scale", torch.cat(scales).to(device, dtype))
        self.bias = None if bias is None else nn.Parameter(bias.to(device, dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.weight_scale, self.bias)


def _backend(kernels: str, device: torch.device, in_features: int, out_features: int, group_size: int,
             g_idx: torch.Tensor | None) -> str:
    """kernels: "auto", "triton", "reference", or a CPU backend by name (benchmarks and tests compare them)."""
    if kernels == "triton" or (kernels == "auto" and device.type == "cuda"):
        return "triton"
    fits = {"cpu-native": group_size % 8 == 0 and in_features % group_size == 0 and cpu_int4.available(),
            "cpu-int4pack": group_size in CPU_INT4_GROUP_SIZES and out_features % CPU_INT4_N_MULTIPLE == 0}
    sortable = device.type == "cpu" and _sorts_into_equal_groups(g_idx, group_size)
    if kernels in CPU_BACKENDS:
        if not (sortable and fits[kernels]):
            raise ValueError(f"INT4 backend {kernels} cannot run a {out_features} x {in_features} layer with "
                             f"group size {group_size} on {device}")
        return kernels
    if kernels == "auto" and sortable:
        return next((name for name in CPU_BACKENDS if fits[name]), "reference")
    return "reference"


def _sorts_into_equal_groups(g_idx: torch.Tensor | None, group_size: int) -> bool:
    """Whether sorting input rows by g_idx gives groups 0, 1, ... of exactly group_size rows each."""
    if g_idx is None:
        return True
    sorted_groups = torch.sort(g_idx.long()).values
    return torch.equal(sorted_groups, torch.arange(len(g_idx)) // group_size)
