"""EngineConfig: every knob of the runtime in one slotted dataclass, validated on construction."""

from __future__ import annotations

import os
from dataclasses import dataclass

from quantkit.errors import QuantkitError

DTYPES = ("auto", "float16", "bfloat16", "float32")
KV_CACHE_DTYPES = ("auto", "fp8")
DEVICES = ("auto", "cpu", "cuda")
KERNELS = ("auto", "triton", "reference")


@dataclass(slots=True)
class EngineConfig:
    model: str
    dtype: str = "auto"  # compute dtype; "auto": the stored dtype on CUDA, float32 on CPU
    kv_cache_dtype: str = "auto"  # "auto": the compute dtype; "fp8": float8_e4m3fn with per-layer scales
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    kv_cache_memory_gb: float | None = None  # an explicit KV budget; wins over memory_utilization
    memory_utilization: float = 0.9  # share of free device memory (CUDA) or available RAM (CPU)
    num_kv_blocks: int | None = None  # exact block count (tests); wins over both budgets
    enable_prefix_caching: bool = True
    device: str = "auto"
    # "auto": Triton on CUDA, native CPU paths elsewhere; "triton": Triton everywhere (TRITON_INTERPRET=1 on
    # CPU); "reference": the torch reference math. None: QUANTKIT_KERNELS, else "auto".
    kernels: str | None = None
    seed: int = 0

    def __post_init__(self):
        _choice("dtype", self.dtype, DTYPES)
        _choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _choice("device", self.device, DEVICES)
        if self.kernels is None:
            self.kernels = os.environ.get("QUANTKIT_KERNELS", "auto")
        _choice("kernels", self.kernels, KERNELS)
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise QuantkitError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise QuantkitError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise QuantkitError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if not 0 < self.memory_utilization <= 1:
            raise QuantkitError(f"memory_utilization must be in (0, 1], got {self.memory_utilization}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise QuantkitError(f"num_kv_blocks must be >= 2 (block 0 is the null block), got {self.num_kv_blocks}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise QuantkitError(f"{name}={value!r} is not supported", hint=f"use one of: {', '.join(allowed)}")
