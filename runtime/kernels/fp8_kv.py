"""KV-cache write in Triton: this step's K or V [T, kv_heads, D] into the paged cache at slot_mapping.

A uint8 cache holds float8_e4m3fn bytes of x / scale (clamped to +-448, rounded to nearest even by the cast);
a float cache takes x as it is. The torch reference is reference.write_kv.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantkit.runtime.kernels._triton import check, interpreting
from quantkit.runtime.kernels.reference import FP8_MAX


@triton.jit
def _write_kv_kernel(x_ptr, cache_ptr, slot_ptr, scale, stride_xt, stride_cs, ROW: tl.constexpr,
                     BLOCK: tl.constexpr, FP8: tl.constexpr, FP8_MAX: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < ROW  # one token's kv_heads * D values, contiguous in x and in the cache
    slot = tl.load(slot_ptr + t).to(tl.int64)
    x = tl.load(x_ptr + t * stride_xt + offs, mask=mask)
    if FP8:
        # div_rn: IEEE division, as torch's x / scale (the default fast division may be 1 ulp off).
        y = tl.div_rn(x.to(tl.float32), scale)
        y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        tl.store(cache_ptr + slot * stride_cs + offs, y, mask=mask)
    else:
        tl.store(cache_ptr + slot * stride_cs + offs, x, mask=mask)


def write_kv(cache: torch.Tensor, x: torch.Tensor, slots: torch.Tensor, scale: float | None) -> None:
    """cache [num_slots, kv_heads, D]: cache[slots] = x, as fp8(x / scale) bytes when cache is uint8."""
    fp8 = cache.dtype == torch.uint8
    check(cache.dim() == 3 and x.dim() == 3 and x.shape[1:] == cache.shape[1:],
          f"x {tuple(x.shape)} must be [T, kv_heads, D] of cache {tuple(cache.shape)}")
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"x must be a float tensor, got {x.dtype}")
    check(fp8 or cache.dtype == x.dtype, f"a {cache.dtype} cache takes {cache.dtype} K/V, got {x.dtype}")
    check(not fp8 or (scale is not None and scale > 0), f"an fp8 cache needs a positive scale, got {scale}")
    check(cache.stride(2) == 1 and cache.stride(1) == cache.shape[2] and x.stride(2) == 1
          and x.stride(1) == x.shape[2], "cache and x must be contiguous within a token (heads, then D)")
    check(slots.dim() == 1 and slots.shape[0] == x.shape[0] and slots.dtype in (torch.int32, torch.int64),
          f"slots must be int32/int64 [{x.shape[0]}], got {slots.dtype} {tuple(slots.shape)}")
    check(cache.device == x.device == slots.device, "cache, x and slots must be on one device")
    check(x.is_cuda or interpreting(), "the Triton KV write needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)")
    t = x.shape[0]
    if t == 0:
        return
    row = x.shape[1] * x.shape[2]
    block = min(triton.next_power_of_2(row), 1024)
    _write_kv_kernel[(t, triton.cdiv(row, block))](
        x, cache, slots, float(scale) if fp8 else 1.0, x.stride(0), cache.stride(0), ROW=row, BLOCK=block,
        FP8=fp8, FP8_MAX=FP8_MAX)
