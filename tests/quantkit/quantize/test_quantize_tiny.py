"""`quantkit quantize` end to end on the tiny random Llama: checkpoints that a real consumer
(transformers + compressed-tensors) loads with the same logits as our own dequantized model."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from quantkit.compute_dtype import resolve_compute_dtype
from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.models import load_model
from quantkit.quantize.folding import fold_input_scales
from quantkit.quantize.staged import StagedLayer
from tests.conftest import chat_rows, write_jsonl
from tests.quantkit.quantize.reports import assert_beats_rounding

RECIPES = ("rtn-w4a16-g64", "awq-w4a16-g64", "gptq-w4a16-g64", "gptq-w4a16-g64-actorder",
           "gptq-w4a16-g64-fp-targets")


@pytest.fixture(scope="module")
def checkpoints(tiny_model, tmp_path_factory):
    from quantkit.quantize.run import QuantizeOptions, quantize

    root = tmp_path_factory.mktemp("ckpts")
    data = write_jsonl(root / "calib.jsonl", chat_rows(24))
    out = {}
    for recipe in RECIPES:
        result = quantize(QuantizeOptions(model=str(tiny_model), recipe=recipe, dataset=str(data),
                                          num_samples=16, max_seq_len=64, out=root / recipe))
        out[recipe] = (root / recipe, result)
    return out


@pytest.mark.parametrize("recipe", RECIPES)
def test_transformers_loads_the_checkpoint_with_our_logits(checkpoints, recipe):
    path, _ = checkpoints[recipe]
    config = json.loads((path / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "pack-quantized"
    symmetric = config["config_groups"]["group_0"]["weights"]["symmetric"]
    # Asymmetric pack-quantized checkpoints (ours and llm-compressor's) only load through
    # compressed-tensors' dequantize path: its empty-model init expects unpacked zero points.
    extra = {} if symmetric else {"quantization_config": CompressedTensorsConfig(dequantize=True)}
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **extra).eval()
    ours = load_model(path)
    tokens = torch.randint(3, 390, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens).logits, rtol=1e-4, atol=1e-4)
    for name in ("recipe.yaml", "quantkit.json", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file(), name


@pytest.mark.parametrize("recipe", [r for r in RECIPES if not r.startswith("rtn")])
def test_methods_beat_rounding_on_every_layer_on_average(checkpoints, recipe):
    assert_beats_rounding(checkpoints[recipe][1], linears=2 * 7)


def test_provenance_says_what_the_hessians_and_forward_ran_in_on_this_machine(checkpoints):
    compute = {recipe: json.loads((path / "quantkit.json").read_text())["compute"]
               for recipe, (path, _) in checkpoints.items()}
    here = str(resolve_compute_dtype("auto")).removeprefix("torch.")
    for recipe in ("gptq-w4a16-g64", "gptq-w4a16-g64-fp-targets", "awq-w4a16-g64"):
        assert compute[recipe] == {"hessian": here, "forward": here}, recipe
    assert compute["rtn-w4a16-g64"] == {}


def test_input_scales_fold_into_the_previous_ops_without_changing_the_layer(tiny_model):
    model = LayerwiseModel(tiny_model)
    config = model.config
    hidden = torch.randn(9, config.hidden_size)
    rotary = model.position_embeddings(hidden[None])
    with model.layer(0) as layer:
        staged = StagedLayer(layer, 4, 2, config.hidden_size // 4)
        before = staged.forward(hidden, rotary)
        for prev, names, width in (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj",
                                                        "self_attn.v_proj"), config.hidden_size),
                                   ("mlp.up_proj", ("mlp.down_proj",), config.intermediate_size)):
            fold_input_scales(staged, prev, names, torch.rand(width) + 0.5)
        torch.testing.assert_close(staged.forward(hidden, rotary), before, rtol=1e-4, atol=1e-5)


def test_group_size_that_does_not_fit_names_layers_and_sizes(tiny_model, tmp_path, run_cli):
    recipe = tmp_path / "g48.yaml"
    recipe.write_text("name: g48\nquantization: {method: rtn}\nweights: {group_size: 48}\n")
    code, _, err = run_cli("quantize", "--model", tiny_model, "--recipe", recipe, "--out", tmp_path / "o")
    assert code == 2
    assert "group size 48 does not divide the input size of mlp.down_proj, mlp.gate_proj" in err
    assert "group sizes that fit every layer: 32, 64" in err
    assert not (tmp_path / "o").exists()


def test_closing_table_has_a_row_per_layer_with_method_and_weight_scheme(tiny_model, tmp_path, run_cli):
    recipe = tmp_path / "g32.yaml"
    recipe.write_text("name: g32\nquantization: {method: rtn}\nweights: {group_size: 32, symmetric: true}\n")
    code, out, _ = run_cli("quantize", "--model", tiny_model, "--recipe", recipe, "--out", tmp_path / "o")
    assert code == 0
    layers = json.loads((tiny_model / "config.json").read_text())["num_hidden_layers"]
    rows = [line for line in out.splitlines() if "model.layers." in line]
    assert len(rows) == layers
    assert all("rtn" in row and "int4 g32 sym" in row for row in rows)


def test_data_methods_need_data_and_unknown_architectures_are_refused(tiny_model, tmp_path, run_cli):
    code, _, err = run_cli("quantize", "--model", tiny_model, "--recipe", "gptq-w4a16-g64", "--out", tmp_path / "o")
    assert code == 2 and "needs calibration data" in err
    config = json.loads((tiny_model / "config.json").read_text())
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(config | {"architectures": ["GPT2LMHeadModel"]}))
    code, _, err = run_cli("quantize", "--model", other, "--recipe", "rtn-w4a16-g64", "--out", tmp_path / "o")
    assert code == 2 and "GPT2LMHeadModel" in err and "not supported yet" in err


def test_dataset_auto_is_refused_with_the_calibrate_command_to_run(tiny_model, tmp_path, run_cli):
    code, _, err = run_cli("quantize", "--model", tiny_model, "--recipe", "gptq-w4a16-g64", "--dataset", "auto",
                           "--out", tmp_path / "o")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "calibrate option" in err and "quantkit calibrate --dataset auto" in " ".join(err.split())
    assert not (tmp_path / "o").exists()
