"""QuantizedDirWriter: tensors streamed into size-bounded safetensors shards with the index loaders read."""

import json

import pytest
import torch
from safetensors import safe_open

from quantkit.formats import compressed_tensors as ct
from quantkit.formats.common import INDEX_FILE, WEIGHTS_FILE, QuantizedDirWriter, load_safetensors
from tests.quantkit.formats.test_compressed_tensors import random_qweight

QCONFIG = ct.quantization_config(4, 32, False, actorder=None, ignore=["lm_head"])


def layer_tensors(index: int) -> tuple[dict, dict]:
    """One fake decoder layer: a dense norm (256 B) and a quantized 16x64 linear (~0.7 KB on disk)."""
    prefix = f"model.layers.{index}"
    return ({f"{prefix}.input_layernorm.weight": torch.full((64,), float(index))},
            {f"{prefix}.mlp.down_proj": random_qweight(16, 64, 4, 32, False, seed=index)})


def write_layers(out, layers: int, max_shard_bytes: int, tied: bool = False, extra: dict | None = None):
    writer = QuantizedDirWriter(out, tie_word_embeddings=tied, max_shard_bytes=max_shard_bytes)
    expected = {}
    for index in range(layers):
        dense, quantized = layer_tensors(index)
        writer.add_dense(dense)
        writer.add_modules(ct.module_tensors(quantized, QCONFIG, torch.float32))
        expected |= dense
        for module, tensors in ct.module_tensors(quantized, QCONFIG, torch.float32):
            expected |= {f"{module}.{k}": v for k, v in tensors.items()}
    if extra:
        writer.add_dense(extra)
    writer.finish({"model_type": "llama"}, QCONFIG)
    return expected


def test_tensors_past_the_shard_size_go_to_numbered_shards_that_the_index_lists(tmp_path):
    expected = write_layers(tmp_path, layers=6, max_shard_bytes=2048)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) >= 3 and not (tmp_path / WEIGHTS_FILE).exists()
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    assert sorted(set(index["weight_map"].values())) == shards and set(index["weight_map"]) == set(expected)
    total = 0
    for shard in shards:
        with safe_open(tmp_path / shard, framework="pt") as f:
            sizes = [f.get_tensor(n).numel() * f.get_tensor(n).element_size() for n in f.keys()]
            # a shard closes before the tensor that would take it past the limit (one tensor may exceed it alone)
            assert sum(sizes) <= 2048 or len(sizes) == 1
            assert {n for n in f.keys()} == {n for n, s in index["weight_map"].items() if s == shard}
            total += sum(sizes)
    assert index["metadata"]["total_size"] == total
    loaded = load_safetensors(tmp_path)
    assert set(loaded) == set(expected) and all(torch.equal(loaded[k], v) for k, v in expected.items())
    assert json.loads((tmp_path / "config.json").read_text())["quantization_config"] == QCONFIG
    assert not list(tmp_path.glob(".*")), "no temporary shard names left behind"


def test_a_checkpoint_under_the_shard_size_is_one_file_and_a_tied_lm_head_is_left_to_the_loader(tmp_path):
    expected = write_layers(tmp_path, layers=2, max_shard_bytes=1 << 20, tied=True,
                            extra={"lm_head.weight": torch.ones(4, 4)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", WEIGHTS_FILE]
    assert set(load_safetensors(tmp_path)) == set(expected)


def test_a_linear_cannot_be_both_dense_and_quantized_in_either_order(tmp_path):
    dense, quantized = layer_tensors(0)
    both = {"model.layers.0.mlp.down_proj.weight": torch.zeros(16, 64)}
    writer = QuantizedDirWriter(tmp_path / "a", tie_word_embeddings=False)
    writer.add_dense(both)
    with pytest.raises(ValueError, match="both dense and quantized"):
        writer.add_modules(ct.module_tensors(quantized, QCONFIG, torch.float32))
    writer = QuantizedDirWriter(tmp_path / "b", tie_word_embeddings=False)
    writer.add_modules(ct.module_tensors(quantized, QCONFIG, torch.float32))
    with pytest.raises(ValueError, match="both dense and quantized"):
        writer.add_dense(both)
