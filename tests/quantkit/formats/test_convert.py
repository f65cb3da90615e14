"""`quantkit convert` end to end on the tiny Llama: lossless round trips through the CLI, and refusals (exit 2)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from quantkit.errors import QuantkitError
from quantkit.formats.checkpoints import read_checkpoint
from quantkit.formats.convert import convert
from quantkit.models import load_model
from tests.quantkit.formats.test_checkpoints import SIDE_FILES, write_tiny


@pytest.fixture(scope="module")
def sources(tiny_model, tmp_path_factory) -> dict:
    """compressed-tensors checkpoints of the tiny Llama, one per scheme the tests convert."""
    root = tmp_path_factory.mktemp("convert-src")
    schemes = {"asym": {}, "sym": {"symmetric": True}, "w8": {"bits": 8, "symmetric": True},
               "actorder": {"actorder": "group"}, "bf16": {"dtype": torch.bfloat16}}
    paths = {}
    for name, kwargs in schemes.items():
        paths[name] = root / name
        write_tiny(paths[name], tiny_model, "compressed-tensors", **kwargs)
    return paths


def assert_same_files(a, b) -> None:
    """Bit-identical tensors and the same config.json."""
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert ta.keys() == tb.keys()
    for key in ta:
        assert ta[key].dtype == tb[key].dtype and torch.equal(ta[key], tb[key]), key
    assert json.loads((a / "config.json").read_text()) == json.loads((b / "config.json").read_text())


@pytest.mark.parametrize("scheme,via", [("asym", "autoawq"), ("sym", "autoawq"), ("sym", "gptq"),
                                        ("asym", "gptq"), ("w8", "gptq"), ("actorder", "gptq")])
def test_round_trip_through_the_cli_is_bit_identical(sources, tmp_path, run_cli, scheme, via):
    src = sources[scheme]
    code, out, err = run_cli("convert", src, "--to", via, "--out", tmp_path / "mid")
    assert code == 0, err
    assert f"compressed-tensors -> {via}: 14 quantized linears, dequantized weights identical" in out
    code, _, err = run_cli("convert", tmp_path / "mid", "--to", "compressed-tensors", "--out", tmp_path / "back")
    assert code == 0, err
    assert_same_files(src, tmp_path / "back")
    for name in (*SIDE_FILES, "recipe.yaml"):
        assert (tmp_path / "mid" / name).read_bytes() == (src / name).read_bytes()
    provenance = json.loads((tmp_path / "back" / "quantkit.json").read_text())
    assert provenance["format"] == "compressed-tensors"
    hop = provenance["converted_from"]
    assert hop["format"] == via and hop["path"] == str((tmp_path / "mid").resolve())
    assert hop["converted_from"] == {"path": str(src.resolve()), "format": "compressed-tensors",
                                     "quantkit": hop["quantkit"]}


def test_symmetric_to_gptq_is_v1(sources, tmp_path, run_cli):
    code, _, err = run_cli("convert", sources["sym"], "--to", "gptq", "--out", tmp_path / "g")
    assert code == 0 and "checkpoint_format gptq (v1" in err
    config = json.loads((tmp_path / "g" / "config.json").read_text())["quantization_config"]
    assert (config["checkpoint_format"], config["sym"], config["desc_act"]) == ("gptq", True, False)
    assert json.loads((tmp_path / "g" / "quantize_config.json").read_text()) == config
    qzeros = load_file(str(tmp_path / "g" / "model.safetensors"))["model.layers.0.mlp.up_proj.qzeros"]
    assert set(qzeros.flatten().tolist()) == {0x77777777}


def test_asymmetric_to_gptq_says_v2(sources, tmp_path, run_cli):
    code, _, err = run_cli("convert", sources["asym"], "--to", "gptq", "--out", tmp_path / "g")
    assert code == 0 and "gptq_v2" in err
    assert json.loads((tmp_path / "g" / "config.json").read_text())["quantization_config"]["checkpoint_format"] \
        == "gptq_v2"


def test_converted_checkpoint_loads_to_the_same_logits(sources, tmp_path):
    convert(sources["asym"], "autoawq", tmp_path / "awq")
    tokens = torch.randint(3, 390, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path / "awq")(tokens).logits, load_model(sources["asym"])(tokens).logits)


@pytest.mark.parametrize("scheme,to,match", [
    ("w8", "autoawq", "AutoAWQ GEMM stores 4-bit weights only, not 8-bit"),
    ("actorder", "autoawq", "act-order \\(permuted g_idx\\) groups cannot be stored in AutoAWQ GEMM"),
    ("bf16", "autoawq", "scales are not exactly representable in float16"),
    ("bf16", "gptq", "scales are not exactly representable in float16"),
    ("sym", "compressed-tensors", "is already compressed-tensors"),
    ("sym", "marlin", "unknown --to 'marlin'"),
])
def test_refusals_exit_2_with_one_line_and_leave_nothing(sources, tmp_path, run_cli, scheme, to, match):
    if scheme == "bf16":  # exact in bf16, but below fp16's normal range
        _make_scale_bf16_only(sources[scheme])
    code, out, err = run_cli("convert", sources[scheme], "--to", to, "--out", tmp_path / "out")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(match, " ".join(err.split())), err
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def _make_scale_bf16_only(path) -> None:
    from safetensors.torch import save_file

    tensors = load_file(str(path / "model.safetensors"))
    scale = tensors["model.layers.1.mlp.down_proj.weight_scale"]
    scale[0, 0] = 2**-20 * (1 + 2**-7)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_dense_source_and_existing_output_are_refused(tiny_model, sources, tmp_path):
    with pytest.raises(QuantkitError, match="dense checkpoint"):
        convert(tiny_model, "gptq", tmp_path / "x")
    (tmp_path / "taken").mkdir()
    with pytest.raises(QuantkitError, match="already exists"):
        convert(sources["sym"], "gptq", tmp_path / "taken")
    convert(sources["sym"], "gptq", tmp_path / "taken", overwrite=True)
    assert read_checkpoint(tmp_path / "taken")[2]


def test_conversion_holds_one_source_module_at_a_time(sources, tmp_path, monkeypatch):
    """The source is read a module at a time (to check, to write, to verify), never whole."""
    import gc
    import weakref

    from quantkit.formats import compressed_tensors as ct

    alive, most, reads = [], 0, 0
    read_weight = ct.read_weight

    def tracked(*args, **kwargs):
        nonlocal most, reads
        gc.collect()
        alive[:] = [ref for ref in alive if ref() is not None]
        weight = read_weight(*args, **kwargs)
        alive.append(weakref.ref(weight))
        most, reads = max(most, len(alive)), reads + 1
        return weight

    monkeypatch.setattr(ct, "read_weight", tracked)
    convert(sources["asym"], "gptq", tmp_path / "g")
    assert reads == 3 * 14  # 14 linears: checked, written, verified
    assert most <= 2  # the one being read, and the previous one until its loop variable is rebound


INT8_RTN = "name: int8-rtn\nquantization: {method: int8, rounding: rtn, smoothquant: false}\n" \
           "weights: {bits: 8, group_size: -1, symmetric: true}\n"


@pytest.mark.parametrize("recipe, weight", [("fp8-w8a8-dynamic", "Fp8Weight"), (INT8_RTN, "Int8Weight")])
def test_w8a8_weights_are_not_convertible(tiny_model, tmp_path, run_cli, recipe, weight):
    from quantkit.quantize.run import QuantizeOptions, quantize

    if recipe == INT8_RTN:
        (tmp_path / "int8.yaml").write_text(recipe)
        recipe = str(tmp_path / "int8.yaml")
    quantize(QuantizeOptions(model=str(tiny_model), recipe=recipe, out=tmp_path / "w8a8"))
    code, _, err = run_cli("convert", tmp_path / "w8a8", "--to", "gptq", "--out", tmp_path / "x")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(rf"model\.layers\.\d+\.\S+ is a {weight}, not weight-only integer codes", err), err
    assert not (tmp_path / "x").exists()


def test_kv_cache_scales_survive_a_round_trip_through_gptq(tiny_model, tmp_path):
    from quantkit.eval.kv_cache import read_kv_scales
    from quantkit.quantize.run import QuantizeOptions, quantize
    from tests.conftest import chat_rows, write_jsonl

    recipe = tmp_path / "rtn-kv.yaml"
    recipe.write_text("name: rtn-kv\nquantization: {method: rtn}\nweights: {bits: 4, group_size: 64, symmetric: true}\n"
                      "kv_cache_scheme: {type: float, num_bits: 8, strategy: tensor}\n")
    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(8))
    quantize(QuantizeOptions(model=str(tiny_model), recipe=str(recipe), dataset=str(data), num_samples=4,
                             max_seq_len=32, out=tmp_path / "gptq", format="gptq"))
    convert(tmp_path / "gptq", "compressed-tensors", tmp_path / "ct")
    convert(tmp_path / "ct", "gptq", tmp_path / "back")
    assert read_kv_scales(tmp_path / "back") == read_kv_scales(tmp_path / "ct") == read_kv_scales(tmp_path / "gptq")
    assert len(read_kv_scales(tmp_path / "ct")) == 2
    config = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert config["kv_cache_scheme"] is not None
