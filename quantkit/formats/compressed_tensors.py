"""compressed-tensors `pack-quantized` (W4A16 / W8A16): tensors, quantization_config, checkpoint I/O.
Checkpoint I/O also covers `float-quantized` (FP8 W8A8) and `int-quantized` (INT8 W8A8), whose tensors live
in quantkit.formats.float_quantized and quantkit.formats.int_quantized.

Layout per quantized Linear `<module>` (torch [out, in] orientation, see reference/formats.md §0 and §3):

    <module>.weight_packed      [out, ceil(in*bits/32)] int32   q along `in`, LSB first, 32/bits per word
    <module>.weight_scale       [out, n_groups]         model dtype
    <module>.weight_zero_point  [ceil(out*bits/32), n_groups] int32, packed along `out` (asymmetric only)
    <module>.weight_shape       [2] int64 = [out, in]
    <module>.weight_g_idx       [in] int32 (actorder "group" only)

compressed-tensors stores signed values plus 2**(bits-1); that is exactly our unsigned q and zero, so
packing needs no offset arithmetic here. This module never imports compressed-tensors: the field set
of quantization_config is fixed by hand and checked against the real package in the tests.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from quantkit.errors import QuantkitError
from quantkit.formats import float_quantized, int_quantized
from quantkit.formats.common import (StoredCheckpoint, TensorFiles, read_json, stored_checkpoint,
                                     write_quantized_dir)
from quantkit.formats.quantized import Fp8Weight, Int8Weight, QuantizedWeight
from quantkit.formats.registry import CheckpointFormat, register
from quantkit.formats.scheme import CheckpointScheme

QUANT_METHOD = "compressed-tensors"
FORMAT = "pack-quantized"
# The compressed-tensors release whose layout this module writes (and the tests load with).
CT_VERSION = "0.20.1"
SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
SUPPORTED_BITS = (2, 4, 8)  # divisors of 32: no value ever straddles two words
# The W8A8 formats: each module has FORMAT, STORED_DTYPE, SUFFIXES, static_activations, weight_tensors, read_weight
W8A8_LAYOUTS = {float_quantized.FORMAT: (float_quantized, Fp8Weight),
                int_quantized.FORMAT: (int_quantized, Int8Weight)}


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise QuantkitError(f"pack-quantized supports {SUPPORTED_BITS} bits, not {bits}",
                            hint="use num_bits 4 (W4A16) or 8 (W8A16)")


def pack_int32(values: torch.Tensor, bits: int, dim: int = 1) -> torch.Tensor:
    """Pack unsigned `values` [rows, cols] into int32 words along `dim`, LSB first, zero padded."""
    _check_bits(bits)
    v = values.to(torch.int64)  # widen first: comparing uint8 with 2**8 would wrap
    if v.numel() and (v.min() < 0 or v.max() >= 2**bits):
        raise ValueError(f"values must lie in [0, {2**bits - 1}] to pack into {bits} bits")
    per_word = 32 // bits
    v = v.t() if dim == 0 else v
    v = torch.nn.functional.pad(v, (0, -v.shape[1] % per_word))
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    words = (v.reshape(v.shape[0], -1, per_word) << shifts).sum(-1)
    # Words with the top bit set are negative int32s; wrap explicitly rather than rely on cast overflow.
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return (words.t() if dim == 0 else words).contiguous()


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, length: int) -> torch.Tensor:
    """Inverse of pack_int32: uint8 values, `length` of them along `dim` (the padding is dropped)."""
    _check_bits(bits)
    words = packed.to(torch.int64) & 0xFFFFFFFF  # as unsigned, so shifts never drag in sign bits
    words = words.t() if dim == 0 else words
    shifts = torch.arange(32 // bits, dtype=torch.int64) * bits
    values = ((words.unsqueeze(-1) >> shifts) & (2**bits - 1)).reshape(words.shape[0], -1)[:, :length]
    values = values.to(torch.uint8)
    return (values.t() if dim == 0 else values).contiguous()


def _has_act_order_groups(qw: QuantizedWeight) -> bool:
    """True when g_idx differs from the contiguous default, i.e. it must be stored to be recovered."""
    if qw.g_idx is None or qw.group_size == -1:
        return False
    default = torch.arange(qw.shape[1]) // qw.group_size
    return not torch.equal(qw.g_idx.long(), default)


def weight_tensors(qw: QuantizedWeight, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The on-disk tensors of one quantized Linear (keys without the module prefix).

    Scales are cast to `dtype`; callers that want a bit-exact round trip round scales to it before
    computing q, which is what a quantizer must do anyway so that q matches the stored scale.
    """
    out_features, in_features = qw.shape
    if qw.symmetric and not bool((qw.zero == 2 ** (qw.bits - 1)).all()):
        raise ValueError(f"symmetric weight must have zero == {2 ** (qw.bits - 1)} everywhere")
    tensors = {
        "weight_packed": pack_int32(qw.q, qw.bits, dim=1),
        "weight_scale": qw.scale.to(dtype).contiguous(),
        "weight_shape": torch.tensor([out_features, in_features], dtype=torch.int64),
    }
    if not qw.symmetric:
        tensors["weight_zero_point"] = pack_int32(qw.zero, qw.bits, dim=0)
    if _has_act_order_groups(qw):
        tensors["weight_g_idx"] = qw.g_idx.to(torch.int32).contiguous()
    return tensors


def read_weight(tensors: dict[str, torch.Tensor], bits: int, group_size: int, symmetric: bool,
                where: str = "weight") -> QuantizedWeight:
    """Rebuild a QuantizedWeight from weight_tensors' output; `where` names the layer in errors."""
    missing = [k for k in ("weight_packed", "weight_scale", "weight_shape") if k not in tensors]
    if not symmetric and "weight_zero_point" not in tensors:
        missing.append("weight_zero_point")
    if missing:
        raise QuantkitError(f"{where}: missing tensors {missing} for a pack-quantized layer")
    if tensors["weight_shape"].numel() != 2:
        raise QuantkitError(f"{where}: weight_shape must hold [out, in], got {tensors['weight_shape'].tolist()}")
    out_features, in_features = (int(x) for x in tensors["weight_shape"].tolist())
    n_groups = 1 if group_size == -1 else math.ceil(in_features / group_size)
    expected = {"weight_packed": (out_features, math.ceil(in_features * bits / 32)),
                "weight_scale": (out_features, n_groups)}
    if not symmetric:
        expected["weight_zero_point"] = (math.ceil(out_features * bits / 32), n_groups)
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise QuantkitError(f"{where}: {key} has shape {tuple(tensors[key].shape)}, expected {shape} "
                                f"for [{out_features}, {in_features}] at {bits} bits, group size {group_size}")
    scale = tensors["weight_scale"].float()
    q = unpack_int32(tensors["weight_packed"], bits, dim=1, length=in_features)
    if symmetric:
        zero = torch.full((out_features, n_groups), 2 ** (bits - 1), dtype=torch.int32)
    else:
        zero = unpack_int32(tensors["weight_zero_point"], bits, dim=0, length=out_features).to(torch.int32)
    g_idx = tensors.get("weight_g_idx")
    g_idx = None if g_idx is None else g_idx.to(torch.int32)
    return QuantizedWeight(q=q, scale=scale, zero=zero, bits=bits, group_size=group_size,
                           symmetric=symmetric, g_idx=g_idx)


def quantization_config(bits: int, group_size: int, symmetric: bool, actorder: str | None,
                        ignore: list[str], targets: list[str] | None = None,
                        kv_cache_scheme: dict | None = None) -> dict:
    """config.json["quantization_config"] as llm-compressor writes it for W4A16 / W8A16.

    actorder: None, "weight" (columns reordered during GPTQ only; nothing extra on disk) or "group"
    (writes weight_g_idx; compressed-tensors >= 0.20 refuses to load it, older stacks and vLLM's
    g_idx path accept it).
    """
    _check_bits(bits)
    if actorder not in (None, "weight", "group"):
        raise QuantkitError(f"unknown actorder {actorder!r}", hint="use null, 'weight' or 'group'")
    if actorder == "group" and group_size == -1:
        raise QuantkitError("actorder 'group' needs group quantization, not per-channel (group_size -1)")
    weights = {
        "num_bits": bits, "type": "int", "symmetric": symmetric,
        # llm-compressor's channel presets leave group_size null; strategy carries the meaning.
        "group_size": None if group_size == -1 else group_size,
        "strategy": "channel" if group_size == -1 else "group",
        "block_structure": None, "dynamic": False, "actorder": actorder,
        "observer": "minmax", "observer_kwargs": {},
    }
    group = {"targets": list(targets or ["Linear"]), "weights": weights,
             "input_activations": None, "output_activations": None, "format": FORMAT}
    return {
        "quant_method": QUANT_METHOD, "format": FORMAT, "quantization_status": "compressed",
        "config_groups": {"group_0": group}, "ignore": list(ignore), "kv_cache_scheme": kv_cache_scheme,
        "sparsity_config": {}, "transform_config": {}, "global_compression_ratio": None,
        "version": CT_VERSION,
    }


def weight_scheme(qconfig: dict, where: str = "quantization_config") -> tuple[int, int, bool, str | None]:
    """(bits, group_size, symmetric, actorder) of a pack-quantized config; QuantkitError if unsupported."""
    def bad(what: str) -> QuantkitError:
        return QuantkitError(f"{where}: {what}", hint="quantkit reads compressed-tensors pack-quantized "
                             "weight-only int checkpoints (W4A16 / W8A16)")
    if not isinstance(qconfig, dict) or qconfig.get("quant_method") != QUANT_METHOD:
        raise bad(f"quant_method is {qconfig.get('quant_method') if isinstance(qconfig, dict) else None!r}, "
                  f"expected {QUANT_METHOD!r}")
    groups = qconfig.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise bad("config_groups is missing or empty")
    schemes = set()
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise bad(f"config_groups.{name}.weights is missing")
        if (group.get("format") or qconfig.get("format")) != FORMAT:
            raise bad(f"config_groups.{name} format is {group.get('format') or qconfig.get('format')!r}, "
                      f"expected {FORMAT!r}")
        if group.get("input_activations") or weights.get("type", "int") != "int" or weights.get("dynamic"):
            raise bad(f"config_groups.{name} is not static weight-only int quantization")
        schemes.add(_weight_args(weights, bad))
    if len(schemes) > 1:
        raise bad(f"config groups use different weight schemes {sorted(schemes, key=str)}; "
                  "mixed precision is not supported")
    return schemes.pop()


def _weight_args(weights: dict, bad) -> tuple[int, int, bool, str | None]:
    bits, group_size = weights.get("num_bits"), weights.get("group_size")
    strategy = weights.get("strategy") or ("channel" if group_size in (None, -1) else "group")
    if bits not in SUPPORTED_BITS:
        raise bad(f"num_bits {bits!r} is not one of {SUPPORTED_BITS}")
    if strategy == "channel":
        group_size = -1
    elif strategy != "group" or not isinstance(group_size, int) or group_size <= 0:
        raise bad(f"strategy {strategy!r} with group_size {group_size!r} is not group or channel")
    actorder = {"static": "weight", "dynamic": "group"}.get(weights.get("actorder"), weights.get("actorder"))
    return bits, group_size, bool(weights.get("symmetric", True)), actorder or None


def write_checkpoint(out_dir: str | Path, hf_config: dict, dense_tensors: dict[str, torch.Tensor],
                     quantized: dict[str, QuantizedWeight], quant_config: dict, dtype: torch.dtype) -> Path:
    """Write model.safetensors + config.json (with quantization_config) into `out_dir`.

    dense_tensors are written as given (already in the model dtype); quantized maps a module name
    ("model.layers.0.self_attn.q_proj") to its weight. A tied lm_head.weight is not written.
    """
    return write_quantized_dir(out_dir, hf_config, dense_tensors, module_tensors(quantized, quant_config, dtype),
                               quant_config)


def module_tensors(quantized: dict, quant_config: dict, dtype: torch.dtype):
    """(module, its on-disk tensors) for every quantized Linear, in the config's format (its scheme must
    match the config's: loaders read every layer with that one scheme)."""
    w8a8 = W8A8_LAYOUTS.get(quant_config.get("format"))
    if w8a8:
        layout, weight_type = w8a8
        for module, weight in quantized.items():
            if not isinstance(weight, weight_type):
                raise ValueError(f"{module}: a {layout.FORMAT} checkpoint needs {weight_type.__name__}, "
                                 f"got {type(weight).__name__}")
            yield module, layout.weight_tensors(weight, dtype)
        return
    bits, group_size, symmetric, actorder = weight_scheme(quant_config)
    for module, qw in quantized.items():
        _check_matches_scheme(module, qw, bits, group_size, symmetric, actorder)
        yield module, weight_tensors(qw, dtype)


def _check_matches_scheme(module: str, qw: QuantizedWeight, bits: int, group_size: int, symmetric: bool,
                          actorder: str | None) -> None:
    """Loaders read every layer with the config's one scheme, so a layer that differs would be garbage."""
    if (qw.bits, qw.group_size, qw.symmetric) != (bits, group_size, symmetric):
        raise ValueError(f"{module}: bits/group_size/symmetric {(qw.bits, qw.group_size, qw.symmetric)} "
                         f"differ from quantization_config {(bits, group_size, symmetric)}")
    if _has_act_order_groups(qw) and actorder != "group":
        raise ValueError(f"{module}: has a permuted g_idx but quantization_config actorder is {actorder!r}")


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, QuantizedWeight | Fp8Weight]]:
    """Read a pack-quantized, float-quantized (FP8) or int-quantized (INT8) checkpoint, ours or llm-compressor's:
    (hf config, dense tensors, quantized). KV-cache scales, if any, stay among the dense tensors."""
    return open_checkpoint(path).read_all()


def open_checkpoint(path: str | Path) -> StoredCheckpoint:
    """The checkpoint's config and tensor names, to read a module at a time (see read_checkpoint)."""
    root = Path(path)
    config_file = root / "config.json"
    config = read_json(config_file)
    if "quantization_config" not in config:
        raise QuantkitError(f"{config_file}: no quantization_config", hint="this is not a quantized checkpoint")
    qconfig, where = config["quantization_config"], f"{config_file}: quantization_config"
    w8a8 = W8A8_LAYOUTS.get(qconfig.get("format")) if isinstance(qconfig, dict) else None
    if w8a8:
        layout = w8a8[0]
        static = layout.static_activations(qconfig, where)
        files = TensorFiles(root)
        # the weights keep their dense names: the stored dtype tells a quantized linear from a dense tensor
        return stored_checkpoint(config, files, "weight", layout.SUFFIXES,
                                 lambda parts, at: layout.read_weight(parts, static, at),
                                 is_module=lambda name: files.dtype(name) == layout.STORED_DTYPE)
    bits, group_size, symmetric, _ = weight_scheme(qconfig, where=where)
    return stored_checkpoint(config, TensorFiles(root), "weight_packed", SUFFIXES,
                             lambda parts, at: read_weight(parts, bits, group_size, symmetric, where=at))


@register
class CompressedTensors(CheckpointFormat):
    """pack-quantized integer weights, float-quantized FP8 (W8A8) or int-quantized INT8 (W8A8); FP8 KV-cache
    scales are declared too."""
    name = "compressed-tensors"
    quant_method = QUANT_METHOD

    def can_hold(self, scheme: CheckpointScheme) -> str | None:
        if scheme.kind == "int" and scheme.bits not in SUPPORTED_BITS:
            return f"compressed-tensors pack-quantized stores {SUPPORTED_BITS}-bit integers, not {scheme.bits}-bit"
        w8a8_int = scheme.kind == "int" and scheme.activations
        if w8a8_int and (scheme.bits, scheme.group_size, scheme.symmetric) != (8, -1, True):
            group = "per channel" if scheme.group_size == -1 else f"group {scheme.group_size}"
            return (f"int-quantized (W8A8) holds symmetric 8-bit weights per output channel, not {scheme.bits}-bit "
                    f"{group} {'symmetric' if scheme.symmetric else 'asymmetric'}: vLLM's int8 GEMMs take one "
                    "scale per channel and no zero point")
        if scheme.act_order == "permuted" and scheme.group_size == -1:
            return "a permuted g_idx needs group quantization, not per channel (group_size -1)"
        return None

    def quantization_config(self, scheme: CheckpointScheme, ignore: list[str]) -> dict:
        kv_cache = float_quantized.kv_cache_scheme() if scheme.kv_cache else None
        if scheme.kind == "float":
            return float_quantized.quantization_config(scheme.activations, ignore, kv_cache=scheme.kv_cache,
                                                       version=CT_VERSION)
        if scheme.activations:
            return int_quantized.quantization_config(scheme.activations, ignore, scheme.kv_cache, CT_VERSION)
        # static act order keeps groups contiguous: compressed-tensors calls that actorder "weight"
        actorder = {"static": "weight", "permuted": "group", None: None}[scheme.act_order]
        return quantization_config(scheme.bits, scheme.group_size, scheme.symmetric, actorder=actorder,
                                   ignore=ignore, kv_cache_scheme=kv_cache)

    def module_tensors(self, quantized: dict, quant_config: dict, dtype: torch.dtype):
        return module_tensors(quantized, quant_config, dtype)

    def notes(self, scheme: CheckpointScheme) -> list[str]:
        if scheme.act_order == "permuted":
            return ["act-order g_idx written as actorder 'group' (weight_g_idx): vLLM reads it, "
                    "compressed-tensors >= 0.20 in transformers refuses it"]
        return []

    def open(self, path: Path) -> StoredCheckpoint:
        return open_checkpoint(path)
