"""Native CPU loops of the quantization algorithms (native.cpp): GPTQ's sequential column loop and the MSE
grid search, which in torch's form spend their time in per-column and per-candidate tensor ops over memory.
Built on first use with exact float32 rounding (runtime/kernels/cpu_extension.py); the torch forms remain
the reference and run where the kernel cannot be built."""

from __future__ import annotations

from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("native.cpp")
SCALE_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def module():
    """The compiled module, or None where it cannot be built (the callers then run their torch form)."""
    from quantkit.runtime.kernels import cpu_extension  # here: importing the runtime package loads the engine

    return cpu_extension.load(SOURCE, cpu_extension.EXACT_CFLAGS)
