import pytest

from quantkit.errors import QuantkitError
from quantkit.recipes import load_recipe, shipped_recipe_names


def test_shipped_recipes_load():
    names = shipped_recipe_names()
    for name in ("rtn-w4a16-g64", "awq-w4a16-g64", "gptq-w4a16-g64", "gptq-w4a16-g64-actorder",
                 "gptq-w4a16-g64-fp-targets"):
        assert name in names
        recipe = load_recipe(name)
        assert recipe.name == name and recipe.weights.group_size == 64
    plain, actorder, fp_targets = (load_recipe(f"gptq-w4a16-g64{suffix}").quantization
                                   for suffix in ("", "-actorder", "-fp-targets"))
    # -actorder is the plain recipe with act order and coordinate descent (damped at 0.3); -fp-targets adds the
    # full-precision targets, its descent at GPTQ's damping
    assert actorder == plain.model_copy(update={"act_order": True, "coordinate_descent": 3, "descent_dampening": 0.3})
    assert fp_targets == actorder.model_copy(update={"fp_targets": 0.25, "fp_target_samples": 16,
                                                     "descent_dampening": None})


def test_fp_target_samples_without_fp_targets_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: x\nquantization: {method: gptq, fp_target_samples: 16}\n"
                    "weights: {bits: 4, group_size: 64}\n")
    with pytest.raises(QuantkitError, match=r"r\.yaml: .*fp_target_samples .* set fp_targets above 0"):
        load_recipe(str(path))


def test_unknown_key_names_the_key_and_the_file(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: x\nquantization: {method: gptq, dampning: 0.1}\n")
    with pytest.raises(QuantkitError, match=r"r\.yaml: 'quantization\.gptq\.dampning': unknown key"):
        load_recipe(str(path))


@pytest.mark.parametrize("body, fragment", [
    ("name: x\nquantization: {method: magic}\n", "'quantization'"),
    ("name: x\nquantization: {method: rtn}\nweights: {bits: 3}\n", "'weights.bits'"),
    ("name: x\nquantization: {method: rtn}\nweights: {group_size: 0}\n", "group_size must be"),
    ("name: x\nquantization: {method: rtn\n", "invalid YAML"),
    ("- just a list\n", "must be a YAML mapping"),
    ("name: x\nquantization: {method: fp8}\nweights: {bits: 4, group_size: 64}\n", "per output channel"),
    ("name: x\nquantization: {method: fp8, activations: per-head}\n", "'quantization.fp8.activations'"),
    ("name: x\nquantization: {method: rtn}\nkv_cache_scheme: {num_bits: 4}\n", "'kv_cache_scheme.num_bits'"),
])
def test_invalid_recipes_are_one_clear_error(tmp_path, body, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(QuantkitError, match="bad.yaml") as info:
        load_recipe(str(path))
    assert fragment in str(info.value)


def test_missing_recipe_lists_the_shipped_ones():
    with pytest.raises(QuantkitError, match="awq-w4a16-g64"):
        load_recipe("no-such-recipe")


def test_targets_and_ignore_patterns(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: x\nquantization: {method: rtn}\nignore: [lm_head, 're:.*\\.0\\.mlp\\..*', down_proj]\n")
    recipe = load_recipe(str(path))
    assert recipe.is_quantized("model.layers.1.self_attn.q_proj")
    assert not recipe.is_quantized("model.layers.0.mlp.gate_proj")
    assert not recipe.is_quantized("model.layers.3.mlp.down_proj")
    assert not recipe.is_quantized("lm_head")


def test_fp8_and_kv_cache_recipes_say_what_data_they_need():
    assert not load_recipe("fp8-w8a8-dynamic").needs_calibration
    assert load_recipe("fp8-w8a8-static").needs_calibration
    assert not load_recipe("rtn-w4a16-g64").needs_calibration
    kv = load_recipe("awq-w4a16-g64-kv-fp8")
    assert kv.kv_cache_scheme is not None and kv.needs_calibration
    assert kv.quantization == load_recipe("awq-w4a16-g64").quantization


def test_weights_label_says_bits_group_and_symmetry(tmp_path):
    assert load_recipe("gptq-w4a16-g64").weights_label == "int4 g64 asym"
    assert load_recipe("gptq-w4a16-g64-sym").weights_label == "int4 g64 sym"
    assert load_recipe("fp8-w8a8-dynamic").weights_label == "fp8 channel"
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nquantization: {method: rtn}\nweights: {bits: 8, group_size: -1, symmetric: true}\n")
    assert load_recipe(str(path)).weights_label == "int8 channel sym"
