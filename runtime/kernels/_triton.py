"""What the Triton kernels share: whether Triton is there, whether it runs interpreted, dot operand dtypes.

Importing this module never imports triton; the kernel modules do, and only dispatch imports them, lazily.
"""

from __future__ import annotations

import importlib.util
import os

import torch


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """TRITON_INTERPRET=1: kernels run on CPU tensors in numpy (slow, for tests)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def dot_dtype(dtype: torch.dtype):
    """The tl dtype tl.dot takes its operands in for activations of `dtype`. The interpreter (triton 3.9)
    holds bfloat16 as raw uint16 and multiplies the bit patterns in tl.dot, so interpreted bf16 dots run in
    float32 instead; compiled kernels use bf16 tensor cores."""
    import triton.language as tl

    if dtype == torch.bfloat16 and interpreting():
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """float32 operands multiply in full precision (tf32 would cost ~3 digits against the float32 reference)."""
    return "ieee" if dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting()) else "tf32"


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)
