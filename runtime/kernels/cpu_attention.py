"""Native CPU paged decode attention (cpu_decode_attention.cpp): reads K/V straight from the paged cache
instead of gathering a padded copy per layer as the torch reference does.

Built on first use with torch's C++ extension loader (g++ and ninja, cached under quantkit's cache); if
the build fails the runtime warns once and keeps the torch reference. float32 or bfloat16 queries over a
float32, bfloat16 or FP8 (uint8) cache, computed in float32; anything else (float16) takes the reference.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from quantkit.runtime.kernels.reference import FP8_DTYPE

log = logging.getLogger("quantkit.runtime")
SOURCE = Path(__file__).with_name("cpu_decode_attention.cpp")
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"]
STALE_LOCK_S = 600  # a build takes about a minute; an older lock file was left by a build that was killed
_state: dict = {}


def _build_directory() -> Path:
    """One directory per source, flags, torch and Python version, under quantkit's cache. torch's loader waits
    forever on the lock file of a build that was killed midway (seen: a CI run hung), so a stale lock goes."""
    from quantkit.models import cache_dir

    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode() + torch.__version__.encode()
                         + sys.version.encode()).hexdigest()[:16]
    directory = cache_dir() / "extensions" / f"cpu_decode_attention-{key}"
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        log.warning("removing a stale build lock %s", lock)
        lock.unlink(missing_ok=True)
    return directory


def _extension():
    """The compiled module, or None when it cannot be built here (warned once)."""
    if "module" not in _state:
        _state["module"] = None
        try:
            from torch.utils.cpp_extension import load

            # ninja may come from this venv's bin, which is not on PATH when the venv is not activated.
            os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
            log.info("building the native CPU attention kernel (first use only)")
            _state["module"] = load("quantkit_cpu_decode_attention", [str(SOURCE)], extra_cflags=CFLAGS,
                                    build_directory=str(_build_directory()), verbose=False)
        except Exception as exc:  # no compiler, no ninja, no headers: the reference path still works
            warnings.warn(f"native CPU attention unavailable ({type(exc).__name__}: {str(exc)[:200]}); "
                          "using the torch reference", stacklevel=3)
    return _state["module"]


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
