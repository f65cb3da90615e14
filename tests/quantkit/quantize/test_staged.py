import torch

from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.quantize.staged import STAGES, StagedLayer, run_stages


def test_staged_layer_equals_the_transformers_layer(tiny_model):
    model = LayerwiseModel(tiny_model)
    config = model.config
    torch.manual_seed(0)
    hidden = [torch.randn(n, config.hidden_size) for n in (7, 19)]
    rotary = [model.position_embeddings(h[None]) for h in hidden]
    seen = []
    with model.layer(1) as layer:
        staged = StagedLayer(layer, config.num_attention_heads, config.num_key_value_heads,
                             config.hidden_size // config.num_attention_heads)
        ours = run_stages(staged, hidden, rotary, lambda names, inputs: seen.append((names, len(inputs))))
        reference = [model.run_layer(layer, h[None], r)[0] for h, r in zip(hidden, rotary)]
    assert seen == [(names, 2) for names in STAGES]
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
