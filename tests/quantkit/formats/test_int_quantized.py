"""compressed-tensors int-quantized (INT8 W8A8): config, checkpoint round trip, refusals."""

import json

import pytest
import torch
from compressed_tensors.quantization import QuantizationConfig

from quantkit.algorithms.rtn import WeightScheme, rtn_quantize
from quantkit.errors import QuantkitError
from quantkit.formats import compressed_tensors as ct
from quantkit.formats import int_quantized as iq
from quantkit.formats.quantized import Int8Weight
from quantkit.formats.checkpoints import get_format
from quantkit.formats.scheme import CheckpointScheme

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": False}
INT8_CHANNEL = WeightScheme(bits=8, group_size=-1, symmetric=True, scale_dtype=torch.bfloat16)


def int8_weight(rows: int, cols: int, input_scale: float | None = None, seed: int = 0) -> Int8Weight:
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    scale = None if input_scale is None else torch.tensor([input_scale])
    return Int8Weight.from_codes(rtn_quantize(w, INT8_CHANNEL), scale)


@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_config_parses_with_compressed_tensors(activations):
    config = iq.quantization_config(activations, ignore=["lm_head"], kv_cache=False, version=ct.CT_VERSION)
    parsed = QuantizationConfig.model_validate(config)
    group = parsed.config_groups["group_0"]
    assert str(group.weights.type) == "int" and group.weights.num_bits == 8 and group.weights.symmetric
    assert str(group.weights.strategy) == "channel"
    assert group.input_activations.dynamic is (activations == "dynamic")
    assert str(group.input_activations.strategy) == ("token" if activations == "dynamic" else "tensor")
    assert iq.static_activations(config, "here") is (activations == "static")


def test_codes_are_signed_and_dequantize_like_the_unsigned_form():
    w = torch.randn(8, 16)
    codes = rtn_quantize(w, INT8_CHANNEL)
    weight = Int8Weight.from_codes(codes)
    assert weight.weight.dtype == torch.int8 and weight.scale.shape == (8, 1)
    assert torch.equal(weight.dequantize(), codes.dequantize())


def test_from_codes_refuses_grouped_or_asymmetric_codes():
    with pytest.raises(ValueError, match="per-channel"):
        Int8Weight.from_codes(rtn_quantize(torch.randn(4, 64), WeightScheme(bits=8, group_size=32, symmetric=True)))


@pytest.mark.parametrize("static", [False, True])
def test_checkpoint_round_trip_is_bit_exact(tmp_path, static):
    weights = {f"model.layers.0.mlp.{n}": int8_weight(16, 32, 0.05 if static else None, seed=i)
               for i, n in enumerate(("gate_proj", "up_proj"))}
    dense = {"model.norm.weight": torch.ones(32, dtype=torch.bfloat16)}
    config = iq.quantization_config("static" if static else "dynamic", ["lm_head"], False, ct.CT_VERSION)
    ct.write_checkpoint(tmp_path, CONFIG, dense, weights, config, torch.bfloat16)
    _, dense_back, weights_back = ct.read_checkpoint(tmp_path)
    assert set(dense_back) == set(dense) and set(weights_back) == set(weights)
    for name, w in weights.items():
        back = weights_back[name]
        assert isinstance(back, Int8Weight) and torch.equal(back.weight, w.weight)
        assert torch.equal(back.scale, w.scale)  # the codes were found against bfloat16-exact scales
        assert (back.input_scale is None) is (not static)


def test_static_config_without_input_scale_names_the_layer(tmp_path):
    weights = {"model.layers.0.mlp.up_proj": int8_weight(16, 32)}
    ct.write_checkpoint(tmp_path, CONFIG, {}, weights, iq.quantization_config("static", [], False, "0"),
                        torch.bfloat16)
    with pytest.raises(QuantkitError, match="model.layers.0.mlp.up_proj: static INT8 activations but no input_scale"):
        ct.read_checkpoint(tmp_path)


def test_asymmetric_activations_are_refused_on_read(tmp_path):
    config = iq.quantization_config("dynamic", [], False, "0")
    config["config_groups"]["group_0"]["input_activations"]["symmetric"] = False
    ct.write_checkpoint(tmp_path, CONFIG, {}, {"model.layers.0.mlp.up_proj": int8_weight(16, 32)}, config,
                        torch.bfloat16)
    with pytest.raises(QuantkitError, match="input_activations are asymmetric"):
        ct.read_checkpoint(tmp_path)


def test_only_compressed_tensors_holds_int8_w8a8_and_only_per_channel_symmetric():
    scheme = CheckpointScheme(kind="int", bits=8, group_size=-1, symmetric=True, activations="dynamic")
    compressed_tensors = get_format("compressed-tensors", "--format")
    assert compressed_tensors.can_hold(scheme) is None
    assert "4-bit" in get_format("autoawq", "--format").can_hold(scheme)
    assert "weight-only" in get_format("gptq", "--format").can_hold(scheme)
    grouped = CheckpointScheme(kind="int", bits=8, group_size=64, symmetric=True, activations="static")
    assert "per output channel" in compressed_tensors.can_hold(grouped)
    config = compressed_tensors.quantization_config(scheme, ["lm_head"])
    assert json.loads(json.dumps(config))["format"] == "int-quantized"
