"""Method drivers on the tiny random Llama: options that change what a layer is fitted to."""

import torch

from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.algorithms import awq, gptq
from quantkit.quantize.drivers import AWQDriver, GPTQDriver, StageData
from quantkit.quantize.staged import StagedLayer, evenly_spaced
from quantkit.recipes import Recipe


def _gptq(**options) -> Recipe:
    return Recipe.model_validate({"name": "t", "quantization": {"method": "gptq", **options},
                                  "weights": {"bits": 4, "group_size": 32}})


def _staged(model: LayerwiseModel, layer, forward_dtype: torch.dtype = torch.float32) -> StagedLayer:
    c = model.config
    return StagedLayer(layer, c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads,
                       forward_dtype=forward_dtype)


def _layer_inputs(model: LayerwiseModel) -> tuple[list[torch.Tensor], list]:
    """Layer 0's inputs and rotary tables for 24 random token sequences."""
    torch.manual_seed(0)
    samples = [torch.randint(3, 390, (48,)).tolist() for _ in range(24)]
    hidden = [h[0] for h in model.embed(samples)]
    return hidden, [model.position_embeddings(h[None]) for h in hidden]


def _streams_after_layer_0(model: LayerwiseModel) -> tuple[list, list, list, list]:
    """Rotary tables, layer 1's full-precision and quantized inputs (layer 0 run as is, and GPTQ'd), and
    the full-precision layer 1's outputs: what fp_targets are fitted to."""
    hidden, rotary = _layer_inputs(model)
    with model.layer(0) as layer:
        staged = _staged(model, layer)
        fp_hidden = [staged.forward(h, r) for h, r in zip(hidden, rotary)]
        q_hidden = GPTQDriver(_gptq(), "model.layers.0").quantize_layer(staged, hidden, rotary).outputs
    with model.layer(1) as layer:
        fp_out = [_staged(model, layer).forward(h, r) for h, r in zip(fp_hidden, rotary)]
    return rotary, fp_hidden, q_hidden, fp_out


def test_fp_targets_bring_the_next_layer_closer_to_full_precision(tiny_model):
    # Layer 0 is quantized, so layer 1's inputs drift from the full-precision model's. Fitting layer 1
    # to the full-precision outputs must leave its outputs closer to them than fitting its own outputs.
    model = LayerwiseModel(tiny_model)
    rotary, fp_hidden, q_hidden, fp_out = _streams_after_layer_0(model)
    errors = {}
    for fp_targets in (0.0, 1.0):
        with model.layer(1) as layer:
            done = GPTQDriver(_gptq(fp_targets=fp_targets), "model.layers.1").quantize_layer(
                _staged(model, layer), q_hidden, rotary, reference_hidden=fp_hidden)
        errors[fp_targets] = sum(float((a - b).square().sum()) for a, b in zip(done.outputs, fp_out))
        if fp_targets:  # the full-precision stream comes back unchanged for the next layer
            for a, b in zip(done.reference_outputs, fp_out):
                torch.testing.assert_close(a, b)
    assert errors[1.0] < 0.8 * errors[0.0], errors


def test_fp_targets_estimated_on_half_the_samples_help_the_others_too(tiny_model):
    # The full-precision stream runs on 12 of 24 samples; the correction it estimates must also bring
    # the 12 samples it never saw closer to the full-precision outputs (measured: 0.065 against 0.072).
    model = LayerwiseModel(tiny_model)
    rotary, fp_hidden, q_hidden, fp_out = _streams_after_layer_0(model)
    picks = evenly_spaced(12, 24)
    unseen = [i for i in range(24) if i not in picks]
    errors = {}
    for fp_targets in (0.0, 0.5):
        recipe = _gptq(fp_targets=fp_targets, **({"fp_target_samples": 12} if fp_targets else {}))
        with model.layer(1) as layer:
            done = GPTQDriver(recipe, "model.layers.1").quantize_layer(
                _staged(model, layer), q_hidden, rotary, reference_hidden=[fp_hidden[i] for i in picks])
        errors[fp_targets] = sum(float((done.outputs[i] - fp_out[i]).square().sum()) for i in unseen)
        if fp_targets:  # the full-precision stream comes back for the picked samples only
            assert len(done.reference_outputs) == len(picks)
            for a, i in zip(done.reference_outputs, picks):
                torch.testing.assert_close(a, fp_out[i])
    assert errors[0.5] < 0.95 * errors[0.0], errors


def test_stage_data_scales_the_picked_samples_products_up_to_all_samples():
    torch.manual_seed(0)
    inputs = [torch.randn(n, 8) for n in (5, 7, 9)]
    reference = [x + 0.1 * torch.randn_like(x) for x in inputs]
    data = StageData.of(inputs, [reference[0], reference[2]], reference_picks=[0, 2], lengths=[5, 7, 9])
    scale = 21 / 14  # all tokens over the picked samples' tokens
    torch.testing.assert_close(data.hessian, gptq.input_hessian(inputs))
    torch.testing.assert_close(data.error_cross,
                               scale * gptq.input_error_cross([reference[0], reference[2]], [inputs[0], inputs[2]]))
    torch.testing.assert_close(data.reference_hessian, scale * gptq.input_hessian([reference[0], reference[2]]))
    unreported = StageData.of(inputs, [reference[0], reference[2]], reference_picks=[0, 2], lengths=[5, 7, 9],
                              reported=False)
    assert unreported.reference_hessian is None
    torch.testing.assert_close(unreported.error_cross, data.error_cross)


def test_refit_scales_keeps_the_codes_and_lowers_the_layers_output_errors(tiny_model):
    model = LayerwiseModel(tiny_model)
    hidden, rotary = _layer_inputs(model)
    done = {}
    for refit in (False, True):
        with model.layer(0) as layer:
            done[refit] = GPTQDriver(_gptq(refit_scales=refit, dampening=0.1), "model.layers.0").quantize_layer(
                _staged(model, layer), hidden, rotary)
    # q/k/v see the same inputs either way: same codes, other scales
    for name in ("self_attn.q_proj", "self_attn.k_proj"):
        assert torch.equal(done[True].quantized[name].q, done[False].quantized[name].q)
        assert not torch.equal(done[True].quantized[name].scale, done[False].quantized[name].scale)
    plain, refit = (sum(r.error for r in done[k].reports) for k in (False, True))
    assert refit < plain, (refit, plain)


def test_coordinate_descent_moves_codes_and_lowers_the_layers_output_errors(tiny_model):
    model = LayerwiseModel(tiny_model)
    hidden, rotary = _layer_inputs(model)
    done = {}
    for sweeps in (0, 3):
        with model.layer(0) as layer:
            done[sweeps] = GPTQDriver(_gptq(refit_scales=True, dampening=0.1, act_order=True, coordinate_descent=sweeps),
                                      "model.layers.0").quantize_layer(_staged(model, layer), hidden, rotary)
    # q sees the same inputs either way: the descent changed some of its codes, on the same grid
    q_plain, q_descended = (done[s].quantized["self_attn.q_proj"] for s in (0, 3))
    assert torch.equal(q_plain.zero, q_descended.zero)
    assert 0 < int((q_plain.q != q_descended.q).sum()) < q_plain.q.numel() // 4
    plain, descended = (sum(r.error for r in done[s].reports) for s in (0, 3))
    assert descended < plain, (descended, plain)


def test_heavier_descent_dampening_keeps_gptqs_codes_nearer_the_weight(tiny_model):
    """descent_dampening trades the calibration output error for distance to the weight (a regularizer)."""
    model = LayerwiseModel(tiny_model)
    hidden, rotary = _layer_inputs(model)
    done = {}
    for descent_dampening in (None, 10.0):
        with model.layer(0) as layer:
            staged = _staged(model, layer)
            original = staged.linear("self_attn.q_proj").weight.detach().float().clone()
            done[descent_dampening] = GPTQDriver(
                _gptq(dampening=0.1, act_order=True, coordinate_descent=3, descent_dampening=descent_dampening),
                "model.layers.0").quantize_layer(staged, hidden, rotary)
    # q_proj sees the same inputs either way
    q = {d: done[d].quantized["self_attn.q_proj"].dequantize() for d in done}
    output_error = {d: next(r.error for r in done[d].reports if r.name.endswith("q_proj")) for d in done}
    assert (q[10.0] - original).pow(2).sum() < (q[None] - original).pow(2).sum()
    assert output_error[10.0] > output_error[None]


def test_coordinate_descent_after_awq_keeps_the_grid_and_lowers_the_layers_output_errors(tiny_model):
    model = LayerwiseModel(tiny_model)
    hidden, rotary = _layer_inputs(model)
    done = {}
    for sweeps in (0, 3):
        recipe = Recipe.model_validate({"name": "t", "weights": {"bits": 4, "group_size": 32},
                                        "quantization": {"method": "awq", "clip_independent": True,
                                                         "coordinate_descent": sweeps}})
        with model.layer(0) as layer:
            done[sweeps] = AWQDriver(recipe, "model.layers.0").quantize_layer(_staged(model, layer), hidden, rotary)
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
    hidden, rotary = _layer_inputs(model)
    done = {}
    for weighted in (False, True):
        recipe = Recipe.model_validate({"name": "t", "weights": {"bits": 4, "group_size": 32},
                                        "quantization": {"method": "awq", "coordinate_descent": 3,
                                                         "descent_dampening": 0.01, "descent_weighted": weighted}})
        with model.layer(0) as layer:
            staged = _staged(model, layer)
            done[weighted] = AWQDriver(recipe, "model.layers.0").quantize_layer(staged, hidden, rotary).quantized
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
    hidden, rotary = _layer_inputs(model)
    done, scales = {}, {}
    for dtype in ("float32", "bfloat16"):
        recipe = Recipe.model_validate({"name": "t", "weights": {"bits": 4, "group_size": 32},
                                        "quantization": {"method": "awq", "coordinate_descent": 3,
                                                         "descent_weighted": True, "hessian_dtype": dtype,
                                                         "forward_dtype": dtype}})
        driver = AWQDriver(recipe, "model.layers.0")
        assert driver.forward_dtype() == getattr(torch, dtype)
        with model.layer(0) as layer:
            done[dtype] = driver.quantize_layer(_staged(model, layer, driver.forward_dtype()), hidden, rotary)
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
