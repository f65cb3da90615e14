"""compressed-tensors float-quantized (FP8 W8A8): tensors, config, checkpoint round trip, KV scales."""

import pytest
import torch
from compressed_tensors.quantization import QuantizationConfig

from quantkit.algorithms import fp8
from quantkit.errors import QuantkitError
from quantkit.formats import compressed_tensors as ct
from quantkit.formats import float_quantized as fq

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": False}


@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_config_parses_with_compressed_tensors(activations):
    config = fq.quantization_config(activations, ignore=["lm_head"], kv_cache=True)
    parsed = QuantizationConfig.model_validate(config)
    inputs = parsed.config_groups["group_0"].input_activations
    assert inputs.dynamic is (activations == "dynamic")
    assert str(inputs.strategy) == ("token" if activations == "dynamic" else "tensor")
    assert str(parsed.kv_cache_scheme.type) == "float" and parsed.kv_cache_scheme.num_bits == 8
    assert fq.activation_scheme(config, "here") == activations


@pytest.mark.parametrize("static", [False, True])
def test_checkpoint_round_trip_is_bit_exact(tmp_path, static):
    torch.manual_seed(0)
    weights = {f"model.layers.0.mlp.{n}": fp8.quantize_weight(torch.randn(16, 32), torch.float16,
                                                                 input_absmax=3.0 if static else None)
               for n in ("gate_proj", "up_proj")}
    dense = {"model.norm.weight": torch.ones(32, dtype=torch.float16),
             "model.layers.0.self_attn.k_scale": torch.tensor([0.01]),
             "model.layers.0.self_attn.v_scale": torch.tensor([0.02])}
    config = fq.quantization_config("static" if static else "dynamic", ignore=["lm_head"], kv_cache=True)
    ct.write_checkpoint(tmp_path, CONFIG, dense, weights, config, torch.float16)
    _, dense_back, weights_back = ct.read_checkpoint(tmp_path)
    assert set(dense_back) == set(dense) and set(weights_back) == set(weights)
    assert fq.kv_scales(dense_back) == {k: v for k, v in dense.items() if k.endswith("_scale")}
    for name, w in weights.items():
        back = weights_back[name]
        assert torch.equal(back.weight.view(torch.uint8), w.weight.view(torch.uint8))
        assert torch.equal(back.scale, w.scale)
        assert (back.input_scale is None) is (not static)
        if static:
            assert torch.equal(back.input_scale, w.input_scale)


def test_independent_decode_of_the_stored_bytes(tmp_path):
    # float8_e4m3fn by hand: sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7E = 448, 0x38 = 1.0.
    def decode(byte: int) -> float:
        sign = -1.0 if byte & 0x80 else 1.0
        exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
        if exponent == 0:
            return sign * mantissa / 8 * 2.0**-6
        return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)

    w = torch.tensor([[448.0, -1.0, 0.5, 0.0], [1.0, 2.0, 3.0, 4.0]])
    q = fp8.quantize_weight(w, torch.float32)
    tensors = fq.weight_tensors(q, torch.float32)
    raw = tensors["weight"].view(torch.uint8)
    assert raw[0].tolist() == [0x7E, 0xB8, 0x30, 0x00]
    scales = tensors["weight_scale"].reshape(-1)
    decoded = torch.tensor([[decode(b) * float(scales[r]) for b in row] for r, row in enumerate(raw.tolist())])
    torch.testing.assert_close(decoded, q.dequantize(), rtol=0, atol=0)
    torch.testing.assert_close(decoded, w, rtol=2**-4, atol=0)


def test_user_errors_name_the_problem(tmp_path):
    config = fq.quantization_config("static", ignore=[])
    with pytest.raises(QuantkitError, match="input_scale"):
        fq.read_weight({"weight": torch.zeros(2, 2, dtype=torch.float8_e4m3fn),
                        "weight_scale": torch.ones(2, 1)}, static=True, where="layer.x")
    with pytest.raises(QuantkitError, match=r"layer.x: weight_scale has shape \(3, 1\)"):
        fq.read_weight({"weight": torch.zeros(2, 2, dtype=torch.float8_e4m3fn),
                        "weight_scale": torch.ones(3, 1)}, static=False, where="layer.x")
    config["config_groups"]["group_0"]["weights"]["num_bits"] = 4
    with pytest.raises(QuantkitError, match="not 8-bit float"):
        fq.activation_scheme(config, "cfg")
    with pytest.raises(QuantkitError, match="dynamic or static"):
        fq.quantization_config("per-head", ignore=[])
