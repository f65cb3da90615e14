"""`quantkit bench quantize-memory` on small random models: real quantize runs, one process per row."""

import io

import torch
from rich.console import Console
from transformers import AutoModelForCausalLM

from quantkit.bench.quantize_memory import build_random_llama, run_bench


def test_the_random_model_is_a_llama_transformers_loads(tmp_path):
    path = build_random_llama(tmp_path / "m", layers=2, hidden=64, intermediate=128, vocab=256, heads=4, kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert model.config.num_hidden_layers == 2 and model.model.layers[1].mlp.down_proj.weight.shape == (64, 128)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_rows_per_depth_with_checkpoint_sizes_and_peak_memory():
    output = io.StringIO()
    rows = run_bench([1, 3], hidden=64, intermediate=128, recipe="rtn-w4a16-g64", max_shard_mb=1, threads=1,
                     console=Console(file=output, width=200))
    assert [r["layers"] for r in rows] == [1, 3]
    assert rows[1]["model_mb"] > rows[0]["model_mb"] and rows[1]["checkpoint_mb"] > rows[0]["checkpoint_mb"]
    # 1 MB shards: the 4 MB embedding and lm_head each get their own shard
    assert all(r["shards"] >= 3 and r["peak_rss_mb"] > 0 for r in rows), rows
    # torch + transformers alone; a tiny model's run may peak near that floor, so no more is asserted of it
    assert all(r["import_floor_mb"] > 100 for r in rows)
    assert "from 1 to 3 layers" in output.getvalue()


def test_a_calibrating_recipe_runs_each_depth_in_memory_and_offloaded():
    output = io.StringIO()
    rows = run_bench([2], hidden=64, intermediate=128, recipe="gptq-w4a16-g64", max_shard_mb=64, threads=1,
                     console=Console(file=output, width=250), num_samples=4, max_seq_len=32, offload=True)
    assert [(r["layers"], r["activations"]) for r in rows] == [(2, "memory"), (2, "disk")]
    # the same model and recipe give the same checkpoint wherever the activations were kept
    assert rows[0]["checkpoint_mb"] == rows[1]["checkpoint_mb"] > 0
    assert "2 layers, activations on disk: peak RSS" in output.getvalue()
    assert "4 x 32 random tokens" in output.getvalue()
