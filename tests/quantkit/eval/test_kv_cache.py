"""The FP8 KV-cache simulation on a transformers model, and reading scales from a checkpoint."""

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from quantkit.errors import QuantkitError
from quantkit.eval.kv_cache import fp8_kv_cache, read_kv_scales


@pytest.fixture(scope="module")
def model(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


def test_fp8_kv_changes_logits_and_restores_the_model(model):
    tokens = torch.randint(3, 390, (1, 32))
    before = logits(model, tokens)
    with pytest.warns(UserWarning, match="no KV-cache scales"), fp8_kv_cache(model, None):
        rounded = logits(model, tokens)
    assert not torch.equal(before, rounded)
    torch.testing.assert_close(logits(model, tokens), before, rtol=0, atol=0)
    assert model.config._attn_implementation != "quantkit_fp8_kv"


def test_scales_matter_tiny_scales_clip_everything(model):
    tokens = torch.randint(3, 390, (1, 32))
    before = logits(model, tokens)
    with fp8_kv_cache(model, {0: (1e-6, 1e-6), 1: (1e-6, 1e-6)}):
        clipped = logits(model, tokens)
    with fp8_kv_cache(model, {0: (0.01, 0.01), 1: (0.01, 0.01)}):
        fine = logits(model, tokens)
    assert (clipped - before).abs().max() > 10 * (fine - before).abs().max()


def test_generate_with_fp8_kv_matches_a_full_forward(model):
    # The cache holds unrounded K/V and every step rounds them again: identical to rounding once.
    prompt = torch.randint(3, 390, (1, 12))
    scales = {0: (0.005, 0.004), 1: (0.006, 0.003)}
    with fp8_kv_cache(model, scales):
        out = model.generate(prompt, max_new_tokens=8, do_sample=False)
        step_logits = logits(model, out[:, :-1])[0, -8:]
    assert torch.equal(step_logits.argmax(-1), out[0, -8:])


def test_read_kv_scales(tmp_path):
    save_file({"model.layers.0.self_attn.k_scale": torch.tensor([0.5]),
               "model.layers.0.self_attn.v_scale": torch.tensor([0.25]),
               "model.norm.weight": torch.ones(4)}, tmp_path / "model.safetensors")
    assert read_kv_scales(tmp_path) == {0: (0.5, 0.25)}
    save_file({"model.layers.0.self_attn.k_scale": torch.tensor([0.5])}, tmp_path / "model.safetensors")
    with pytest.raises(QuantkitError, match=r"layers \[0\] have a k_scale or a v_scale but not both"):
        read_kv_scales(tmp_path)


def test_scales_must_cover_every_layer(model):
    with pytest.raises(QuantkitError, match="cover layers"):
        with fp8_kv_cache(model, {0: (1.0, 1.0)}):
            pass
