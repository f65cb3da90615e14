"""Every declared architecture end to end, on a tiny random model built from its transformers config:
calibrate -> quantize with each method -> transformers + compressed-tensors load the checkpoint with the logits
of quantkit's dequantized model, and the runtime's greedy tokens equal transformers' on the dense model and on
the INT4 checkpoints."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, CompressedTensorsConfig

from safetensors.torch import load_file

from quantkit.architectures import architecture_of
from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.calibration.run import CalibrateOptions, calibrate, load_samples
from quantkit.errors import QuantkitError
from quantkit.models import head_dim, load_model, load_tokenizer
from quantkit.quantize.run import QuantizeOptions, quantize
from quantkit.quantize.staged import StagedLayer
from tests.conftest import build_tiny_model, chat_rows, write_jsonl
from tests.quantkit.architectures.folds import apply_every_fold
from tests.runtime.conftest import TEXTS, first_token_logits, hf_greedy

ARCHITECTURES = ["llama", "llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma3"]
NOT_IN_RUNTIME = {"gemma3"}
INT4_RECIPES = ["rtn-w4a16-g64", "gptq-w4a16-g64", "awq-w4a16-g64"]
RECIPES = [*INT4_RECIPES, "fp8-w8a8-static"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def built(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    model = build_tiny_model(root / "model", architecture=request.param, max_positions=128)
    data = write_jsonl(root / "calib.jsonl", chat_rows(24))
    calibrate(CalibrateOptions(model=str(model), dataset=str(data), out=root / "calib", num_samples=12,
                               max_seq_len=64))
    checkpoints = {recipe: quantize(QuantizeOptions(model=str(model), recipe=recipe, calib=root / "calib",
                                                    out=root / recipe)).out for recipe in RECIPES}
    return request.param, model, checkpoints, root / "calib"


def test_the_declaration_says_what_the_config_has(built):
    name, model, _, _ = built
    config = AutoConfig.from_pretrained(model).to_dict()
    architecture = architecture_of(config)
    assert architecture.name == {"llama3": "llama"}.get(name, name)
    assert architecture.qk_norm == (name in ("qwen3", "gemma3"))
    hf = AutoModelForCausalLM.from_pretrained(model)
    modules = dict(hf.model.layers[0].named_modules())
    assert all(isinstance(modules[n], torch.nn.Linear) for n in architecture.linears)
    assert {n for n, m in modules.items() if isinstance(m, torch.nn.Linear)} == set(architecture.linears)


@pytest.mark.parametrize("recipe", RECIPES)
def test_transformers_loads_each_checkpoint_with_quantkits_logits(built, recipe):
    _, model, checkpoints, _ = built
    path = checkpoints[recipe]
    # pack-quantized int checkpoints load dequantized (asymmetric ones only so, upstream); FP8 runs as stored
    options = {} if recipe.startswith("fp8") else {"quantization_config": CompressedTensorsConfig(dequantize=True)}
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **options).eval()
    ours = load_model(path)
    tokens = torch.randint(3, 390, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens).logits, rtol=1e-4, atol=1e-4)
        # and quantization changed the model
        assert not torch.allclose(ours(tokens).logits, load_model(model)(tokens).logits, atol=1e-3)


@pytest.mark.parametrize("recipe", [None, *INT4_RECIPES])
def test_runtime_greedy_equals_transformers(built, recipe):
    from quantkit.runtime import LLM, SamplingParams

    name, model, checkpoints, _ = built
    path = model if recipe is None else checkpoints[recipe]
    if name in NOT_IN_RUNTIME:
        with pytest.raises(QuantkitError, match="the runtime does not run"):
            LLM(str(path), dtype="float32", max_model_len=128)
        return
    prompts = [load_tokenizer(model).encode(t) for t in TEXTS[:4]]
    hf = load_model(path)
    llm = LLM(str(path), dtype="float32", max_model_len=128, kernels="reference")
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert [o.token_ids for o in outs] == hf_greedy(hf, prompts, 10)
    # greedy tokens of a random model can hide small errors: the logits themselves, 40 positions on
    long_prompt = [p for prompt in prompts for p in prompt][:40]
    with torch.no_grad():
        expected = hf(torch.tensor([long_prompt])).logits[0, -1]
    torch.testing.assert_close(first_token_logits(llm, [long_prompt])[0], expected, rtol=1e-4, atol=1e-4)


def test_staged_layer_runs_each_layer_as_transformers_does(built):
    """What quantization runs (StagedLayer) against the transformers layer, and the FP8 KV-cache key range
    against what calibration's hooks measured on the same tokens."""
    name, model, _, calib = built
    layerwise = LayerwiseModel(model)
    config = layerwise.config
    architecture = architecture_of(config.to_dict())
    samples = load_samples(calib)
    hidden = [h[0] for h in layerwise.embed(samples)]
    rotary = [layerwise.position_embeddings(h[None], 0) for h in hidden]
    window = architecture.layer_window(config.to_dict(), 0)
    with layerwise.layer(0) as layer:
        staged = StagedLayer(layer, config.num_attention_heads, config.num_key_value_heads, head_dim(config),
                             architecture=architecture, window=window)
        for h, r in zip(hidden, rotary):
            torch.testing.assert_close(staged.forward(h, r), layerwise.run_layer(layer, h[None], r, window)[0],
                                       rtol=1e-5, atol=1e-5)
        key_absmax = max(staged.key_value_absmax(h, r)[0] for h, r in zip(hidden, rotary))
    measured = load_file(calib / "stats.safetensors")["model.layers.0.self_attn.k_absmax"]
    assert float(measured.max()) == pytest.approx(key_absmax, rel=1e-5)


def test_staged_layer_bounds_attention_to_a_sliding_window(tmp_path):
    """Mistral with a window shorter than the sequence: the staged layers' outputs equal transformers' hidden
    states, whose mask the model (not the layer) builds."""
    model = build_tiny_model(tmp_path / "mistral", architecture="mistral", layers=3, max_positions=128)
    config = AutoConfig.from_pretrained(model)
    config.sliding_window = 6
    hf = AutoModelForCausalLM.from_pretrained(model, config=config, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    tokens = torch.randint(3, 390, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True, output_attentions=True)
    expected, probabilities = out.hidden_states, out.attentions
    layerwise = LayerwiseModel(model)
    architecture = architecture_of(config.to_dict())
    assert architecture.window(config.to_dict()) == 6
    h = layerwise.embed([tokens[0].tolist()])[0][0]
    rotary = layerwise.position_embeddings(h[None])
    for index in range(layerwise.num_layers - 1):  # transformers' last hidden state has the final norm applied
        with layerwise.layer(index) as layer:
            staged = StagedLayer(layer, config.num_attention_heads, config.num_key_value_heads, head_dim(config),
                                 architecture=architecture, window=6)
            received = staged.attention_received(staged.attention_input(h), rotary)
            h = staged.forward(h, rotary)
        torch.testing.assert_close(h, expected[index + 1][0], rtol=1e-5, atol=1e-5)
        # what GPTQ weighs v_proj's tokens by: squared attention summed over the queries of each KV head
        group = config.num_attention_heads // config.num_key_value_heads
        squared = probabilities[index][0].square().sum(dim=1)  # [heads, keys]
        torch.testing.assert_close(received, squared.view(config.num_key_value_heads, group, -1).sum(dim=1),
                                   rtol=1e-5, atol=1e-6)


def test_awqs_declared_folds_leave_each_layer_unchanged(built):
    """Every fold the declaration allows (input scales into the norm or linear before a group, Gemma's norms
    as 1 + w) changes the weights and not the layer's output; a wrong fold would quantize a different model."""
    _, model, _, _ = built
    assert apply_every_fold(model)
