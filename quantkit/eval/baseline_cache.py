"""The baseline's side of every metric, cached by (model hash, suite hash) so CI does not recompute FP16
on every run. One directory per key under ``<quantkit cache>/eval-baselines/``, published by rename."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quantkit.eval.lm_tasks import TaskScores
from quantkit.eval.token_metrics import BaselineTokens
from quantkit.models import cache_dir

SCHEMA = 2


@dataclass
class BaselineResults:
    tokens: dict[str, BaselineTokens] = field(default_factory=dict)  # per dataset
    layers: dict[str, torch.Tensor] = field(default_factory=dict)  # layer_metrics.baseline_pass output
    tasks: dict[str, TaskScores] = field(default_factory=dict)  # per task


def model_hash(path: Path) -> str:
    """sha256 over the model directory's files (weights, config, tokenizer), in name order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        digest.update(file.name.encode())
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()


def entry_dir(model_key: str, suite_key: str) -> Path:
    return cache_dir() / "eval-baselines" / f"{model_key[:16]}-{suite_key[:16]}"


def load(model_key: str, suite_key: str) -> BaselineResults | None:
    directory = entry_dir(model_key, suite_key)
    try:
        meta = json.loads((directory / "baseline.json").read_text())
        tensors = load_file(directory / "baseline.safetensors")
    except (OSError, ValueError):
        return None
    if meta.get("schema") != SCHEMA:
        return None
    tokens = {ds: BaselineTokens.from_tensors(tensors, f"tokens.{i}") for i, ds in enumerate(meta["datasets"])}
    layers = {k: v for k, v in tensors.items() if k.startswith("layers.")}
    tasks = {t: TaskScores.from_json(scores) for t, scores in meta["tasks"].items()}
    return BaselineResults(tokens, layers, tasks)


def store(model_key: str, suite_key: str, results: BaselineResults) -> Path:
    directory = entry_dir(model_key, suite_key)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        tensors = dict(results.layers)
        for i, tokens in enumerate(results.tokens.values()):
            tensors.update(tokens.to_tensors(f"tokens.{i}"))
        save_file({k: v.contiguous() for k, v in tensors.items()}, staging / "baseline.safetensors")
        meta = {"schema": SCHEMA, "datasets": list(results.tokens), "tasks": {t: s.to_json() for t, s in results.tasks.items()}}
        (staging / "baseline.json").write_text(json.dumps(meta))
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
