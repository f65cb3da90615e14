"""What "auto" means for a compute dtype on this machine: bfloat16 where the CPU multiplies it natively,
float32 elsewhere. Recipes (Hessians, calibration forwards) and eval (task scoring) share the choice."""

from __future__ import annotations

import torch

CHOICES = ("auto", "float32", "bfloat16")


def resolve_compute_dtype(choice: str) -> torch.dtype:
    """"auto" is bfloat16 where the CPU multiplies it natively (AMX, or AVX-512 BF16 as on AMD Zen 4 and 5:
    2.5-3.5x float32's speed on GPTQ's Hessians), float32 elsewhere (bfloat16 would be emulated, and slower)."""
    if choice == "auto":
        return torch.bfloat16 if native_bfloat16() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[choice]


def native_bfloat16() -> bool:
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
