"""`quantkit quantize --format autoawq|gptq`: the same weights as the compressed-tensors output, in the
other layouts, read back by quantkit's readers; recipes a format cannot hold are refused up front;
checkpoints over the shard size come out sharded and read back the same."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from quantkit.errors import QuantkitError
from quantkit.formats.checkpoints import detect_format, read_checkpoint
from quantkit.models import load_model
from quantkit.quantize.run import QuantizeOptions, quantize


def run(tiny_model, recipe, out, fmt):
    return quantize(QuantizeOptions(model=str(tiny_model), recipe=recipe, out=out, format=fmt))


@pytest.mark.parametrize("fmt, recipe", [("autoawq", "rtn-w4a16-g64"), ("gptq", "rtn-w4a16-g64")])
def test_same_weights_in_every_format(tiny_model, tmp_path, fmt, recipe):
    run(tiny_model, recipe, tmp_path / "ct", "compressed-tensors")
    run(tiny_model, recipe, tmp_path / fmt, fmt)
    assert detect_format(tmp_path / fmt) == fmt
    _, dense_ct, weights_ct = read_checkpoint(tmp_path / "ct")
    _, dense_other, weights_other = read_checkpoint(tmp_path / fmt)
    assert set(weights_ct) == set(weights_other) and len(weights_ct) == 14
    for name, weight in weights_ct.items():
        # The tiny model is float32, so compressed-tensors keeps fp32 scales while the others round them to
        # fp16 first: a code may flip by one step where a value sits on a rounding boundary, no more.
        other, ours = weights_other[name].dequantize(), weight.dequantize()
        close = (other - ours).abs() <= 2e-3 * ours.abs() + 1e-5
        assert close.float().mean() > 0.999, name
        assert (other - ours).abs().max() <= 1.01 * float(weight.scale.max()), name
        assert torch.equal(weights_other[name].scale.half().float(), weights_other[name].scale)
    assert (tmp_path / fmt / "recipe.yaml").is_file() and (tmp_path / fmt / "tokenizer.json").is_file()
    provenance = json.loads((tmp_path / fmt / "quantkit.json").read_text())
    assert provenance["format"] == fmt


@pytest.mark.parametrize("fmt, recipe, fragment", [
    ("autoawq", "fp8-w8a8-dynamic", "FP8"),
    ("gptq", "fp8-w8a8-dynamic", "FP8"),
    ("safetensors", "rtn-w4a16-g64", "unknown --format"),
])
def test_formats_refuse_what_they_cannot_hold(tiny_model, tmp_path, fmt, recipe, fragment):
    with pytest.raises(QuantkitError, match=fragment):
        run(tiny_model, recipe, tmp_path / "out", fmt)
    assert not (tmp_path / "out").exists()


def test_autoawq_refuses_8_bit(tiny_model, tmp_path):
    recipe = tmp_path / "w8.yaml"
    recipe.write_text("name: rtn-w8\nquantization: {method: rtn}\nweights: {bits: 8, group_size: 64}\n")
    with pytest.raises(QuantkitError, match="4-bit weights only"):
        run(tiny_model, str(recipe), tmp_path / "out", "autoawq")
    run(tiny_model, str(recipe), tmp_path / "gptq8", "gptq")
    _, _, weights = read_checkpoint(tmp_path / "gptq8")
    assert {w.bits for w in weights.values()} == {8}


@pytest.mark.parametrize("fmt", ["compressed-tensors", "autoawq", "gptq"])
def test_a_checkpoint_over_the_shard_size_is_sharded_and_reads_back_the_same(tiny_model, tmp_path, fmt):
    whole = quantize(QuantizeOptions(model=str(tiny_model), recipe="rtn-w4a16-g64", out=tmp_path / "whole",
                                     format=fmt))
    quantize(QuantizeOptions(model=str(tiny_model), recipe="rtn-w4a16-g64", out=tmp_path / "sharded", format=fmt,
                             max_shard_bytes=16 * 1024))
    shards = sorted((tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert [p.name for p in (tmp_path / "whole").glob("*.safetensors")] == ["model.safetensors"]
    config_whole, dense_whole, weights_whole = read_checkpoint(tmp_path / "whole")
    config_sharded, dense_sharded, weights_sharded = read_checkpoint(tmp_path / "sharded")
    assert config_sharded == config_whole and len(weights_sharded) == len(whole.reports) == 14
    assert set(dense_sharded) == set(dense_whole) and all(torch.equal(dense_sharded[k], v) for k, v in dense_whole.items())
    for name, weight in weights_whole.items():
        assert torch.equal(weights_sharded[name].dequantize(), weight.dequantize()), name
    if fmt == "compressed-tensors":  # a real consumer reads the index and every shard
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "sharded", dtype=torch.float32,
                                                      quantization_config=CompressedTensorsConfig(dequantize=True))
        tokens = torch.randint(3, 390, (2, 24))
        with torch.no_grad():
            torch.testing.assert_close(theirs(tokens).logits, load_model(tmp_path / "whole")(tokens).logits,
                                       rtol=1e-4, atol=1e-4)


def test_a_shard_size_below_one_megabyte_is_refused(tiny_model, tmp_path, run_cli):
    code, _, err = run_cli("quantize", "--model", tiny_model, "--recipe", "rtn-w4a16-g64", "--out", tmp_path / "o",
                           "--max-shard-mb", "0")
    assert code == 2 and "--max-shard-mb" in err
    assert not (tmp_path / "o").exists()
