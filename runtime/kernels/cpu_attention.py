"""Native CPU paged decode attention (cpu_decode_attention.cpp): reads K/V straight from the paged cache
instead of gathering a padded copy per layer as the torch reference does.

Built on first use (cpu_extension.py); if the build fails the runtime warns once and keeps the torch
reference. float32 or bfloat16 queries over a float32, bfloat16 or FP8 (uint8) cache, computed in float32;
anything else (float16) takes the reference.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit.runtime.kernels import cpu_extension
from quantkit.runtime.kernels.reference import FP8_DTYPE

SOURCE = Path(__file__).with_name("cpu_decode_attention.cpp")
_state: dict = {}


def _extension():
    return cpu_extension.load(SOURCE)


def available() -> bool:
    """Whether the kernel is built (building it on the first call, ~45 s; later processes load it)."""
    return _extension() is not None


QUERY_DTYPES = (torch.float32, torch.bfloat16)
CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.uint8)


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (q.device.type == "cpu" and q.dtype in QUERY_DTYPES and k_cache.dtype in CACHE_DTYPES
            and _extension() is not None)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, scale: float,
                           k_scale: float | None = None, v_scale: float | None = None) -> torch.Tensor:
    """Same contract as reference.paged_decode_attention: q [B, heads, D] -> [B, heads, D] in q's dtype."""
    fp8 = k_cache.dtype == torch.uint8
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype or q.shape[2] != k_cache.shape[2]:
        raise ValueError(f"cache shapes {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not fit q {tuple(q.shape)}")
    table = _fp8_table() if fp8 else torch.empty(0)
    out = _extension().paged_decode_attention(
        q.float().contiguous(), k_cache, v_cache, block_tables.to(torch.int64).contiguous(),
        context_lens.to(torch.int64).contiguous(), table, block_size, scale,
        float(k_scale or 1.0), float(v_scale or 1.0))
    return out.to(q.dtype)


def _fp8_table() -> torch.Tensor:
    """The float32 value of each float8_e4m3fn byte."""
    if "fp8_table" not in _state:
        _state["fp8_table"] = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    return _state["fp8_table"]
