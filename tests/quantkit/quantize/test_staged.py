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


def test_attention_received_hand_case_uniform_attention(tiny_model):
    # With q = 0 every query attends uniformly to itself and all earlier tokens: a_ij = 1 / (i + 1),
    # so token j receives sum_{i >= j} 1 / (i + 1)^2 from each of the 2 query heads per KV head.
    model = LayerwiseModel(tiny_model)
    config = model.config
    x = torch.randn(5, config.hidden_size)
    with model.layer(0) as layer:
        layer.self_attn.q_proj.weight.data.zero_()
        staged = StagedLayer(layer, 4, 2, config.hidden_size // 4)
        received = staged.attention_received(x, model.position_embeddings(x[None]))
    expected = torch.tensor([sum(1 / (i + 1) ** 2 for i in range(j, 5)) for j in range(5)]) * 2
    torch.testing.assert_close(received, expected.expand(2, 5))
