"""INT8 W8A8 recipes end to end on the tiny random Llama: the checkpoint transformers reads, static input
scales, SmoothQuant moving a real activation outlier, and the refusals."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from quantkit.algorithms import int8
from quantkit.calibration.run import load_samples
from quantkit.errors import QuantkitError
from quantkit.models import load_model
from tests.conftest import build_tiny_model

RTN_RECIPE = """\
name: int8-rtn-{smooth}
quantization: {{method: int8, activations: static, rounding: rtn, smoothquant: {smooth}}}
weights: {{bits: 8, group_size: -1, symmetric: true}}
"""


def quantize(model, recipe, out, calib=None):
    from quantkit.quantize.run import QuantizeOptions, quantize as run

    return run(QuantizeOptions(model=str(model), recipe=str(recipe), calib=calib, out=out))


def rtn_recipe(tmp_path, smooth: bool):
    path = tmp_path / f"int8-rtn-{smooth}.yaml"
    path.write_text(RTN_RECIPE.format(smooth=str(smooth).lower()))
    return path


@pytest.mark.parametrize("recipe", ["int8-w8a8-dynamic", "int8-w8a8-static"])
def test_int8_checkpoint_layout_and_transformers_load(tiny_model, calib_dir, tmp_path, monkeypatch, recipe):
    static = recipe.endswith("static")
    out = tmp_path / recipe
    quantize(tiny_model, recipe, out, calib=calib_dir)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "int-quantized"
    assert config["config_groups"]["group_0"]["input_activations"]["dynamic"] is (not static)
    tensors = load_file(out / "model.safetensors")
    q_proj = "model.layers.0.self_attn.q_proj"
    assert tensors[f"{q_proj}.weight"].dtype == torch.int8 and tensors[f"{q_proj}.weight_scale"].shape == (64, 1)
    assert (f"{q_proj}.input_scale" in tensors) is static and f"{q_proj}.weight_zero_point" not in tensors
    details = [layer["detail"] for layer in json.loads((out / "quantkit.json").read_text())["layers"]]
    assert all(d.startswith("smoothing ") for d in details if d) and any(details)
    # The real consumer: transformers + compressed-tensors fake-quantizes weights and inputs in its forward.
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.randint(3, 390, (2, 24))
    with torch.no_grad():
        expected = theirs(tokens).logits
        if not static:
            # compressed-tensors' dynamic scale is absmax / 127.5; vLLM's kernels (what quantkit simulates)
            # use absmax / 127. With its convention ours must agree exactly, with vLLM's it must not.
            assert not torch.allclose(load_model(out)(tokens).logits, expected, rtol=1e-4, atol=1e-4)
            monkeypatch.setattr(int8, "INT8_MAX", 127.5)
        torch.testing.assert_close(load_model(out)(tokens).logits, expected, rtol=1e-4, atol=1e-4)


def test_static_input_scales_cover_calibration_inputs(tiny_model, calib_dir, tmp_path):
    out = tmp_path / "static"
    quantize(tiny_model, "int8-w8a8-static", out, calib=calib_dir)
    tensors = load_file(out / "model.safetensors")
    # An independent measurement: the quantized model's own down_proj inputs on the calibration tokens,
    # with the hooks that quantize them removed so the raw inputs are seen.
    model = load_model(out)
    for module in model.modules():
        module._forward_pre_hooks.clear()
    seen = []
    model.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].abs().max()))
    with torch.no_grad():
        for ids in load_samples(calib_dir):
            model(torch.tensor([ids]))
    scale = float(tensors["model.layers.1.mlp.down_proj.input_scale"])
    # stored rounded up in the model dtype (float32 here): never below absmax / 127
    assert scale * 127 == pytest.approx(float(max(seen)), rel=1e-3)
    assert scale * 127 >= float(max(seen)) * (1 - 1e-6)


def outlier_model(tmp_path):
    """The tiny model with a 60x outlier in channel 5 of what q/k/v read, the function unchanged: the norm
    scales the channel up and the linears' columns scale it back down (the shape LLM activations have)."""
    path = build_tiny_model(tmp_path / "outlier")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight[5] *= 60
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                linear.weight[:, 5] /= 60
    model.save_pretrained(path)
    return path


def test_smoothquant_recovers_what_an_activation_outlier_costs_static_int8(calib_dir, tmp_path):
    path = outlier_model(tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens = torch.tensor([ids for ids in load_samples(calib_dir)][0])[None]
    errors = {}
    for smooth in (False, True):
        out = tmp_path / f"smooth-{smooth}"
        quantize(path, rtn_recipe(tmp_path, smooth), out, calib=calib_dir)
        with torch.no_grad():
            errors[smooth] = float((load_model(out)(tokens).logits - reference(tokens).logits).pow(2).mean())
        if smooth:  # the smoothing went into the norm the outlier came from
            norm = load_file(out / "model.safetensors")["model.layers.0.input_layernorm.weight"]
            assert float(norm[5]) < float(reference.model.layers[0].input_layernorm.weight[5].detach()) / 4
    assert errors[True] < errors[False] / 4


def test_int8_refusals_are_one_line_before_any_work(tiny_model, calib_dir, tmp_path, run_cli):
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text("name: g\nquantization: {method: int8}\nweights: {bits: 8, group_size: 32, symmetric: true}\n")
    code, _, err = run_cli("quantize", "--model", tiny_model, "--recipe", grouped, "--calib", calib_dir,
                           "--out", tmp_path / "g")
    assert code == 2 and "per output channel" in err and not (tmp_path / "g").exists()
    code, _, err = run_cli("quantize", "--model", tiny_model, "--recipe", "int8-w8a8-dynamic", "--calib", calib_dir,
                           "--format", "gptq", "--out", tmp_path / "gptq")
    assert code == 2 and "weight-only" in err and not (tmp_path / "gptq").exists()
    with pytest.raises(QuantkitError, match="calibration"):
        quantize(tiny_model, "int8-w8a8-static", tmp_path / "static")
    assert not (tmp_path / "static").exists()


def test_smoothquant_on_moe_is_refused_and_plain_int8_runs(tmp_path, run_cli):
    model = build_tiny_model(tmp_path / "moe", architecture="qwen3_moe")
    code, _, err = run_cli("quantize", "--model", model, "--recipe", "int8-w8a8-dynamic", "--dataset", "x.jsonl",
                           "--out", tmp_path / "moe-out")
    assert code == 2 and "smoothquant on MoE layers" in err and not (tmp_path / "moe-out").exists()
    recipe = tmp_path / "moe-int8.yaml"
    recipe.write_text("name: moe-int8\nquantization: {method: int8, rounding: rtn, smoothquant: false}\n"
                      "weights: {bits: 8, group_size: -1, symmetric: true}\n")
    quantize(model, recipe, tmp_path / "moe-rtn")
    config = json.loads((tmp_path / "moe-rtn" / "config.json").read_text())["quantization_config"]
    assert config["format"] == "int-quantized"
