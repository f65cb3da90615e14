"""The layer-by-layer pass must see exactly what a whole-model forward sees."""

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.calibration.observers import ChannelStats
from quantkit.calibration.run import collect_statistics


def _samples():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 390, (n,), generator=g).tolist() for n in (17, 5, 40)]


def _whole_model_reference(model_dir, samples):
    """Hooks on the full transformers model; K/V from its own cache (keys after RoPE)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    stats = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and ".layers." in name:
            stats[name] = ChannelStats.empty(module.in_features)
            handles.append(module.register_forward_pre_hook(lambda m, a, n=name: stats[n].update(a[0])))
    layers = model.config.num_hidden_layers
    k_absmax = torch.zeros(layers, model.config.num_key_value_heads)
    v_absmax = torch.zeros_like(k_absmax)
    with torch.no_grad():
        for ids in samples:
            out = model(torch.tensor([ids]), use_cache=True)
            for i, layer in enumerate(out.past_key_values.layers):
                k_absmax[i] = torch.maximum(k_absmax[i], layer.keys.abs().amax(dim=(0, 2, 3)))
                v_absmax[i] = torch.maximum(v_absmax[i], layer.values.abs().amax(dim=(0, 2, 3)))
    for h in handles:
        h.remove()
    return stats, k_absmax, v_absmax


def test_layerwise_statistics_match_a_whole_model_forward(tiny_model):
    samples = _samples()
    ours = collect_statistics(LayerwiseModel(tiny_model), samples)
    ref, k_ref, v_ref = _whole_model_reference(tiny_model, samples)
    for name, stats in ref.items():
        assert stats.count == sum(map(len, samples))
        torch.testing.assert_close(ours[f"{name}.input_absmax"], stats.absmax, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours[f"{name}.input_mean_abs"], stats.mean_abs, rtol=1e-5, atol=1e-6)
    for i in range(k_ref.shape[0]):
        torch.testing.assert_close(ours[f"model.layers.{i}.self_attn.k_absmax"], k_ref[i], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours[f"model.layers.{i}.self_attn.v_absmax"], v_ref[i], rtol=1e-5, atol=1e-6)
    assert all(t.abs().sum() > 0 for t in ours.values())  # every statistic was really observed


def test_only_one_layer_holds_weights_at_a_time(tiny_model):
    model = LayerwiseModel(tiny_model)
    seen = []

    def materialized_layers():
        return sum(not layer.self_attn.q_proj.weight.is_meta for layer in model.decoder.layers)

    collect_statistics(model, _samples(), on_layer=lambda done, total: seen.append(materialized_layers()))
    assert seen == [0, 0]  # after each layer its weights are dropped again
    with model.layer(1):
        assert materialized_layers() == 1 and model.decoder.layers[0].self_attn.q_proj.weight.is_meta
