"""GPTQ on the tiny random Llama: options that change what a layer is fitted to."""

import torch

from quantkit.algorithms import gptq
from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.quantize.methods.gptq import GPTQ, StageData
from quantkit.quantize.staged import evenly_spaced
from tests.quantkit.quantize.methods.layers import gptq_recipe, layer_inputs, staged_layer, streams_after_layer_0


def test_fp_targets_bring_the_next_layer_closer_to_full_precision(tiny_model):
    # Layer 0 is quantized, so layer 1's inputs drift from the full-precision model's. Fitting layer 1
    # to the full-precision outputs must leave its outputs closer to them than fitting its own outputs.
    model = LayerwiseModel(tiny_model)
    rotary, fp_hidden, q_hidden, fp_out = streams_after_layer_0(model)
    errors = {}
    for fp_targets in (0.0, 1.0):
        with model.layer(1) as layer:
            done = GPTQ(gptq_recipe(fp_targets=fp_targets), "model.layers.1").quantize_layer(
                staged_layer(model, layer), q_hidden, rotary, reference_hidden=fp_hidden)
        errors[fp_targets] = sum(float((a - b).square().sum()) for a, b in zip(done.outputs, fp_out))
        if fp_targets:  # the full-precision stream comes back unchanged for the next layer
            for a, b in zip(done.reference_outputs, fp_out):
                torch.testing.assert_close(a, b)
    assert errors[1.0] < 0.8 * errors[0.0], errors


def test_fp_targets_estimated_on_half_the_samples_help_the_others_too(tiny_model):
    # The full-precision stream runs on 12 of 24 samples; the correction it estimates must also bring
    # the 12 samples it never saw closer to the full-precision outputs (measured: 0.065 against 0.072).
    model = LayerwiseModel(tiny_model)
    rotary, fp_hidden, q_hidden, fp_out = streams_after_layer_0(model)
    picks = evenly_spaced(12, 24)
    unseen = [i for i in range(24) if i not in picks]
    errors = {}
    for fp_targets in (0.0, 0.5):
        recipe = gptq_recipe(fp_targets=fp_targets, **({"fp_target_samples": 12} if fp_targets else {}))
        with model.layer(1) as layer:
            done = GPTQ(recipe, "model.layers.1").quantize_layer(
                staged_layer(model, layer), q_hidden, rotary, reference_hidden=[fp_hidden[i] for i in picks])
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
    hidden, rotary = layer_inputs(model)
    done = {}
    for refit in (False, True):
        with model.layer(0) as layer:
            done[refit] = GPTQ(gptq_recipe(refit_scales=refit, dampening=0.1), "model.layers.0").quantize_layer(
                staged_layer(model, layer), hidden, rotary)
    # q/k/v see the same inputs either way: same codes, other scales
    for name in ("self_attn.q_proj", "self_attn.k_proj"):
        assert torch.equal(done[True].quantized[name].q, done[False].quantized[name].q)
        assert not torch.equal(done[True].quantized[name].scale, done[False].quantized[name].scale)
    plain, refit = (sum(r.error for r in done[k].reports) for k in (False, True))
    assert refit < plain, (refit, plain)


def test_coordinate_descent_moves_codes_and_lowers_the_layers_output_errors(tiny_model):
    model = LayerwiseModel(tiny_model)
    hidden, rotary = layer_inputs(model)
    done = {}
    for sweeps in (0, 3):
        with model.layer(0) as layer:
            done[sweeps] = GPTQ(gptq_recipe(refit_scales=True, dampening=0.1, act_order=True, coordinate_descent=sweeps),
                                      "model.layers.0").quantize_layer(staged_layer(model, layer), hidden, rotary)
    # q sees the same inputs either way: the descent changed some of its codes, on the same grid
    q_plain, q_descended = (done[s].quantized["self_attn.q_proj"] for s in (0, 3))
    assert torch.equal(q_plain.zero, q_descended.zero)
    assert 0 < int((q_plain.q != q_descended.q).sum()) < q_plain.q.numel() // 4
    plain, descended = (sum(r.error for r in done[s].reports) for s in (0, 3))
    assert descended < plain, (descended, plain)


def test_heavier_descent_dampening_keeps_gptqs_codes_nearer_the_weight(tiny_model):
    """descent_dampening trades the calibration output error for distance to the weight (a regularizer)."""
    model = LayerwiseModel(tiny_model)
    hidden, rotary = layer_inputs(model)
    done = {}
    for descent_dampening in (None, 10.0):
        with model.layer(0) as layer:
            staged = staged_layer(model, layer)
            original = staged.linear("self_attn.q_proj").weight.detach().float().clone()
            done[descent_dampening] = GPTQ(
                gptq_recipe(dampening=0.1, act_order=True, coordinate_descent=3, descent_dampening=descent_dampening),
                "model.layers.0").quantize_layer(staged, hidden, rotary)
    # q_proj sees the same inputs either way
    q = {d: done[d].quantized["self_attn.q_proj"].dequantize() for d in done}
    output_error = {d: next(r.error for r in done[d].reports if r.name.endswith("q_proj")) for d in done}
    assert (q[10.0] - original).pow(2).sum() < (q[None] - original).pow(2).sum()
    assert output_error[10.0] > output_error[None]
