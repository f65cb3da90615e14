"""compressed-tensors `int-quantized` (INT8 W8A8) tensors and config.

Layout per quantized Linear `<module>` (what llm-compressor's W8A8 preset writes; symmetric, so no zero point):

    <module>.weight        [out, in] int8        signed codes; the name is unchanged from the dense model
    <module>.weight_scale  [out, 1]  model dtype per output channel
    <module>.input_scale   [1]       model dtype static activations only (dynamic: per token at run time)
"""

from __future__ import annotations

import torch

from quantkit.errors import QuantkitError
from quantkit.formats.float_quantized import activation_scheme, read_w8a8_tensors, w8a8_config, w8a8_tensors
from quantkit.formats.quantized import Int8Weight

FORMAT = "int-quantized"
STORED_DTYPE = "I8"  # int8 as a safetensors header names it
SUFFIXES = ("weight", "weight_scale", "input_scale", "weight_zero_point")  # a zero point is read to refuse it


def quantization_config(activations: str, ignore: list[str], kv_cache: bool, version: str) -> dict:
    """config.json["quantization_config"]: int8 weights per channel, int8 inputs per token or per tensor."""
    return w8a8_config("int", FORMAT, activations, ignore, None, kv_cache, version)


def static_activations(qconfig: dict, where: str) -> bool:
    """Whether the config's inputs use stored per-tensor scales; QuantkitError for a scheme quantkit cannot read."""
    scheme = activation_scheme(qconfig, where, kind="int")
    if scheme == "weight-only":
        raise QuantkitError(f"{where}: int-quantized without input_activations",
                            hint="weight-only int8 is written as pack-quantized (W8A16)")
    return scheme == "static"


def weight_tensors(weight: Int8Weight, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The on-disk tensors of one INT8 W8A8 Linear (keys without the module prefix); scales in `dtype`."""
    if weight.weight.dtype != torch.int8:
        raise ValueError(f"INT8 weight must be torch.int8, got {weight.weight.dtype}")
    return w8a8_tensors(weight, weight.scale.reshape(-1, 1), dtype)


def read_weight(tensors: dict[str, torch.Tensor], static: bool, where: str) -> Int8Weight:
    """Rebuild an Int8Weight from weight_tensors' output; `where` names the layer in errors."""
    weight, scale, input_scale = read_w8a8_tensors(tensors, static, where, "INT8")
    if "weight_zero_point" in tensors and bool(tensors["weight_zero_point"].ne(0).any()):
        raise QuantkitError(f"{where}: int8 weight with a nonzero zero point (asymmetric) is not supported")
    return Int8Weight(weight=weight, scale=scale.reshape(-1, 1).expand(weight.shape[0], 1).contiguous(),
                      input_scale=input_scale)
