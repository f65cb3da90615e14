"""Simulate W8A8 activations on a dequantized model: each W8A8 linear's input goes through the round trip its
GEMM would apply first (fp8 or int8, per token or at the checkpoint's static input_scale), so evaluation sees
the inputs the checkpoint runs on. Without this a W8A8 checkpoint would be scored as weight-only.
"""

from __future__ import annotations

from torch import nn

from quantkit.algorithms import fp8, int8
from quantkit.formats.quantized import Fp8Weight, Int8Weight

W8A8_WEIGHTS = (Fp8Weight, Int8Weight)


def quantize_linear_inputs(model: nn.Module, weights: dict[str, Fp8Weight | Int8Weight]) -> list:
    """Hook every module named in `weights`; returns the hook handles (call .remove() to undo)."""
    handles = []
    for name, weight in weights.items():
        codec = int8 if isinstance(weight, Int8Weight) else fp8
        hook = _per_token(codec) if weight.input_scale is None else _static(codec, weight.input_scale.float())
        handles.append(model.get_submodule(name).register_forward_pre_hook(hook))
    return handles


def _per_token(codec):
    def hook(module, args):
        return (codec.round_trip_per_token(args[0]), *args[1:])
    return hook


def _static(codec, scale):
    def hook(module, args):
        return (codec.round_trip(args[0], scale.to(args[0].device)), *args[1:])
    return hook
