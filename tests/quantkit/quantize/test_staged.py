import pytest
import torch

from quantkit.algorithms.gptq import input_hessian
from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.quantize.staged import (STAGES, StagedLayer, evenly_spaced, gather_tokens, residual_token_weights, run_paired_stages,
                                      run_stages)


def staged_layer(layer, config, **options) -> StagedLayer:
    """A StagedLayer with the tiny model's head layout."""
    return StagedLayer(layer, config.num_attention_heads, config.num_key_value_heads,
                       config.hidden_size // config.num_attention_heads, **options)


def test_staged_layer_equals_the_transformers_layer(tiny_model):
    model = LayerwiseModel(tiny_model)
    config = model.config
    torch.manual_seed(0)
    hidden = [torch.randn(n, config.hidden_size) for n in (7, 19)]
    rotary = [model.position_embeddings(h[None]) for h in hidden]
    seen = []
    with model.layer(1) as layer:
        staged = staged_layer(layer, config)
        ours = run_stages(staged, hidden, rotary,
                          lambda names, inputs, residual: seen.append((names, len(inputs), residual is None)))
        reference = [model.run_layer(layer, h[None], r)[0] for h, r in zip(hidden, rotary)]
    # o_proj and down_proj (stages 1 and 3) add to the residual stream, and get it
    assert seen == [(names, 2, i in (0, 2)) for i, names in enumerate(STAGES)]
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bfloat16_forward_stays_within_bfloat16_rounding_of_float32_and_returns_float32(tiny_model):
    model = LayerwiseModel(tiny_model)
    config = model.config
    torch.manual_seed(0)
    hidden = torch.randn(23, config.hidden_size)
    rotary = model.position_embeddings(hidden[None])
    with model.layer(1) as layer:
        exact = staged_layer(layer, config).forward(hidden, rotary)
        low = staged_layer(layer, config, forward_dtype=torch.bfloat16).forward(hidden, rotary)
    assert low.dtype == torch.float32
    # what the layer adds to the stream, off by about bfloat16's 2^-9 relative rounding, not more, and not 0
    added, error = exact - hidden, low - exact
    relative = float(error.norm() / added.norm())
    assert 1e-4 < relative < 2e-2


def test_bfloat16_forward_casts_a_weight_again_after_a_method_replaces_or_edits_it(tiny_model):
    model = LayerwiseModel(tiny_model)
    config = model.config
    x = torch.randn(5, config.hidden_size)
    with model.layer(0) as layer:
        staged = StagedLayer(layer, 4, 2, config.hidden_size // 4, forward_dtype=torch.bfloat16)
        linear = layer.mlp.up_proj
        staged.apply(linear, x)
        linear.weight.data = torch.zeros_like(linear.weight)  # replaced, as methods load quantized weights
        assert staged.apply(linear, x).abs().max() == 0
        with torch.no_grad():
            linear.weight.add_(1.0)  # edited in place, as AWQ folds its scales
        torch.testing.assert_close(staged.apply(linear, x), x.bfloat16().float().sum(dim=-1, keepdim=True)
                                   .expand(-1, linear.out_features), rtol=1e-2, atol=1e-2)


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


@pytest.mark.parametrize("query_block", [128, 4])  # one block; four blocks, the last one short
def test_attention_received_equals_per_head_softmax_on_random_inputs(tiny_model, monkeypatch, query_block):
    # Against the definition, one query head at a time: sum over queries i >= j of softmax(q k^T / sqrt(d))_ij^2,
    # summed over the query heads of each KV head.
    from quantkit.calibration.observers import rotate_keys
    from quantkit.quantize import staged

    monkeypatch.setattr(staged, "RECEIVED_QUERY_BLOCK", query_block)

    model = LayerwiseModel(tiny_model)
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    torch.manual_seed(1)
    x = torch.randn(13, config.hidden_size)
    rotary = model.position_embeddings(x[None])
    with model.layer(0) as layer:
        received = StagedLayer(layer, heads, kv_heads, dim).attention_received(x, rotary)
        q = rotate_keys(layer.self_attn.q_proj(x).view(13, heads, dim).transpose(0, 1)[None], *rotary)[0]
        k = rotate_keys(layer.self_attn.k_proj(x).view(13, kv_heads, dim).transpose(0, 1)[None], *rotary)[0]
    expected = torch.zeros(kv_heads, 13)
    for h in range(heads):
        kv = h // (heads // kv_heads)
        scores = q[h] @ k[kv].T / dim ** 0.5
        probs = scores.masked_fill(torch.ones(13, 13, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        expected[kv] += probs.square().sum(dim=0)
    torch.testing.assert_close(received, expected, rtol=1e-5, atol=1e-6)


def test_attention_core_reuses_the_rotated_qk_of_attention_received_only_while_the_weights_are_unchanged(tiny_model):
    model = LayerwiseModel(tiny_model)
    config = model.config
    torch.manual_seed(2)
    x = torch.randn(9, config.hidden_size)
    rotary = model.position_embeddings(x[None])
    with model.layer(0) as layer:
        staged = staged_layer(layer, config)
        fresh = staged.attention_core(x, rotary)
        staged.attention_received(x, rotary)
        assert torch.equal(staged.attention_core(x, rotary), fresh) and not staged._rotated  # taken once
        staged.attention_received(x, rotary)
        layer.self_attn.q_proj.weight.data = layer.self_attn.q_proj.weight.data * 2  # a method replaces q
        replaced = staged.attention_core(x, rotary)
        staged.attention_received(x, rotary)
        with torch.no_grad():
            layer.self_attn.k_proj.weight.mul_(0.5)  # or edits k in place
        edited = staged.attention_core(x, rotary)
        staged.attention_received(x.clone(), rotary)  # another tensor with the same values is not "this x"
        assert torch.equal(staged.attention_core(x, rotary), edited)
    assert not torch.allclose(replaced, fresh) and not torch.allclose(edited, replaced)


def test_paired_stages_keep_the_reference_layer_untouched(tiny_model):
    # The hook changes the quantized stream's weights; the reference copy must still give the original
    # layer's outputs, and each stage's hook must see both streams' inputs.
    import copy

    model = LayerwiseModel(tiny_model)
    config = model.config
    torch.manual_seed(0)
    hidden = [torch.randn(n, config.hidden_size) for n in (7, 11)]
    other = [h + 0.1 * torch.randn_like(h) for h in hidden]
    rotary = [model.position_embeddings(h[None]) for h in hidden]
    with model.layer(1) as layer:
        original = run_stages(staged_layer(copy.deepcopy(layer), config), other, rotary, lambda *_: None)
        staged = staged_layer(layer, config)
        reference = staged_layer(copy.deepcopy(layer), config)
        seen = []

        def hook(names, inputs, reference_inputs, residual):
            seen.append((names, len(inputs), len(reference_inputs)))
            for name in names:
                staged.linear(name).weight.data.mul_(0.5)

        ours, theirs = run_paired_stages(staged, reference, hidden, other, rotary, hook)
    assert seen == [(names, 2, 2) for names in STAGES]
    for a, b in zip(theirs, original):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert all(not torch.allclose(a, b, atol=1e-3) for a, b in zip(ours, original))


def test_evenly_spaced_picks_spread_over_the_range_and_all_when_asked_for_more():
    assert evenly_spaced(4, 10) == [0, 2, 5, 7]
    assert evenly_spaced(3, 3) == evenly_spaced(5, 3) == evenly_spaced(0, 3) == [0, 1, 2]


def test_residual_token_weights_are_one_over_the_mean_square_of_the_stream():
    residual = [torch.tensor([[2.0, 2.0], [100.0, 0.0]]), torch.tensor([[0.0, 3.0]])]
    # mean squares 4, 5000 (a massive token weighs little) and 4.5, one sample after another
    weights = residual_token_weights(residual, [2, 1])
    torch.testing.assert_close(weights[0], torch.tensor([1 / 4, 1 / 5000]))
    torch.testing.assert_close(weights[1], torch.tensor([1 / 4.5]))
    x = torch.tensor([[1.0, 2.0, 5.0], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(input_hessian([x], token_weights=weights[:1]), x.T @ torch.diag(weights[0]) @ x)


def test_gather_tokens_lays_samples_side_by_side_and_checks_their_count():
    per_sample = [torch.arange(6.0).view(2, 3), torch.tensor([[7.0], [8.0]])]
    torch.testing.assert_close(gather_tokens(iter(per_sample), [3, 1], rows=2),
                               torch.tensor([[0.0, 1.0, 2.0, 7.0], [3.0, 4.0, 5.0, 8.0]]))
    with pytest.raises(ValueError):
        gather_tokens(iter(per_sample), [3, 1, 2], rows=2)