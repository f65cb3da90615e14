"""`quantkit quantize` on the other Llama-family architectures it promises: Qwen2 (q/k/v biases, which AWQ's
v -> o fold must divide too) and Mistral. A real consumer (transformers + compressed-tensors) loads each
checkpoint with our dequantized model's logits, and every method still beats plain rounding."""

import pytest
import torch
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from quantkit.models import load_model
from tests.conftest import build_tiny_model, chat_rows, write_jsonl
from tests.quantkit.quantize.reports import assert_beats_rounding

# (architecture, KV heads): Qwen2 without grouped-query attention, so AWQ folds v_proj's scales into o_proj
# and has to divide v_proj's bias as well.
ARCHITECTURES = [("qwen2", 4), ("qwen2", 2), ("mistral", 2)]
RECIPES = ("awq-w4a16-g64", "gptq-w4a16-g64")


@pytest.fixture(scope="module", params=ARCHITECTURES, ids=lambda a: f"{a[0]}-kv{a[1]}")
def checkpoints(request, tmp_path_factory):
    from quantkit.quantize.run import QuantizeOptions, quantize

    architecture, kv_heads = request.param
    root = tmp_path_factory.mktemp(f"{architecture}-kv{kv_heads}")
    model = build_tiny_model(root / "model", architecture=architecture, kv_heads=kv_heads)
    data = write_jsonl(root / "calib.jsonl", chat_rows(24))
    return {recipe: (root / recipe, quantize(QuantizeOptions(model=str(model), recipe=recipe, dataset=str(data),
                                                             num_samples=16, max_seq_len=64, out=root / recipe)))
            for recipe in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES)
def test_transformers_loads_the_checkpoint_with_our_logits(checkpoints, recipe):
    path, _ = checkpoints[recipe]
    theirs = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
    ours = load_model(path)
    tokens = torch.randint(3, 390, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("recipe", RECIPES)
def test_methods_beat_rounding(checkpoints, recipe):
    assert_beats_rounding(checkpoints[recipe][1], linears=2 * 7)


def test_awq_folds_into_v_proj_with_its_bias_without_changing_the_layer(tmp_path):
    from quantkit.calibration.layerwise import LayerwiseModel
    from quantkit.quantize.folding import fold_input_scales, previous_ops
    from quantkit.quantize.staged import StagedLayer

    model = LayerwiseModel(build_tiny_model(tmp_path / "qwen2", architecture="qwen2", kv_heads=4))
    hidden = torch.randn(9, 64)
    rotary = model.position_embeddings(hidden[None])
    with model.layer(0) as layer:
        staged = StagedLayer(layer, 4, 4, 16)
        assert previous_ops(staged)[1] == "self_attn.v_proj"
        assert layer.self_attn.v_proj.bias.abs().sum() > 0
        before = staged.forward(hidden, rotary)
        assert fold_input_scales(staged, "self_attn.v_proj", ("self_attn.o_proj",), torch.rand(64) + 0.5)
        torch.testing.assert_close(staged.forward(hidden, rotary), before, rtol=1e-4, atol=1e-5)
