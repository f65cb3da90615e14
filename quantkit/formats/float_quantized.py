"""compressed-tensors `float-quantized` (FP8 W8A8) tensors and config, and FP8 KV-cache scales.

Layout per quantized Linear `<module>` (what llm-compressor 0.14's FP8_DYNAMIC / FP8 presets write):

    <module>.weight        [out, in] float8_e4m3fn   the name is unchanged from the dense model
    <module>.weight_scale  [out, 1]  model dtype     per output channel
    <module>.input_scale   [1]       model dtype     static activations only

KV cache (any quant format): `<layer>.self_attn.k_scale` and `.v_scale`, shape [1] float32, where
vLLM's loader finds them; the cache stores fp8(K / k_scale). An engine that finds no scales uses 1.0
(vLLM logs "Using KV cache scaling factor 1.0"), which clips any |K| above 448 and wastes precision
on small values.
"""

from __future__ import annotations

import re

import torch

from quantkit.errors import QuantkitError
from quantkit.formats.quantized import Fp8Weight, Int8Weight

FORMAT = "float-quantized"
FP8_DTYPE = torch.float8_e4m3fn
STORED_DTYPE = "F8_E4M3"  # FP8_DTYPE as a safetensors header names it
SUFFIXES = ("weight", "weight_scale", "input_scale")  # of one FP8 Linear
ACTIVATIONS = ("dynamic", "static")
KV_SCALE_SUFFIXES = ("self_attn.k_scale", "self_attn.v_scale")


def eight_bit_args(kind: str, strategy: str, dynamic: bool) -> dict:
    """compressed-tensors QuantizationArgs of a symmetric 8-bit tensor; kind "float" (e4m3) or "int"."""
    return {"num_bits": 8, "type": kind, "symmetric": True, "group_size": None, "strategy": strategy,
            "block_structure": None, "dynamic": dynamic, "actorder": None,
            "observer": None if dynamic else "minmax", "observer_kwargs": {}}


def kv_cache_scheme() -> dict:
    """quantization_config["kv_cache_scheme"] for per-tensor FP8 K/V scales."""
    return eight_bit_args("float", "tensor", dynamic=False)


def quantization_config(activations: str, ignore: list[str], targets: list[str] | None = None,
                        kv_cache: bool = False, version: str = "0.20.1") -> dict:
    """config.json["quantization_config"] for FP8 weights per channel, activations per token
    (dynamic) or per tensor from calibration (static)."""
    return w8a8_config("float", FORMAT, activations, ignore, targets, kv_cache, version)


def w8a8_config(kind: str, format: str, activations: str, ignore: list[str], targets: list[str] | None,
                kv_cache: bool, version: str) -> dict:
    """quantization_config of 8-bit weights per channel (kind "float" or "int") with 8-bit inputs per token
    (dynamic) or per tensor (static), as llm-compressor's FP8_DYNAMIC / W8A8 presets write them."""
    if activations not in ACTIVATIONS:
        raise QuantkitError(f"unknown W8A8 activation scheme {activations!r}", hint="use dynamic or static")
    dynamic = activations == "dynamic"
    inputs = eight_bit_args(kind, "token" if dynamic else "tensor", dynamic)
    group = {"targets": list(targets or ["Linear"]), "weights": eight_bit_args(kind, "channel", False),
             "input_activations": inputs, "output_activations": None, "format": format}
    return {
        "quant_method": "compressed-tensors", "format": format, "quantization_status": "compressed",
        "config_groups": {"group_0": group}, "ignore": list(ignore),
        "kv_cache_scheme": kv_cache_scheme() if kv_cache else None,
        "sparsity_config": {}, "transform_config": {}, "global_compression_ratio": None, "version": version,
    }


def activation_scheme(qconfig: dict, where: str, kind: str = "float") -> str:
    """'dynamic' or 'static' for a W8A8 config of 8-bit `kind` ("float" or "int") weights; QuantkitError for
    anything else we cannot read."""
    name_of = {"float": "FP8", "int": "INT8"}[kind]

    def bad(what: str) -> QuantkitError:
        return QuantkitError(f"{where}: {what}", hint=f"quantkit reads {name_of} W8A8 checkpoints with per-channel "
                             "or per-tensor weight scales and per-token or per-tensor input scales")
    schemes = set()
    for name, group in (qconfig.get("config_groups") or {}).items():
        weights, inputs = group.get("weights") or {}, group.get("input_activations")
        if (weights.get("type"), weights.get("num_bits")) != (kind, 8):
            raise bad(f"config_groups.{name}.weights is not 8-bit {kind}")
        if kind == "int" and not weights.get("symmetric", True):
            raise bad(f"config_groups.{name}.weights are asymmetric (a zero point per channel is not supported)")
        if kind == "int" and inputs and not inputs.get("symmetric", True):
            raise bad(f"config_groups.{name}.input_activations are asymmetric (no int8 zero point is supported)")
        if weights.get("strategy") not in ("channel", "tensor"):
            raise bad(f"config_groups.{name}.weights strategy {weights.get('strategy')!r} is not channel or tensor")
        if not inputs:
            schemes.add("weight-only")
        elif inputs.get("dynamic"):
            schemes.add("dynamic")
        elif inputs.get("strategy") == "tensor":
            schemes.add("static")
        else:
            raise bad(f"config_groups.{name}.input_activations strategy {inputs.get('strategy')!r} is not supported")
    if len(schemes) != 1:
        raise bad(f"expected one activation scheme across config groups, found {sorted(schemes) or 'none'}")
    return schemes.pop()


def static_activations(qconfig: dict, where: str) -> bool:
    """Whether the config's inputs use stored per-tensor scales (FP8 weight-only configs read as not static)."""
    return activation_scheme(qconfig, where) == "static"


def weight_tensors(weight: Fp8Weight, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The on-disk tensors of one FP8 Linear (keys without the module prefix); scales in `dtype`."""
    if weight.weight.dtype != FP8_DTYPE:
        raise ValueError(f"FP8 weight must be {FP8_DTYPE}, got {weight.weight.dtype}")
    return w8a8_tensors(weight, weight.scale, dtype)


def w8a8_tensors(weight: Fp8Weight | Int8Weight, scale: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """weight, weight_scale (as given, in `dtype`) and, for static activations, input_scale [1]."""
    tensors = {"weight": weight.weight.contiguous(), "weight_scale": scale.to(dtype).contiguous()}
    if weight.input_scale is not None:
        tensors["input_scale"] = weight.input_scale.reshape(1).to(dtype)
    return tensors


def read_weight(tensors: dict[str, torch.Tensor], static: bool, where: str) -> Fp8Weight:
    """Rebuild an Fp8Weight from weight_tensors' output; `where` names the layer in errors."""
    weight, scale, input_scale = read_w8a8_tensors(tensors, static, where, "FP8")
    return Fp8Weight(weight=weight, scale=scale, input_scale=input_scale)


def read_w8a8_tensors(tensors: dict[str, torch.Tensor], static: bool, where: str,
                      kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(weight as stored, weight_scale as float32, input_scale [1] float32 or None) of one W8A8 linear, checked."""
    weight, scale = tensors["weight"], tensors.get("weight_scale")
    if scale is None:
        raise QuantkitError(f"{where}: {kind} weight without weight_scale")
    out_features = weight.shape[0]
    if tuple(scale.shape) not in ((out_features, 1), (1,), (1, 1)):
        raise QuantkitError(f"{where}: weight_scale has shape {tuple(scale.shape)}, expected "
                            f"({out_features}, 1) per channel or (1,) per tensor")
    input_scale = tensors.get("input_scale")
    if static and input_scale is None:
        raise QuantkitError(f"{where}: static {kind} activations but no input_scale")
    return weight, scale.float(), None if input_scale is None else input_scale.float().reshape(1)


def kv_scales(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The KV-cache scales present in a state dict ("model.layers.N.self_attn.k_scale" -> [1] float32)."""
    return {k: v.float().reshape(-1) for k, v in tensors.items() if k.endswith(KV_SCALE_SUFFIXES)}


_LAYER_SCALE = re.compile(r"model\.layers\.(\d+)\.self_attn\.([kv])_scale$")


def per_layer_kv_scales(tensors: dict[str, torch.Tensor]) -> tuple[dict[int, tuple[float, float]], list[int]]:
    """(layer index -> (k_scale, v_scale) for layers that have both, layers that have only one of them)."""
    found: dict[int, dict[str, float]] = {}
    for name, value in kv_scales(tensors).items():
        match = _LAYER_SCALE.search(name)
        if match:
            found.setdefault(int(match[1]), {})[match[2]] = float(value.reshape(-1)[0])
    complete = {i: (kv["k"], kv["v"]) for i, kv in sorted(found.items()) if set(kv) == {"k", "v"}}
    return complete, sorted(i for i in found if i not in complete)
