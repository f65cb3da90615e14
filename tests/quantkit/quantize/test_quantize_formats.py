"""`quantkit quantize --format autoawq|gptq`: the same weights as the compressed-tensors output, in the
other layouts, read back by quantkit's readers; recipes a format cannot hold are refused up front."""

import json

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.formats.checkpoints import detect_format, read_checkpoint
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
