"""`quantkit bench quantize-memory`: peak RSS of `quantkit quantize` as a model gets deeper.

The pipeline holds one decoder layer and the writer at most one shard, so peak memory should stay
flat as layers are added, while the checkpoint grows with them. Each row quantizes a random
Llama-shaped model (bf16, one safetensors shard per layer, no hub download) of a given depth in its
own process; an import-floor row shows what torch + transformers + quantkit cost alone.

A recipe that calibrates runs on random token ids; with --offload each depth also runs with the calibration
activations in files on disk (`quantize --offload-activations`), to show what that takes off peak memory.

Run a worker directly:
python -m quantkit.bench.quantize_memory MODE MODEL_DIR OUT_DIR RECIPE MAX_SHARD_BYTES CALIB_DIR|- OFFLOAD_DIR|-
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from quantkit.bench.workers import run_worker


def build_random_llama(out: Path, layers: int, hidden: int, intermediate: int, vocab: int = 32000,
                       heads: int = 16, kv_heads: int = 4) -> Path:
    """A random bf16 Llama written a layer per shard with an index, never whole in memory."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    out.mkdir(parents=True, exist_ok=True)
    LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=False,
                architectures=["LlamaForCausalLM"], torch_dtype="bfloat16").to_json_file(out / "config.json")
    kv = hidden // heads * kv_heads
    generator = torch.Generator().manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    shards = {"model-outside.safetensors": {"model.embed_tokens.weight": random(vocab, hidden),
                                            "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                                            "lm_head.weight": random(vocab, hidden)}}
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (intermediate, hidden),
              "mlp.up_proj": (intermediate, hidden), "mlp.down_proj": (hidden, intermediate)}
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, out / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    for index in range(layers):
        prefix, name = f"model.layers.{index}", f"model-layer-{index:05d}.safetensors"
        tensors = {f"{prefix}.{module}.weight": random(*shape) for module, shape in shapes.items()}
        tensors |= {f"{prefix}.{norm}.weight": torch.ones(hidden, dtype=torch.bfloat16)
                    for norm in ("input_layernorm", "post_attention_layernorm")}
        save_file(tensors, out / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def run_bench(depths: list[int], hidden: int, intermediate: int, recipe: str, max_shard_mb: int, threads: int,
              console, num_samples: int = 32, max_seq_len: int = 512, offload: bool = False) -> list[dict]:
    """A recipe that calibrates gets num_samples random token sequences of max_seq_len; with offload each depth
    runs a second time with the calibration activations in files (--offload-activations)."""
    from rich.table import Table

    from quantkit.recipes import load_recipe

    calibrated = load_recipe(recipe).needs_calibration
    placements = ("memory", "disk") if offload and calibrated else ("memory",)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        calib = _random_calibration(root / "calib", num_samples, max_seq_len) if calibrated else None
        spill = root / "spill"  # where the "disk" rows offload activations
        spill.mkdir()
        floor = _worker_process("import-floor", root, root, recipe, 0, threads)
        for layers in depths:
            model = build_random_llama(root / f"model-{layers}", layers, hidden, intermediate)
            for placement in placements:
                out = root / f"ckpt-{layers}-{placement}"
                row = _worker_process("quantize", model, out, recipe, max_shard_mb * 1024**2, threads, calib,
                                      spill if placement == "disk" else None)
                row.update(layers=layers, activations=placement, model_mb=_size_mb(model),
                           checkpoint_mb=_size_mb(out), shards=len(list(out.glob("*.safetensors"))))
                rows.append(row)
                _empty(out)
            _empty(model)  # keep the disk footprint to one depth at a time
    calibration = f"{num_samples} x {max_seq_len} random tokens" if calibrated else "no calibration"
    table = Table(title=f"quantize peak memory vs depth: random Llama, hidden {hidden}, intermediate {intermediate}, "
                        f"{recipe}, {calibration}, shards <= {max_shard_mb} MB, {threads} thread(s); import floor "
                        f"{floor['peak_rss_mb']:.0f} MB")
    for column in ("layers", "activations", "model MB (bf16)", "checkpoint MB", "shards", "wall s", "peak RSS MB",
                   "RSS above floor MB"):
        table.add_column(column)
    for row in rows:
        row["import_floor_mb"] = floor["peak_rss_mb"]
        row["above_floor_mb"] = round(row["peak_rss_mb"] - floor["peak_rss_mb"], 1)
        table.add_row(str(row["layers"]), row["activations"], f"{row['model_mb']:.0f}", f"{row['checkpoint_mb']:.0f}",
                      str(row["shards"]), f"{row['wall_s']:.1f}", f"{row['peak_rss_mb']:.0f}",
                      f"{row['above_floor_mb']:.0f}")
    console.print(table)
    in_memory = [r for r in rows if r["activations"] == "memory"]
    if len(in_memory) > 1:
        first, last = in_memory[0], in_memory[-1]
        console.print(f"from {first['layers']} to {last['layers']} layers: checkpoint "
                      f"+{last['checkpoint_mb'] - first['checkpoint_mb']:.0f} MB, peak RSS "
                      f"{last['peak_rss_mb'] - first['peak_rss_mb']:+.0f} MB", highlight=False)
    for memory, disk in zip(in_memory, [r for r in rows if r["activations"] == "disk"]):
        console.print(f"{memory['layers']} layers, activations on disk: peak RSS "
                      f"{disk['peak_rss_mb'] - memory['peak_rss_mb']:+.0f} MB, wall "
                      f"{disk['wall_s'] / memory['wall_s']:.2f}x", highlight=False)
    console.print(json.dumps({"import_floor_mb": floor["peak_rss_mb"], "rows": rows}))
    return rows


def _random_calibration(out: Path, num_samples: int, tokens: int, vocab: int = 32000) -> Path:
    """A `quantkit calibrate`-shaped folder of random token ids (the random model has no tokenizer)."""
    from quantkit.calibration.run import save_samples

    out.mkdir()
    generator = torch.Generator().manual_seed(0)
    save_samples(torch.randint(0, vocab, (num_samples, tokens), generator=generator).tolist(),
                 out / "samples.safetensors")
    (out / "manifest.json").write_text(json.dumps({"dataset": {"ref": f"random token ids < {vocab}"}}))
    return out


def _empty(directory: Path) -> None:
    for file in directory.iterdir():
        file.unlink()


def _size_mb(directory: Path) -> float:
    return round(sum(f.stat().st_size for f in directory.iterdir() if f.is_file()) / 1024**2, 1)


def _worker_process(mode: str, model: Path, out: Path, recipe: str, max_shard_bytes: int, threads: int,
                    calib: Path | None = None, offload: Path | None = None) -> dict:
    return run_worker("quantkit.bench.quantize_memory",
                      [mode, model, out, recipe, max_shard_bytes, calib or "-", offload or "-"], threads)


def _worker(mode: str, model: Path, out: Path, recipe: str, max_shard_bytes: int, calib: Path | None,
            offload: Path | None) -> dict:
    from quantkit.calibration.run import peak_rss_mb
    from quantkit.quantize.run import QuantizeOptions, quantize

    started = time.perf_counter()
    if mode == "quantize":
        quantize(QuantizeOptions(model=str(model), recipe=recipe, out=out, calib=calib,
                                 max_shard_bytes=max_shard_bytes, offload_dir=offload))
    return {"mode": mode, "wall_s": round(time.perf_counter() - started, 2), "peak_rss_mb": round(peak_rss_mb(), 1)}


if __name__ == "__main__":
    mode, model_dir, out_dir, recipe_name, shard_bytes, calib_dir, offload_dir = sys.argv[1:8]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(_worker(mode, Path(model_dir), Path(out_dir), recipe_name, int(shard_bytes),
                             None if calib_dir == "-" else Path(calib_dir),
                             None if offload_dir == "-" else Path(offload_dir))))
