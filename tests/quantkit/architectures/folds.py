"""The check both architecture test files run: the declared folds (AWQ's and SmoothQuant's) change a layer's weights, not its output."""

import torch

from quantkit.architectures import architecture_of
from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.models import head_dim
from quantkit.quantize.folding import fold_input_scales, previous_ops
from quantkit.quantize.staged import StagedLayer


def apply_every_fold(model) -> list[tuple[tuple[str, ...], str]]:
    """Fold random scales into every op layer 0's declaration allows, assert the layer's output is unchanged
    (float tolerance), and return the folds (group linears, the op they folded into)."""
    layerwise = LayerwiseModel(model)
    config = layerwise.config
    architecture = architecture_of(config.to_dict())
    hidden = torch.randn(20, config.hidden_size, generator=torch.Generator().manual_seed(0))
    rotary = layerwise.position_embeddings(hidden[None], 0)
    with layerwise.layer(0) as layer:
        staged = StagedLayer(layer, config.num_attention_heads, config.num_key_value_heads, head_dim(config),
                             architecture=architecture, window=architecture.layer_window(config.to_dict(), 0))
        before = staged.forward(hidden, rotary)
        folds = [(group.linears, prev) for group, prev in zip(staged.input_groups, previous_ops(staged)) if prev]
        generator = torch.Generator().manual_seed(1)
        for names, prev in folds:
            scales = torch.rand(staged.linear(names[0]).in_features, generator=generator) + 0.5
            fold_input_scales(staged, prev, names, scales)
        torch.testing.assert_close(staged.forward(hidden, rotary), before, rtol=1e-4, atol=1e-4)
    return folds
