"""Helpers for the per-method tests: the tiny random Llama's layers, their inputs and a GPTQ recipe."""

import torch

from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.quantize.methods.gptq import GPTQ
from quantkit.quantize.staged import StagedLayer
from quantkit.recipes import Recipe


def gptq_recipe(**options) -> Recipe:
    return Recipe.model_validate({"name": "t", "quantization": {"method": "gptq", **options},
                                  "weights": {"bits": 4, "group_size": 32}})


def staged_layer(model: LayerwiseModel, layer, forward_dtype: torch.dtype = torch.float32) -> StagedLayer:
    c = model.config
    return StagedLayer(layer, c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads,
                       forward_dtype=forward_dtype)


def layer_inputs(model: LayerwiseModel) -> tuple[list[torch.Tensor], list]:
    """Layer 0's inputs and rotary tables for 24 random token sequences."""
    torch.manual_seed(0)
    samples = [torch.randint(3, 390, (48,)).tolist() for _ in range(24)]
    hidden = [h[0] for h in model.embed(samples)]
    return hidden, [model.position_embeddings(h[None]) for h in hidden]


def streams_after_layer_0(model: LayerwiseModel) -> tuple[list, list, list, list]:
    """Rotary tables, layer 1's full-precision and quantized inputs (layer 0 run as is, and GPTQ'd), and
    the full-precision layer 1's outputs: what fp_targets are fitted to."""
    hidden, rotary = layer_inputs(model)
    with model.layer(0) as layer:
        staged = staged_layer(model, layer)
        fp_hidden = [staged.forward(h, r) for h, r in zip(hidden, rotary)]
        q_hidden = GPTQ(gptq_recipe(), "model.layers.0").quantize_layer(staged, hidden, rotary).outputs
    with model.layer(1) as layer:
        fp_out = [staged_layer(model, layer).forward(h, r) for h, r in zip(fp_hidden, rotary)]
    return rotary, fp_hidden, q_hidden, fp_out
