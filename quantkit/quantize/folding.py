"""Per-input-channel scales folded into the op before a group of linears: the linears' input columns are
multiplied by s and the previous op's outputs divided by s, so the layer computes the same function. AWQ and
SmoothQuant both move scale this way; where each stage's scales may go is the architecture's declaration.
"""

from __future__ import annotations

import torch

from quantkit.quantize.staged import StagedLayer


def previous_ops(staged: StagedLayer) -> list[str | None]:
    """What each stage's input scales fold into (None: nowhere). A linear takes them only where its outputs
    are the stage's inputs one for one: v -> o not with grouped KV heads."""
    previous = []
    for group in staged.input_groups:
        prev = group.scales_into
        if prev is not None and isinstance(staged.layer.get_submodule(prev), torch.nn.Linear):
            if staged.linear(prev).weight.shape[0] != staged.linear(group.linears[0]).weight.shape[1]:
                prev = None
        previous.append(prev)
    return previous


def fold_input_scales(staged: StagedLayer, prev: str, names: tuple[str, ...], scales: torch.Tensor) -> bool:
    """Multiply the linears' input columns by s and divide the previous op's outputs by s. Returns whether
    the previous op is a linear (its rows were divided: a method that tracks effective weights must know)."""
    previous = staged.layer.get_submodule(prev)
    is_linear = isinstance(previous, torch.nn.Linear)
    with torch.no_grad():
        if is_linear:
            previous.weight.div_(scales[:, None].to(previous.weight.dtype))
            if previous.bias is not None:
                previous.bias.div_(scales.to(previous.bias.dtype))
        else:  # RMSNorm: y = (offset + w) * x / rms(x), offset 1 in Gemma's
            offset = staged.architecture.norm_offset
            if offset:
                previous.weight.add_(offset)
            previous.weight.div_(scales.to(previous.weight.dtype))
            if offset:
                previous.weight.sub_(offset)
        for name in names:
            linear = staged.linear(name)
            linear.weight.mul_(scales[None, :].to(linear.weight.dtype))
    return is_linear
