"""Format detection and the dispatching reader: every format of one tiny model loads to the same logits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantkit.errors import QuantkitError
from quantkit.formats import autoawq, gptq
from quantkit.formats import compressed_tensors as ct
from quantkit.formats.checkpoints import detect_format, read_checkpoint
from quantkit.models import load_model
from tests.quantkit.formats.test_compressed_tensors import LINEARS, assert_same_qweight, rtn

SIDE_FILES = ("tokenizer.json", "tokenizer_config.json")


def quantize_tiny(model_dir: Path, bits: int = 4, group_size: int = 32, symmetric: bool = False,
                  dtype: torch.dtype = torch.float16) -> tuple[dict, dict, dict]:
    """(hf config, dense tensors, quantized) of the tiny Llama, RTN-quantized with scales exact in `dtype`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    quantized = {}
    for i in range(model.config.num_hidden_layers):
        for name in LINEARS:
            qw = rtn(state[f"model.layers.{i}.{name}.weight"], bits, group_size, symmetric)
            qw.scale = qw.scale.to(dtype).float()
            quantized[f"model.layers.{i}.{name}"] = qw
    dense = {k: v for k, v in state.items() if k.removesuffix(".weight") not in quantized}
    hf_config = {**model.config.to_dict(), "dtype": str(dtype).removeprefix("torch.")}
    hf_config.pop("quantization_config", None)
    return hf_config, dense, quantized


def write_tiny(out: Path, model_dir: Path, fmt: str, bits: int = 4, group_size: int = 32, symmetric: bool = False,
               dtype: torch.dtype = torch.float16, actorder: str | None = None) -> dict:
    """The tiny Llama written in `fmt` with its tokenizer, a recipe and a quantkit.json; returns `quantized`."""
    hf_config, dense, quantized = quantize_tiny(model_dir, bits, group_size, symmetric, dtype)
    if actorder == "group":
        for qw in quantized.values():
            qw.g_idx = (torch.arange(qw.shape[1]).flip(0) // group_size).to(torch.int32)
    if fmt == "compressed-tensors":
        qcfg = ct.quantization_config(bits, group_size, symmetric, actorder, ignore=["lm_head"])
        ct.write_checkpoint(out, hf_config, dense, quantized, qcfg, dtype)
    elif fmt == "autoawq":
        autoawq.write_checkpoint(out, hf_config, dense, quantized, autoawq.quantization_config(group_size, ["lm_head"]))
    else:
        gptq.write_checkpoint(out, hf_config, dense, quantized,
                              gptq.quantization_config(bits, group_size, symmetric, actorder is not None))
    for name in SIDE_FILES:
        shutil.copy2(model_dir / name, out / name)
    (out / "recipe.yaml").write_text("name: tiny\nquantization: {method: rtn}\n")
    (out / "quantkit.json").write_text(json.dumps({"kind": "quantkit-checkpoint", "format": fmt}))
    return quantized


@pytest.fixture(scope="module")
def tiny_checkpoints(tiny_model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    paths = {fmt: root / fmt for fmt in ("compressed-tensors", "autoawq", "gptq")}
    for fmt, path in paths.items():
        write_tiny(path, tiny_model, fmt)
    return paths


def test_detects_and_reads_every_format_to_the_same_weights(tiny_checkpoints, tiny_model):
    assert detect_format(tiny_model) == "dense"
    read = {}
    for fmt, path in tiny_checkpoints.items():
        assert detect_format(path) == fmt
        read[fmt] = read_checkpoint(path)
    _, dense_ct, quantized_ct = read["compressed-tensors"]
    for fmt in ("autoawq", "gptq"):
        _, dense, quantized = read[fmt]
        assert dense.keys() == dense_ct.keys() and all(torch.equal(dense[k], dense_ct[k]) for k in dense)
        assert quantized.keys() == quantized_ct.keys() and len(quantized) == 14
        for module, qw in quantized.items():
            assert_same_qweight(qw, quantized_ct[module])
    config, dense, quantized = read_checkpoint(tiny_model)
    assert quantized == {} and "model.embed_tokens.weight" in dense and config["architectures"]


def test_load_model_dequantizes_every_format_identically(tiny_checkpoints):
    tokens = torch.randint(3, 390, (2, 11), generator=torch.Generator().manual_seed(0))
    logits = {}
    with torch.no_grad():
        for fmt, path in tiny_checkpoints.items():
            logits[fmt] = load_model(path)(tokens).logits
    assert torch.equal(logits["autoawq"], logits["compressed-tensors"])
    assert torch.equal(logits["gptq"], logits["compressed-tensors"])


def test_side_config_files_decide_the_format(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "quant_config.json").write_text(json.dumps({"w_bit": 4, "q_group_size": 128, "version": "GEMM"}))
    assert detect_format(tmp_path) == "autoawq"
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    assert detect_format(tmp_path) == "gptq"


@pytest.mark.parametrize("content,match", [
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "config.json: quantization_config: quant_method "
                                                                 "'bitsandbytes' is not a format quantkit reads"),
    ({"quantization_config": "awq"}, "config.json: quantization_config: expected an object"),
    ("{not json", "config.json: invalid JSON"),
    ([1, 2], "config.json: expected a JSON object"),
])
def test_unknown_or_malformed_configs_name_the_file(tmp_path, content, match):
    (tmp_path / "config.json").write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(QuantkitError, match=match):
        read_checkpoint(tmp_path)


def test_missing_pieces_name_the_path(tmp_path):
    with pytest.raises(QuantkitError, match="config.json: not found"):
        detect_format(tmp_path)
    with pytest.raises(QuantkitError, match="not a checkpoint directory"):
        detect_format(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(QuantkitError, match="no \\*.safetensors files"):
        read_checkpoint(tmp_path)
    save_file({"x": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    assert read_checkpoint(tmp_path)[1].keys() == {"x"}
