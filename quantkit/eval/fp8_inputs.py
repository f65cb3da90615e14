"""Simulate W8A8 FP8 activations on a dequantized model: each FP8 linear's input goes through an fp8
round trip first, per token (dynamic) or at the checkpoint's static input_scale, so evaluation sees the
same inputs an FP8 GEMM would. Without this an FP8 W8A8 checkpoint would be scored as weight-only.
"""

from __future__ import annotations

from torch import nn

from quantkit.algorithms import fp8
from quantkit.formats.quantized import Fp8Weight


def quantize_linear_inputs(model: nn.Module, weights: dict[str, Fp8Weight]) -> list:
    """Hook every module named in `weights`; returns the hook handles (call .remove() to undo)."""
    handles = []
    for name, weight in weights.items():
        module = model.get_submodule(name)
        if weight.input_scale is None:
            hook = _per_token
        else:
            hook = _static(weight.input_scale.float())
        handles.append(module.register_forward_pre_hook(hook))
    return handles


def _per_token(module, args):
    return (fp8.round_trip_per_token(args[0]), *args[1:])


def _static(scale):
    def hook(module, args):
        return (fp8.round_trip(args[0], scale.to(args[0].device)), *args[1:])
    return hook
