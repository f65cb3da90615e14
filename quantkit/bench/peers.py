"""Peers for `quantkit bench quantize --peers`: llm-compressor quantizes the same model on the same
calibration tokens, in its own virtual environment, so that its dependencies (transformers, compressed-tensors
pins) never meet ours. It is never a quantkit dependency: the venv is made on first use under the cache.

The worker, peer_llmcompressor.py, runs under the peer venv's python and imports nothing from quantkit.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from quantkit.bench.workers import run_worker
from quantkit.models import cache_dir

LLMCOMPRESSOR = "llmcompressor==0.14.0.1"
PEER_NAME = "llm-compressor 0.14.0.1"
# An exact pin picks the CPU wheel on disk; a range would pull a multi-GB CUDA build from the index.
TORCH = "torch==2.13.0"
WORKER = Path(__file__).with_name("peer_llmcompressor.py")
METHODS = ("gptq", "awq")


def peer_python() -> Path:
    """The llm-compressor venv's python, creating the venv on first use (idempotent via a stamp file)."""
    venv = cache_dir() / "peers" / "llmcompressor"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    # The stamp names what was installed, so changing a pin rebuilds the venv's packages.
    wanted = f"{TORCH}\n{LLMCOMPRESSOR}\n"
    if stamp.is_file() and stamp.read_text() == wanted and python.exists():
        return python
    if not python.exists():
        # `python3 -m venv` bases the new venv on the base interpreter even when run from inside another venv.
        _step(f"creating venv {venv}", ["python3", "-m", "venv", str(venv)])
    _step(f"installing {TORCH} (CPU wheel)", [str(python), "-m", "pip", "install", "-q", TORCH])
    _step(f"installing {LLMCOMPRESSOR}", [str(python), "-m", "pip", "install", "-q", LLMCOMPRESSOR])
    stamp.write_text(wanted)
    return python


def _step(message: str, cmd: list[str]) -> None:
    print(f"peers: {message}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd[:5])} failed (exit {done.returncode}):\n{tail}")


def run_llmcompressor(method: str, model_dir: Path, calib_dir: Path, out_dir: Path, threads: int) -> dict:
    """Quantize model_dir with llm-compressor (GPTQ W4A16 g64 symmetric, or AWQ W4A16_ASYM g64) on the
    calibration tokens in calib_dir/samples.safetensors; the compressed-tensors checkpoint goes to out_dir."""
    if method not in METHODS:
        raise ValueError(f"unknown peer method {method!r}; expected one of {', '.join(METHODS)}")
    python = peer_python()
    args = [method, model_dir, calib_dir, out_dir, threads]
    result = run_worker(str(WORKER), args, threads, python=str(python))
    return {
        "peer": PEER_NAME,
        "method": method,
        "wall_s": result["wall_s"],
        "peak_rss_mb": result["peak_rss_mb"],
        "path": str(out_dir),
    }
