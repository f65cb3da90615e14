"""FP8 W8A8 recipes and FP8 KV-cache scales end to end on the tiny random Llama."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from quantkit.algorithms import fp8
from quantkit.calibration.run import load_samples
from quantkit.errors import QuantkitError
from quantkit.eval.kv_cache import read_kv_scales
from quantkit.models import load_model

RTN_KV_RECIPE = """\
name: rtn-w4a16-g64-kv-fp8
quantization: {method: rtn}
weights: {bits: 4, group_size: 64, symmetric: false}
kv_cache_scheme: {type: float, num_bits: 8, strategy: tensor}
"""


def quantize(tiny_model, recipe, out, calib=None):
    from quantkit.quantize.run import QuantizeOptions, quantize as run

    return run(QuantizeOptions(model=str(tiny_model), recipe=recipe, calib=calib, out=out))


@pytest.mark.parametrize("recipe", ["fp8-w8a8-dynamic", "fp8-w8a8-static"])
def test_fp8_checkpoint_layout_and_transformers_load(tiny_model, calib_dir, tmp_path, recipe):
    static = recipe.endswith("static")
    out = tmp_path / recipe
    quantize(tiny_model, recipe, out, calib=calib_dir if static else None)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "float-quantized"
    assert config["config_groups"]["group_0"]["input_activations"]["dynamic"] is (not static)
    tensors = load_file(out / "model.safetensors")
    q_proj = "model.layers.0.self_attn.q_proj"
    assert tensors[f"{q_proj}.weight"].dtype == torch.float8_e4m3fn
    assert tensors[f"{q_proj}.weight_scale"].shape == (64, 1)
    assert (f"{q_proj}.input_scale" in tensors) is static
    # The real consumer: transformers + compressed-tensors runs the fp8 checkpoint on CPU (weights and
    # inputs fake-quantized in its forward); our reader with its W8A8 input simulation must agree.
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = load_model(out)
    tokens = torch.randint(3, 390, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens).logits, rtol=1e-4, atol=1e-4)


def test_fp8_static_input_scales_cover_calibration_inputs(tiny_model, calib_dir, tmp_path):
    out = tmp_path / "static"
    quantize(tiny_model, "fp8-w8a8-static", out, calib=calib_dir)
    tensors = load_file(out / "model.safetensors")
    # An independent measurement: the quantized model's own q_proj inputs on the calibration tokens.
    model = load_model(out)
    seen = []
    model.model.layers[1].self_attn.q_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].abs().max()))
    with torch.no_grad():
        for ids in load_samples(calib_dir):
            model(torch.tensor([ids]))
    scale = float(tensors["model.layers.1.self_attn.q_proj.input_scale"])
    # fp16 rounding of the stored scale moves it by at most 2**-11 relative.
    assert scale * 448 == pytest.approx(float(max(seen)), rel=2e-3)


def test_fp8_dynamic_needs_no_data_but_static_does(tiny_model, tmp_path):
    quantize(tiny_model, "fp8-w8a8-dynamic", tmp_path / "dyn")
    with pytest.raises(QuantkitError, match="calibration"):
        quantize(tiny_model, "fp8-w8a8-static", tmp_path / "static")
    assert not (tmp_path / "static").exists()


def test_kv_scales_are_calibration_absmax_over_448(tiny_model, calib_dir, tmp_path):
    recipe = tmp_path / "rtn-kv.yaml"
    recipe.write_text(RTN_KV_RECIPE)
    out = tmp_path / "rtn-kv"
    quantize(tiny_model, str(recipe), out, calib=calib_dir)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["kv_cache_scheme"]["type"] == "float" and config["kv_cache_scheme"]["strategy"] == "tensor"
    scales = read_kv_scales(out)
    assert sorted(scales) == [0, 1]
    # Independently: capture the keys (after rotary) and values the attention sees in transformers.
    seen = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        k, v = seen.get(module.layer_idx, (0.0, 0.0))
        seen[module.layer_idx] = (max(k, float(key.abs().max())), max(v, float(value.abs().max())))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("test_capture_kv", capture)
    model = load_model(out)
    model.set_attn_implementation("test_capture_kv")
    with torch.no_grad():
        for ids in load_samples(calib_dir):
            model(torch.tensor([ids]))
    for layer, (k_max, v_max) in seen.items():
        assert scales[layer][0] == pytest.approx(k_max / fp8.FP8_MAX, rel=1e-4)
        assert scales[layer][1] == pytest.approx(v_max / fp8.FP8_MAX, rel=1e-4)


def test_awq_kv_fp8_recipe_writes_scales_vllm_names(tiny_model, calib_dir, tmp_path):
    out = tmp_path / "awq-kv"
    quantize(tiny_model, "awq-w4a16-g64-kv-fp8", out, calib=calib_dir)
    tensors = load_file(out / "model.safetensors")
    for layer in (0, 1):
        for kind in ("k", "v"):
            scale = tensors[f"model.layers.{layer}.self_attn.{kind}_scale"]
            assert scale.shape == (1,) and scale.dtype == torch.float32 and float(scale) > 0
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized" and config["kv_cache_scheme"] is not None
