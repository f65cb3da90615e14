"""Qwen3-MoE and Mixtral end to end on tiny random models: every expert quantized from the tokens routed to it, stored
per expert as vLLM loads it, read back by transformers + compressed-tensors with quantkit's logits; and an
expert the router starves is calibrated on every token of its layer (forced routing), with a warning."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from quantkit.calibration.run import CalibrateOptions, calibrate
from quantkit.errors import QuantkitError
from quantkit.models import load_model
from quantkit.quantize.run import QuantizeOptions, quantize
from tests.conftest import build_tiny_model, chat_rows, write_jsonl
from tests.quantkit.architectures.folds import apply_every_fold

EXPERTS, TOP_K = 4, 2
# how each checkpoint names its MoE block and each expert's gate, up and down linears
STORED = {"qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")), "mixtral": ("block_sparse_moe", ("w1", "w3", "w2"))}
SYMMETRIC = {"rtn-sym": "rtn", "awq-sym": "awq"}
# transformers (5.25) cannot dequantize asymmetric pack-quantized experts ("Asymmetric quant requires zero-point
# values" when it fuses them): the load check takes symmetric recipes, the asymmetric ones are read by quantkit
CONSUMER_RECIPES = ["rtn-sym", "gptq-w4a16-g64-sym", "awq-sym", "fp8-w8a8-dynamic"]
RECIPES = [*CONSUMER_RECIPES, "gptq-w4a16-g64", "awq-w4a16-g64", "fp8-w8a8-static"]


@pytest.fixture(scope="module", params=list(STORED))
def built(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    model = build_tiny_model(root / "model", architecture=request.param, max_positions=128)
    data = write_jsonl(root / "calib.jsonl", chat_rows(24))
    calib = calibrate(CalibrateOptions(model=str(model), dataset=str(data), out=root / "calib", num_samples=12,
                                       max_seq_len=64))
    for name, method in SYMMETRIC.items():
        (root / f"{name}.yaml").write_text(f"name: {name}\nquantization: {{method: {method}}}\n"
                                          "weights: {bits: 4, group_size: 64, symmetric: true}\n")
    results = {recipe: quantize(QuantizeOptions(
        model=str(model), recipe=str(root / f"{recipe}.yaml") if recipe in SYMMETRIC else recipe,
        calib=root / "calib", out=root / recipe)) for recipe in RECIPES}
    return model, results, calib.samples.num_tokens, request.param


def test_experts_are_stored_one_by_one_and_the_router_stays_dense(built):
    _, results, _, architecture = built
    block, linears = STORED[architecture]
    path = results["gptq-w4a16-g64"].out
    tensors = load_file(path / "model.safetensors")
    for expert in range(EXPERTS):
        for linear in linears:
            assert f"model.layers.1.{block}.experts.{expert}.{linear}.weight_packed" in tensors
    assert tensors[f"model.layers.1.{block}.gate.weight"].dtype == torch.float32  # the tiny model's dtype
    assert not any(name.startswith(f"model.layers.1.{block}.gate.weight_") for name in tensors)
    assert f"model.layers.1.{block}.gate" in json.loads((path / "config.json").read_text())["quantization_config"]["ignore"]


@pytest.mark.parametrize("recipe", CONSUMER_RECIPES)
def test_transformers_loads_each_checkpoint_with_quantkits_logits(built, recipe, monkeypatch):
    model, results, _, _ = built
    path = results[recipe].out
    options = {} if recipe.startswith("fp8") else {"quantization_config": CompressedTensorsConfig(dequantize=True)}
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **options).eval()
    if recipe.startswith("fp8"):
        # transformers (5.25) fuses the experts and runs them weight-only: their inputs are not quantized, while
        # vLLM's fused MoE kernel quantizes them per token as quantkit's simulation does. Compare like with like.
        from quantkit.eval import w8a8_inputs

        quantize_inputs = w8a8_inputs.quantize_linear_inputs
        simulated = load_model(path)  # experts' inputs quantized too, under the model's own module names
        monkeypatch.setattr(w8a8_inputs, "quantize_linear_inputs", lambda model, weights: quantize_inputs(
            model, {name: w for name, w in weights.items() if ".experts." not in name}))
        with torch.no_grad():
            assert not torch.allclose(simulated(torch.tensor([[5, 6, 7]])).logits,
                                      load_model(path)(torch.tensor([[5, 6, 7]])).logits, atol=1e-5)
    ours = load_model(path)
    tokens = torch.randint(3, 390, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens).logits, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(ours(tokens).logits, load_model(model)(tokens).logits, atol=1e-3)


def test_static_fp8_experts_share_one_input_scale_per_projection(built):
    """vLLM serves a layer's experts with one input scale per projection: the checkpoint stores that one, the
    largest any expert's routed inputs needed."""
    _, results, _, architecture = built
    block, linears = STORED[architecture]
    tensors = load_file(results["fp8-w8a8-static"].out / "model.safetensors")
    for layer in (0, 1):
        for linear in linears:
            scales = [tensors[f"model.layers.{layer}.{block}.experts.{e}.{linear}.input_scale"] for e in range(EXPERTS)]
            assert all(torch.equal(scale, scales[0]) for scale in scales)
        gate, up, down = (tensors[f"model.layers.{layer}.{block}.experts.0.{n}.input_scale"] for n in linears)
        assert torch.equal(gate, up) and not torch.equal(gate, down)  # gate and up read the same tokens


@pytest.mark.parametrize("recipe", ["gptq-w4a16-g64", "awq-w4a16-g64"])
def test_every_expert_is_calibrated_on_its_routed_tokens_and_beats_rounding(built, recipe):
    _, results, num_tokens, _ = built
    result = results[recipe]
    routed = json.loads((result.out / "quantkit.json").read_text())["routed_tokens"]
    assert set(routed) == {"model.layers.0", "model.layers.1"}
    for counts in routed.values():
        assert len(counts) == EXPERTS and sum(counts) == TOP_K * num_tokens and min(counts) > 0
    experts = [r for r in result.reports if ".experts." in r.name]
    assert len(experts) == 2 * EXPERTS * 3 and not any("forced" in r.note for r in experts)
    assert sum(r.error for r in experts) < 0.9 * sum(r.error_rtn for r in experts)


def test_a_starved_expert_is_calibrated_on_every_token_and_said_so(tmp_path):
    """A router whose rows for experts 0 and 1 are +u and -u (scaled up) and 0 for expert 3, with one expert per
    token: one of the first two always scores above 0, so expert 3 is never picked."""
    path = build_tiny_model(tmp_path / "model", architecture="qwen3_moe", max_positions=128)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.num_experts_per_tok = 1
    u = torch.randn(64, generator=torch.Generator().manual_seed(0))
    for layer in model.model.layers:
        router = layer.mlp.gate
        router.top_k = 1
        with torch.no_grad():
            router.weight[0], router.weight[1], router.weight[3] = 10 * u, -10 * u, 0
    model.save_pretrained(path)
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(24))
    result = quantize(QuantizeOptions(model=str(path), recipe="gptq-w4a16-g64", dataset=str(data), num_samples=12,
                                      max_seq_len=64, out=tmp_path / "out"))
    routed = json.loads((tmp_path / "out" / "quantkit.json").read_text())["routed_tokens"]
    assert all(counts[3] == 0 for counts in routed.values())
    assert sum("expert 3 was routed 0 calibration tokens" in w and "forced routing" in w for w in result.warnings) == 2
    starved = [r for r in result.reports if ".experts.3." in r.name]
    assert len(starved) == 2 * 3 and all("forced routing" in r.note for r in starved)
    # fitted on real inputs, not plain rounding of a singular Hessian: the method beats rounding there too
    assert sum(r.error for r in starved) < 0.9 * sum(r.error_rtn for r in starved)
    weights = load_model(tmp_path / "out").model.layers[0].mlp.experts[3]
    assert all(torch.isfinite(p).all() for p in weights.parameters())


@pytest.mark.parametrize("recipe, match", [("gptq-w4a16-g64-fp-targets", "fp_targets")])
def test_what_moe_cannot_take_is_refused_before_any_work(built, tmp_path, recipe, match):
    model, _, _, _ = built
    with pytest.raises(QuantkitError, match=match):
        quantize(QuantizeOptions(model=str(model), recipe=recipe, dataset="support_chat_en", out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_runtime_refuses_moe_in_one_line(built):
    from quantkit.runtime import LLM

    model, _, _, _ = built
    with pytest.raises(QuantkitError, match="does not run mixture-of-experts"):
        LLM(str(model), dtype="float32", max_model_len=64)


def test_awqs_expert_folds_leave_the_layer_unchanged(built):
    """up -> down of every expert (and the attention's folds) change weights, not the MoE layer's output."""
    model, _, _, _ = built
    folds = apply_every_fold(model)
    assert sum(".experts." in prev for _, prev in folds) == EXPERTS
