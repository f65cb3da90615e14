"""GPTQ: hand-computed words, v1/v2 zero points, act order, sharding, an independent numpy decoder, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file, save_file

from quantkit import __version__
from quantkit.errors import QuantkitError
from quantkit.formats import gptq
from quantkit.formats.quantized import QuantizedWeight
from tests.quantkit.formats.test_autoawq import fp16_qweight
from tests.quantkit.formats.test_compressed_tensors import assert_same_qweight

PERMUTED = (torch.randperm(128, generator=torch.Generator().manual_seed(7)) // 32).to(torch.int32)


def write(tmp_path, quantized: dict, require_v1: bool = False) -> dict:
    first = next(iter(quantized.values()))
    desc_act = first.g_idx is not None
    cfg = gptq.quantization_config(first.bits, first.group_size, first.symmetric, desc_act, require_v1=require_v1)
    gptq.write_checkpoint(tmp_path, {"model_type": "llama"}, {"model.norm.weight": torch.ones(4)}, quantized, cfg)
    return cfg


def decode_by_hand(raw: dict[str, np.ndarray], bits: int, v1: bool) -> np.ndarray:
    """W[n, k] from the raw file, written straight from formats.md §0/§2.1 ([in, out] orientation)."""
    per_word, mask = 32 // bits, (1 << bits) - 1
    qweight, qzeros = raw["qweight"].view(np.uint32).astype(np.int64), raw["qzeros"].view(np.uint32).astype(np.int64)
    in_f, out_f = qweight.shape[0] * per_word, qweight.shape[1]
    k, n = np.arange(in_f)[:, None], np.arange(out_f)[None, :]
    q = (qweight[k // per_word, n] >> (bits * (k % per_word))) & mask
    g = raw["g_idx"].astype(np.int64)[:, None]
    z = ((qzeros[g, n // per_word] >> (bits * (n % per_word))) & mask) + (1 if v1 else 0)
    assert raw["scales"].dtype == np.float16
    w_kn = (q - z).astype(np.float32) * raw["scales"].astype(np.float32)[g, n]
    return w_kn.T


@pytest.mark.parametrize("bits,values,word", [
    (4, [1, 2, 3, 4, 5, 6, 7, 8], 0x87654321),
    (8, [1, 2, 3, 4], 0x04030201),
    (2, [0, 1, 2, 3] * 4, 0xE4E4E4E4),
])
def test_hand_computed_qweight(bits, values, word):
    # Every output column n holds `values` down its input rows k: packed along `in`, LSB first.
    per_word = 32 // bits
    qw = QuantizedWeight(q=torch.tensor([values] * per_word, dtype=torch.uint8), scale=torch.ones(per_word, 1),
                         zero=torch.full((per_word, 1), 2 ** (bits - 1), dtype=torch.int32), bits=bits,
                         group_size=-1, symmetric=True)
    tensors = gptq.weight_tensors(qw, gptq.V1)
    signed = word - 2**32 if word >= 2**31 else word
    assert tensors["qweight"].tolist() == [[signed] * per_word]
    assert tensors["g_idx"].tolist() == [0] * per_word


@pytest.mark.parametrize("bits,word", [(4, 0x77777777), (8, 0x7F7F7F7F), (2, 0x55555555)])
def test_symmetric_v1_zero_words(bits, word):
    tensors = gptq.weight_tensors(fp16_qweight(32, 64, 32, True, bits=bits), gptq.V1)
    assert set(tensors["qzeros"].flatten().tolist()) == {word}


def test_asymmetric_v2_zeros_are_stored_as_is():
    qw = fp16_qweight(8, 32, -1, False)
    qw.zero = torch.arange(8, dtype=torch.int32)[:, None]
    assert gptq.weight_tensors(qw, gptq.V2)["qzeros"].tolist() == [[0x76543210]]
    qw.zero += 1
    assert gptq.weight_tensors(qw, gptq.V1)["qzeros"].tolist() == [[0x76543210]]  # v1: z - 1


CASES = [(bits, group_size, symmetric, g_idx) for bits in (2, 4, 8) for group_size in (32, -1)
         for symmetric in (True, False) for g_idx in (None,)] + [
    (4, 32, True, PERMUTED), (4, 32, False, PERMUTED), (8, 32, True, PERMUTED)]


@pytest.mark.parametrize("bits,group_size,symmetric,g_idx", CASES,
                         ids=[f"{b}bit-g{g}-{'sym' if s else 'asym'}{'-actorder' if i is not None else ''}"
                              for b, g, s, i in CASES])
def test_checkpoint_round_trip_and_independent_decoder(tmp_path, bits, group_size, symmetric, g_idx):
    quantized = {"model.layers.0.mlp.up_proj": fp16_qweight(32, 128, group_size, symmetric, 1, bits, g_idx),
                 "model.layers.0.self_attn.o_proj": fp16_qweight(64, 128, group_size, symmetric, 2, bits, g_idx)}
    cfg = write(tmp_path, quantized)
    assert cfg["checkpoint_format"] == ("gptq" if symmetric else "gptq_v2")
    assert cfg["desc_act"] is (g_idx is not None) and cfg["sym"] is symmetric
    raw = load_numpy(str(tmp_path / "model.safetensors"))
    for module, qw in quantized.items():
        out_f, in_f = qw.shape
        n_groups = 1 if group_size == -1 else in_f // group_size
        assert raw[f"{module}.qweight"].shape == (in_f * bits // 32, out_f)
        assert raw[f"{module}.qzeros"].shape == (n_groups, out_f * bits // 32)
        assert raw[f"{module}.scales"].shape == (n_groups, out_f)
        assert raw[f"{module}.g_idx"].dtype == np.int32 and raw[f"{module}.g_idx"].shape == (in_f,)
        parts = {k: raw[f"{module}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")}
        assert np.array_equal(decode_by_hand(parts, bits, v1=symmetric), qw.dequantize().numpy())
    config, dense, back = gptq.read_checkpoint(tmp_path)
    assert config["quantization_config"] == cfg
    assert json.loads((tmp_path / "quantize_config.json").read_text()) == cfg
    assert list(dense) == ["model.norm.weight"]
    for module, qw in quantized.items():
        assert_same_qweight(back[module], qw)


def test_quantization_config_fields():
    cfg = gptq.quantization_config(4, 128, True, False)
    assert cfg == {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
                   "checkpoint_format": "gptq", "pack_dtype": "int32", "static_groups": False,
                   "true_sequential": True, "lm_head": False, "damp_percent": 0.01,
                   "meta": {"quantizer": [f"quantkit:{__version__}"]}}
    assert gptq.weight_scheme(cfg) == (4, 128, True, "gptq")
    assert gptq.weight_scheme({"w_bit": 8, "q_group_size": 32, "sym": False, "format": "gptq_v2"}) == (
        8, 32, False, "gptq_v2")
    with pytest.raises(QuantkitError, match="asymmetric.*'gptq' \\(v1\\)"):
        gptq.quantization_config(4, 128, False, False, require_v1=True)


@pytest.mark.parametrize("change,match", [
    ({"bits": 3}, "bits 3"), ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
    ({"quant_method": "awq"}, "quant_method is 'awq'"), ({"group_size": 0}, "group_size 0"),
    ({"dynamic": {"+:.*down_proj": {"bits": 8}}}, "dynamic"),
])
def test_unsupported_configs_are_refused(change, match):
    with pytest.raises(QuantkitError, match=match):
        gptq.weight_scheme({**gptq.quantization_config(4, 128, True, False), **change})


def test_v1_cannot_hold_a_zero_point_of_zero(tmp_path):
    qw = fp16_qweight(8, 32, -1, False)
    qw.zero[0, 0] = 0
    with pytest.raises(QuantkitError, match="layer.z: zero point 0 cannot be stored"):
        gptq.weight_tensors(qw, gptq.V1, where="layer.z")
    qw.zero[0, 0] = 15  # written as v2 (stored 15), then mislabelled v1: reads as 16
    write(tmp_path, {"model.layers.0.q": qw})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["checkpoint_format"] = "gptq"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantkitError, match="model.layers.0.q: qzeros hold 15"):
        gptq.read_checkpoint(tmp_path)


def test_sym_config_with_other_zeros_is_refused(tmp_path):
    write(tmp_path, {"model.layers.0.q": fp16_qweight(8, 32, -1, False)})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"].update(sym=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantkitError, match="says sym but qzeros"):
        gptq.read_checkpoint(tmp_path)


def test_reads_quantize_config_json_and_sharded_index(tmp_path):
    quantized = {f"model.layers.{i}.q": fp16_qweight(16, 64, 32, True, seed=i) for i in range(2)}
    cfg = write(tmp_path, quantized)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    shards = {"model-00001-of-00002.safetensors": [k for k in tensors if ".0." in k],
              "model-00002-of-00002.safetensors": [k for k in tensors if ".0." not in k]}
    for name, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / name))
    index = {"metadata": {}, "weight_map": {k: name for name, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    config, dense, back = gptq.read_checkpoint(tmp_path)
    assert "quantization_config" not in config and cfg["bits"] == 4
    for module, qw in quantized.items():
        assert_same_qweight(back[module], qw)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(QuantkitError, match="index.json: names shard model-00002-of-00002.safetensors"):
        gptq.read_checkpoint(tmp_path)


def test_bad_tensors_name_file_and_module(tmp_path):
    write(tmp_path, {"model.layers.0.q": fp16_qweight(16, 64, 32, True)})
    file = tmp_path / "model.safetensors"
    tensors = load_file(str(file))
    save_file({k: v for k, v in tensors.items() if not k.endswith("scales")}, str(file))
    with pytest.raises(QuantkitError, match=f"{tmp_path}: model.layers.0.q: missing tensors \\['scales'\\]"):
        gptq.read_checkpoint(tmp_path)
    save_file({**tensors, "model.layers.0.q.g_idx": tensors["model.layers.0.q.g_idx"][:3]}, str(file))
    with pytest.raises(QuantkitError, match="model.layers.0.q: g_idx has shape \\(3,\\), expected \\(64,\\)"):
        gptq.read_checkpoint(tmp_path)
    save_file({**tensors, "model.layers.0.q.g_idx": torch.full((64,), 5, dtype=torch.int32)}, str(file))
    with pytest.raises(QuantkitError, match="g_idx values must lie in \\[0, 1\\]"):
        gptq.read_checkpoint(tmp_path)
    file.write_bytes(b"not safetensors")
    with pytest.raises(QuantkitError, match="model.safetensors: not a readable safetensors file"):
        gptq.read_checkpoint(tmp_path)


def test_shapes_and_bits_that_do_not_fit_are_refused():
    with pytest.raises(QuantkitError, match="whole int32 words"):
        gptq.weight_tensors(fp16_qweight(12, 64, 32, True), gptq.V1)
    qw = QuantizedWeight(q=torch.zeros(32, 32, dtype=torch.uint8), scale=torch.ones(32, 1),
                         zero=torch.full((32, 1), 4, dtype=torch.int32), bits=3, group_size=-1, symmetric=True)
    with pytest.raises(QuantkitError, match="not 3"):
        gptq.weight_tensors(qw, gptq.V1)
