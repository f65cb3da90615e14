"""AutoAWQ GEMM: hand-computed words, round trips, an independent numpy decoder, and user errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as load_numpy

from quantkit.errors import QuantkitError
from quantkit.formats import autoawq as awq
from quantkit.formats.quantized import QuantizedWeight
from tests.quantkit.formats.test_compressed_tensors import assert_same_qweight, random_qweight

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # from reference/formats.md §1.1, not from the module


def fp16_qweight(out_f: int, in_f: int, group_size: int, symmetric: bool, seed: int = 0, bits: int = 4,
                 g_idx: torch.Tensor | None = None) -> QuantizedWeight:
    """random_qweight with scales a fp16 format can hold exactly."""
    qw = random_qweight(out_f, in_f, bits, group_size, symmetric, seed=seed, g_idx=g_idx)
    qw.scale = qw.scale.half().float()
    return qw


def write(tmp_path, quantized: dict, group_size: int) -> dict:
    cfg = awq.quantization_config(group_size, ["lm_head"])
    awq.write_checkpoint(tmp_path, {"model_type": "llama"}, {"model.norm.weight": torch.ones(4)}, quantized, cfg)
    return cfg


def decode_by_hand(raw: dict[str, np.ndarray], group_size: int) -> np.ndarray:
    """W[n, k] from the raw file, written straight from formats.md §0/§1.1 (dequant is [in, out], transposed)."""
    qweight = raw["qweight"].view(np.uint32)
    in_f, words = qweight.shape
    out_f = 8 * words

    def unpack(packed: np.ndarray) -> np.ndarray:
        values = np.zeros((packed.shape[0], 8 * packed.shape[1]), dtype=np.int64)
        for j in range(packed.shape[1]):
            for i in range(8):
                values[:, 8 * j + AWQ_ORDER[i]] = (packed[:, j] >> (4 * i)) & 0xF
        return values

    q, z = unpack(qweight), unpack(raw["qzeros"].view(np.uint32))
    size = in_f if group_size == -1 else group_size
    g = np.arange(in_f) // size
    assert raw["scales"].dtype == np.float16 and raw["scales"].shape == (in_f // size, out_f)
    w_kn = (q - z[g, :]).astype(np.float32) * raw["scales"].astype(np.float32)[g, :]
    return w_kn.T


def test_hand_computed_words():
    # Column n of the one input row holds q = n + 1 and zero = 15 - n. Nibble i holds column ORDER[i]:
    # q nibbles 1,3,5,7,2,4,6,8 -> 0x86427531; zero nibbles 15,13,11,9,14,12,10,8 -> 0x8ACE9BDF.
    qw = QuantizedWeight(q=torch.arange(1, 9, dtype=torch.uint8)[:, None], scale=torch.full((8, 1), 0.5),
                         zero=torch.arange(15, 7, -1, dtype=torch.int32)[:, None], bits=4, group_size=-1,
                         symmetric=False)
    tensors = awq.weight_tensors(qw)
    assert tensors["qweight"].tolist() == [[0x86427531 - 2**32]]
    assert tensors["qzeros"].tolist() == [[0x8ACE9BDF - 2**32]]
    assert tensors["scales"].dtype == torch.float16 and tensors["scales"].shape == (1, 8)
    assert awq.pack_awq(torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])).item() == 0x75316420


@pytest.mark.parametrize("group_size", [32, 64, -1])
@pytest.mark.parametrize("symmetric", [True, False])
def test_checkpoint_round_trip_and_independent_decoder(tmp_path, group_size, symmetric):
    quantized = {"model.layers.0.mlp.up_proj": fp16_qweight(24, 128, group_size, symmetric, seed=1),
                 "model.layers.0.mlp.down_proj": fp16_qweight(128, 64, group_size, symmetric, seed=2)}
    cfg = write(tmp_path, quantized, group_size)
    raw = load_numpy(str(tmp_path / "model.safetensors"))
    for module, qw in quantized.items():
        out_f, in_f = qw.shape
        size = in_f if group_size == -1 else group_size
        assert raw[f"{module}.qweight"].shape == (in_f, out_f // 8) and raw[f"{module}.qweight"].dtype == np.int32
        assert raw[f"{module}.qzeros"].shape == (in_f // size, out_f // 8)
        parts = {k: raw[f"{module}.{k}"] for k in ("qweight", "qzeros", "scales")}
        assert np.array_equal(decode_by_hand(parts, group_size), qw.dequantize().numpy())
    config, dense, back = awq.read_checkpoint(tmp_path)
    assert config["quantization_config"] == cfg == {
        "quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": "gemm",
        "modules_to_not_convert": ["lm_head"]}
    assert list(dense) == ["model.norm.weight"]
    for module, qw in quantized.items():
        assert_same_qweight(back[module], qw)  # symmetric comes back symmetric: every zero is 8


def test_symmetric_is_written_with_zeros_of_eight():
    tensors = awq.weight_tensors(fp16_qweight(8, 32, 32, True))
    assert tensors["qzeros"].tolist() == [[0x88888888 - 2**32]]
    assert awq.read_weight(tensors, 32).symmetric is False  # one layer alone cannot tell


def test_trivial_g_idx_is_accepted_and_permuted_refused():
    awq.weight_tensors(fp16_qweight(8, 64, 32, False, g_idx=(torch.arange(64) // 32).int()))
    permuted = fp16_qweight(8, 64, 32, False, g_idx=torch.tensor([1, 0] * 32, dtype=torch.int32))
    with pytest.raises(QuantkitError, match="layer.x: act-order.*no g_idx"):
        awq.weight_tensors(permuted, where="layer.x")


@pytest.mark.parametrize("bits", [3, 8])
def test_only_four_bits(tmp_path, bits):
    qw = fp16_qweight(8, 64, 32, False, bits=bits) if bits != 3 else QuantizedWeight(
        q=torch.zeros(8, 64, dtype=torch.uint8), scale=torch.ones(8, 2), zero=torch.zeros(8, 2, dtype=torch.int32),
        bits=3, group_size=32, symmetric=False)
    with pytest.raises(QuantkitError, match=f"model.layers.0.q: .*4-bit weights only, not {bits}-bit"):
        write(tmp_path, {"model.layers.0.q": qw}, 32)
    cfg = {**awq.quantization_config(32), "bits": bits}
    with pytest.raises(QuantkitError, match="4-bit only"):
        awq.weight_scheme(cfg)


def test_shapes_that_do_not_fit_are_refused():
    with pytest.raises(QuantkitError, match="out % 8"):
        awq.weight_tensors(fp16_qweight(12, 64, 32, False))
    with pytest.raises(QuantkitError, match="group_size"):
        awq.weight_tensors(fp16_qweight(8, 48, 32, False))


def test_scales_not_exact_in_fp16_are_refused():
    qw = fp16_qweight(8, 32, 32, False)
    qw.scale[0, 0] = 2**-20 * (1 + 2**-7)  # exact in bf16, below fp16's normal range
    with pytest.raises(QuantkitError, match="layer.y: 1 scales are not exactly representable in float16"):
        awq.weight_tensors(qw, where="layer.y")


def test_reads_autoawq_quant_config_json(tmp_path):
    qw = fp16_qweight(16, 64, 32, False)
    write(tmp_path, {"model.layers.0.q": qw}, 32)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "quant_config.json").write_text(json.dumps(
        {"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"}))
    _, _, back = awq.read_checkpoint(tmp_path)
    assert_same_qweight(back["model.layers.0.q"], qw)
    (tmp_path / "quant_config.json").write_text(json.dumps({"q_group_size": 32, "w_bit": 4, "version": "GEMV"}))
    with pytest.raises(QuantkitError, match="quant_config.json: version 'gemv'"):
        awq.read_checkpoint(tmp_path)
    (tmp_path / "quant_config.json").unlink()
    with pytest.raises(QuantkitError, match="config.json: no quantization_config and no quant_config.json"):
        awq.read_checkpoint(tmp_path)


def test_bad_tensors_name_file_and_module(tmp_path):
    from safetensors.torch import load_file, save_file

    write(tmp_path, {"model.layers.0.q": fp16_qweight(16, 64, 32, False)}, 32)
    file = tmp_path / "model.safetensors"
    tensors = load_file(str(file))
    save_file({k: v for k, v in tensors.items() if not k.endswith("qzeros")}, str(file))
    with pytest.raises(QuantkitError, match=f"{tmp_path}: model.layers.0.q: missing tensors \\['qzeros'\\]"):
        awq.read_checkpoint(tmp_path)
    save_file({**tensors, "model.layers.0.q.scales": tensors["model.layers.0.q.scales"][:1]}, str(file))
    with pytest.raises(QuantkitError, match="model.layers.0.q: scales has shape \\(1, 16\\), expected \\(2, 16\\)"):
        awq.read_checkpoint(tmp_path)
    save_file({k: v for k, v in tensors.items() if not k.endswith("qweight")}, str(file))
    with pytest.raises(QuantkitError, match="has no matching qweight"):
        awq.read_checkpoint(tmp_path)
