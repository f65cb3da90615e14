"""Run one benchmark row in its own Python process, so its peak RSS is its own and every row gets the
same pinned thread count. A worker module prints its result as one JSON line, last."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def pinned_env(threads: int) -> dict[str, str]:
    return os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def run_worker(module: str, args: list[str], threads: int, python: str = sys.executable) -> dict:
    # A peer's script runs with -P: its own directory (quantkit/bench, whose kernels.py or serve.py would shadow
    # packages of the same name that the peer imports) stays off sys.path.
    cmd = [python, "-m", module, *map(str, args)] if python == sys.executable else \
        [python, "-P", module, *map(str, args)]
    done = subprocess.run(cmd, env=pinned_env(threads), capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"benchmark worker {' '.join(cmd[:4])} failed (exit {done.returncode}):\n{tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])
