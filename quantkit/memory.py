"""Process memory: giving freed heap pages back to the operating system, and how much is available."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path


def release_freed_memory(collect_cycles: bool = True) -> None:
    """Hand freed tensors' pages back to the OS. glibc keeps freed heap pages for reuse, and when tensors of
    changing sizes come and go (a layer's weights, its quantized forms, a checkpoint shard) the heap fragments
    and resident memory ratchets up: on a 32-layer random Llama, quantize grew ~20 MB per layer without this
    and stayed flat with it; an INT4 SmolLM2 loaded by the runtime stays at 732 MiB, not 1,248.

    collect_cycles: run the garbage collector first (~80 ms with transformers imported), for tensors held
    only by reference cycles; tensors dropped by refcount are already free."""
    if collect_cycles:
        gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes: what can be allocated without swapping; None off Linux."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
