"""`quantkit bench calibrate`: the layer-by-layer statistics pass versus loading the whole model and
running every sample through it at once, on the same token chunks, each in its own process so that
peak RSS is its own. A third row, the import floor, shows what torch + transformers cost alone.

Run a worker directly: python -m quantkit.bench.calibrate MODE MODEL_DIR TOKENS_FILE THREADS
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from quantkit.bench.workers import run_worker

MODES = ("import-floor", "layerwise", "whole-model")


def run_bench(model: str, dataset: str, num_samples: int, max_seq_len: int, threads: int, console) -> list[dict]:
    from rich.table import Table
    from safetensors.torch import save_file

    from quantkit.data.readers import read_records
    from quantkit.data.samples import draw_samples
    from quantkit.errors import QuantkitError
    from quantkit.models import load_tokenizer, resolve_model

    path = resolve_model(model)
    # Packed chunks are all max_seq_len long, so the whole-model batch needs no padding.
    samples = draw_samples(read_records(dataset), load_tokenizer(path), num_samples, max_seq_len, pack=True)
    if len(samples.input_ids) < num_samples:
        raise QuantkitError(f"dataset {dataset} has too few tokens for {num_samples} x {max_seq_len}")
    chunks = torch.tensor(samples.input_ids, dtype=torch.int32)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tokens_file = Path(tmp) / "tokens.safetensors"
        save_file({"input_ids": chunks}, tokens_file)
        _worker_process("layerwise", path, tokens_file, threads, num_samples=2)  # warm-up: file cache, imports
        for mode in MODES:
            rows.append(_worker_process(mode, path, tokens_file, threads))
    base = rows[2]
    table = Table(title=f"calibrate statistics pass: {model}, {len(chunks)} x {chunks.shape[1]} tokens, "
                        f"{threads} thread(s)")
    for column in ("mode", "wall s", "peak RSS MB", "RSS vs whole-model", "wall vs whole-model"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["mode"], f"{row['wall_s']:.1f}", f"{row['peak_rss_mb']:.0f}",
                      f"{row['peak_rss_mb'] / base['peak_rss_mb']:.2f}x", f"{row['wall_s'] / base['wall_s']:.2f}x")
    console.print(table)
    console.print(json.dumps(rows))
    return rows


def _worker_process(mode: str, path: Path, tokens_file: Path, threads: int, num_samples: int = 0) -> dict:
    return run_worker("quantkit.bench.calibrate", [mode, path, tokens_file, threads, num_samples], threads)


def _worker(mode: str, path: Path, tokens_file: Path, threads: int, num_samples: int) -> dict:
    from safetensors.torch import load_file

    from quantkit.calibration.run import peak_rss_mb

    torch.set_num_threads(threads)
    chunks = load_file(tokens_file)["input_ids"].long()
    if num_samples:
        chunks = chunks[:num_samples]
    started = time.perf_counter()
    if mode == "layerwise":
        from quantkit.calibration.layerwise import LayerwiseModel
        from quantkit.calibration.run import collect_statistics

        collect_statistics(LayerwiseModel(path), chunks.tolist())
    elif mode == "whole-model":
        _whole_model_statistics(path, chunks)
    return {"mode": mode, "wall_s": round(time.perf_counter() - started, 2), "peak_rss_mb": round(peak_rss_mb(), 1)}


def _whole_model_statistics(path: Path, chunks: torch.Tensor) -> None:
    """The naive way: the full fp32 model in memory, every sample in one batch, the same observers."""
    from transformers import AutoModelForCausalLM

    from quantkit.calibration.observers import LayerObserver
    from quantkit.models import head_dim

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = model.config
    positions = torch.arange(chunks.shape[1]).unsqueeze(0)
    cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions)
    observers = []
    for i, layer in enumerate(model.model.layers):
        observer = LayerObserver(layer, f"model.layers.{i}", config.num_key_value_heads, head_dim(config))
        observer.set_rotary(cos, sin)
        observers.append(observer)
    with torch.no_grad():
        model.model(chunks)  # the decoder only: calibration does not need logits


if __name__ == "__main__":
    mode, model_dir, tokens, n_threads, n_samples = sys.argv[1:6]
    print(json.dumps(_worker(mode, Path(model_dir), Path(tokens), int(n_threads), int(n_samples))))
