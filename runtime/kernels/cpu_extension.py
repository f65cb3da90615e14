"""Builds and loads the runtime's native CPU kernels (C++ sources beside this file) with torch's C++ extension
loader: g++ and ninja, cached under quantkit's cache, once per source, flags, CPU, torch and Python version.
A kernel that cannot be built here (no compiler, no headers) warns once and returns None; its caller keeps
a torch path."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

log = logging.getLogger("quantkit.runtime")
CFLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp-simd")
# For kernels whose results must equal torch's float32 ops bit for bit: every operation rounded, no FMA contraction.
EXACT_CFLAGS = ("-O3", "-march=native", "-ffp-contract=off")
STALE_LOCK_S = 600  # a build takes about a minute; an older lock file was left by a build that was killed


def _cpu_features() -> str:
    """-march=native code runs only where it was built: the CPU's flags are part of the cache key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def build_directory(source: Path, cflags: tuple[str, ...] = CFLAGS) -> Path:
    """One directory per build key under quantkit's cache. torch's loader waits forever on the lock file of a
    build that was killed midway (seen: a CI run hung), so a stale lock goes."""
    from quantkit.models import cache_dir

    key = hashlib.sha256(source.read_bytes() + " ".join(cflags).encode() + _cpu_features().encode()
                         + torch.__version__.encode() + sys.version.encode()).hexdigest()[:16]
    directory = cache_dir() / "extensions" / f"{source.stem}-{key}"
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        log.warning("removing a stale build lock %s", lock)
        lock.unlink(missing_ok=True)
    return directory


def _source_copy(source: Path, directory: Path) -> Path:
    """The source as built: a copy inside its build directory. torch's build file names the source by its path,
    so building another checkout's identical source from where it lies would rebuild (~45 s) whenever the
    checkout changes; the copy's path is the same for every checkout of the same source."""
    copy = directory / source.name
    text = source.read_bytes()
    if not copy.exists() or copy.read_bytes() != text:
        copy.write_bytes(text)
    return copy


@functools.cache
def load(source: Path, cflags: tuple[str, ...] = CFLAGS):
    """The compiled module for source (built on first use, ~45 s; later processes load it), or None.
    Once per process: a failed build warns once and is not retried."""
    try:
        from torch.utils.cpp_extension import load as load_extension

        # ninja may come from this venv's bin, which is not on PATH when the venv is not activated.
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        log.info("building the native CPU kernel %s (first use only)", source.name)
        directory = build_directory(source, cflags)
        return load_extension(f"quantkit_{source.stem}", [str(_source_copy(source, directory))],
                              extra_cflags=list(cflags), build_directory=str(directory), verbose=False)
    except Exception as exc:  # no compiler, no ninja, no headers: the torch path still works
        warnings.warn(f"native CPU kernel {source.name} unavailable ({type(exc).__name__}: {str(exc)[:200]}); "
                      "using the torch path", stacklevel=3)
        return None
