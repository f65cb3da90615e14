"""AWQ on the tiny random Llama: coordinate descent after the search, its token weights, bfloat16 products."""

import torch

from quantkit.algorithms import awq, gptq
from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.quantize.methods.awq import AWQ
from quantkit.recipes import Recipe
from tests.quantkit.quantize.methods.layers import layer_inputs, staged_layer


def test_coordinate_descent_after_awq_keeps_the_grid_and_lowers_the_layers_output_errors(tiny_model):
    model = LayerwiseModel(tiny_model)
    hidden, rotary = layer_inputs(model)
    done = {}
    for sweeps in (0, 3):
        recipe = Recipe.model_validate({"name": "t", "weights": {"bits": 4, "group_size": 32},
                                        "quantization": {"method": "awq", "clip_independent": True,
                                                         "coordinate_descent": sweeps}})
        with model.layer(0) as layer:
            done[sweeps] = AWQ(recipe, "model.layers.0").quantize_layer(staged_layer(model, layer), hidden, rotary)
    # the same scales and clipping either way (AWQ's searches run before the descent): only codes moved
    for name, rounded in done[0].quantized.items():
        descended = done[3].quantized[name]
        assert torch.equal(rounded.scale, descended.scale) and torch.equal(rounded.zero, descended.zero)
    moved = sum(int((done[0].quantized[n].q != done[3].quantized[n].q).sum()) for n in done[0].quantized)
    assert moved > 0
    rounded, descended = (sum(r.error for r in done[s].reports) for s in (0, 3))
    assert descended < rounded, (descended, rounded)


def test_weighted_descent_after_awq_fits_v_proj_to_the_attention_each_token_receives(tiny_model):
    """descent_weighted: v_proj's codes are fitted per KV head on tokens weighted by the attention they
    receive, so its error as the attention output sees it is lower than with a plain Hessian."""
    model = LayerwiseModel(tiny_model)
    hidden, rotary = layer_inputs(model)
    done = {}
    for weighted in (False, True):
        recipe = Recipe.model_validate({"name": "t", "weights": {"bits": 4, "group_size": 32},
                                        "quantization": {"method": "awq", "coordinate_descent": 3,
                                                         "descent_dampening": 0.01, "descent_weighted": weighted}})
        with model.layer(0) as layer:
            staged = staged_layer(model, layer)
            done[weighted] = AWQ(recipe, "model.layers.0").quantize_layer(staged, hidden, rotary).quantized
            # the layer now holds AWQ's scales (the same either way: the searches run before the descent)
            inputs = [staged.attention_input(h) for h in hidden]
            received = [staged.attention_received(x, r) for x, r in zip(inputs, rotary)]
            scaled = staged.linear("self_attn.v_proj").weight.detach().float()
    heads = staged.num_kv_heads
    rows = scaled.shape[0] // heads
    hessians = [gptq.input_hessian(inputs, [r[h] for r in received]) for h in range(heads)]

    def error_the_attention_sees(name: str, weighted: bool) -> float:
        q = done[weighted][name].dequantize()
        return sum(awq.output_error(scaled[h * rows:(h + 1) * rows], q[h * rows:(h + 1) * rows], hessians[h])
                   for h in range(heads))

    assert error_the_attention_sees("self_attn.v_proj", True) < error_the_attention_sees("self_attn.v_proj", False)
    for name in ("self_attn.o_proj", "mlp.down_proj"):  # fitted on the residual stream's token weights
        assert not torch.equal(done[True][name].q, done[False][name].q), name
    for name in ("self_attn.q_proj", "mlp.up_proj"):  # no token weights: the same descent
        assert torch.equal(done[True][name].q, done[False][name].q), name


def test_awq_with_bfloat16_products_lands_where_float32_does(tiny_model):
    """hessian_dtype / forward_dtype bfloat16 round the products' inputs, not the sums: the layer's outputs,
    the searches' choices and each linear's error stay near float32's."""
    model = LayerwiseModel(tiny_model)
    hidden, rotary = layer_inputs(model)
    done, scales = {}, {}
    for dtype in ("float32", "bfloat16"):
        recipe = Recipe.model_validate({"name": "t", "weights": {"bits": 4, "group_size": 32},
                                        "quantization": {"method": "awq", "coordinate_descent": 3,
                                                         "descent_weighted": True, "hessian_dtype": dtype,
                                                         "forward_dtype": dtype}})
        driver = AWQ(recipe, "model.layers.0")
        assert driver.forward_dtype() == getattr(torch, dtype)
        with model.layer(0) as layer:
            done[dtype] = driver.quantize_layer(staged_layer(model, layer, driver.forward_dtype()), hidden, rotary)
            scales[dtype] = layer.input_layernorm.weight.detach().float().clone()  # AWQ's scales folded in
    pairs = list(zip(done["float32"].outputs, done["bfloat16"].outputs))
    assert not all(torch.equal(full, low) for full, low in pairs)  # the forward did run in bfloat16
    for full, low in pairs:
        assert torch.allclose(low, full, rtol=0.02, atol=0.02 * float(full.abs().max()))
    assert torch.allclose(scales["bfloat16"], scales["float32"], rtol=0.05)
    errors = [(full.error, low.error) for full, low in zip(done["float32"].reports, done["bfloat16"].reports)]
    assert any(full != low for full, low in errors)  # and so did the Hessians
    for full, low in errors:
        assert abs(low - full) <= 0.1 * full, errors
