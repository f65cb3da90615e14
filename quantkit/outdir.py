"""Atomic output directories: build in a hidden sibling, publish by rename, leave nothing on failure."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quantkit.errors import QuantkitError


def check_output_dir(target: Path, overwrite: bool) -> None:
    """Fail early, before any expensive work, when the output cannot be written."""
    if target.exists() and not target.is_dir():
        raise QuantkitError(f"output path {target} exists and is a file", hint="choose a directory path for --out")
    if target.exists() and not overwrite:
        raise QuantkitError(f"output directory {target} already exists", hint="pass --overwrite to replace it")


@contextmanager
def atomic_output_dir(target: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a staging directory; on success it becomes ``target``, on any error or interrupt it is removed."""
    check_output_dir(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes 0700; the result should look like mkdir's
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.rename(target, old)
        os.rename(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, target)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
