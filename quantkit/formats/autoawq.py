"""AutoAWQ "GEMM" (WQLinear_GEMM): tensors, quantization_config, checkpoint I/O.

Layout per quantized Linear `<module>`, in [in, out] orientation, i.e. transposed against nn.Linear
(reference/formats.md §0 and §1.1):

    <module>.qweight  [in, out/8]    int32    q packed along `out`: nibble i of word j = column 8j + ORDER[i]
    <module>.qzeros   [in/G, out/8]  int32    zero points, same interleave, stored raw (no GPTQ-style -1)
    <module>.scales   [in/G, out]    float16

4 bits only; G = in for group_size -1; the kernel needs in % G == 0 and out % 8 == 0. GEMM always
subtracts a zero point, so a symmetric weight is written with its zeros (all 8), which is lossless.
The file cannot say which it was: a checkpoint whose zeros are 8 in every layer is read back as
symmetric, so compressed-tensors -> AutoAWQ -> compressed-tensors returns the same tensors.
A permuted (act-order) g_idx has no place in this layout and is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit.errors import QuantkitError
from quantkit.formats import common
from quantkit.formats.common import (StoredCheckpoint, TensorFiles, fp16_scales, has_permuted_groups,
                                     stored_checkpoint, write_quantized_dir)
from quantkit.formats.compressed_tensors import pack_int32, unpack_int32
from quantkit.formats.quantized import QuantizedWeight
from quantkit.formats.registry import KV_SCALES_NOTE, CheckpointFormat, register
from quantkit.formats.scheme import CheckpointScheme

QUANT_METHOD = "awq"
VERSION = "gemm"
BITS = 4
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column 8j + ORDER[i]
REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # argsort(ORDER): nibble position of column 8j + m
TENSORS = ("qweight", "qzeros", "scales")
SIDE_CONFIG = "quant_config.json"  # AutoAWQ's own file: w_bit / q_group_size / zero_point / version "GEMM"


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit `values` [rows, cols] -> int32 [rows, cols/8] with AWQ's column interleave."""
    rows, cols = values.shape
    if cols % 8:
        raise ValueError(f"AWQ packs 8 columns per word; {cols} columns is not a multiple of 8")
    interleaved = values.reshape(rows, cols // 8, 8)[:, :, list(ORDER)].reshape(rows, cols)
    return pack_int32(interleaved, BITS, dim=1)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_awq: uint8 [rows, 8 * words]."""
    rows, words = packed.shape
    nibbles = unpack_int32(packed, BITS, dim=1, length=8 * words)
    return nibbles.reshape(rows, words, 8)[:, :, list(REVERSE_ORDER)].reshape(rows, 8 * words).contiguous()


def check_representable(qw: QuantizedWeight, where: str = "weight") -> None:
    """QuantkitError unless `qw` fits the GEMM layout exactly (bits, shapes, groups; scales are checked on write)."""
    out_features, in_features = qw.shape
    if qw.bits != BITS:
        raise QuantkitError(f"{where}: AutoAWQ GEMM stores 4-bit weights only, not {qw.bits}-bit",
                            hint="convert to gptq or keep compressed-tensors")
    size = in_features if qw.group_size == -1 else qw.group_size
    if out_features % 8 or in_features % size:
        raise QuantkitError(f"{where}: [{out_features}, {in_features}] does not fit AutoAWQ GEMM "
                            f"(needs out % 8 == 0 and in % group_size({size}) == 0)")
    if has_permuted_groups(qw):
        raise QuantkitError(f"{where}: act-order (permuted g_idx) groups cannot be stored in AutoAWQ GEMM, "
                            "which has no g_idx: every group must be contiguous input channels",
                            hint="convert to gptq or keep compressed-tensors")
    if qw.symmetric and not bool((qw.zero == 2 ** (BITS - 1)).all()):
        raise ValueError(f"{where}: symmetric weight must have zero == {2 ** (BITS - 1)} everywhere")


def weight_tensors(qw: QuantizedWeight, where: str = "weight") -> dict[str, torch.Tensor]:
    """The on-disk tensors of one quantized Linear (keys without the module prefix)."""
    check_representable(qw, where)
    return {"qweight": pack_awq(qw.q.t()), "qzeros": pack_awq(qw.zero.t()),
            "scales": fp16_scales(qw.scale, where).t().contiguous()}


def read_weight(tensors: dict[str, torch.Tensor], group_size: int, where: str = "weight") -> QuantizedWeight:
    """Rebuild a QuantizedWeight (asymmetric: the layout always has zeros) from weight_tensors' output."""
    missing = [k for k in TENSORS if k not in tensors]
    if missing:
        raise QuantkitError(f"{where}: missing tensors {missing} for an AutoAWQ GEMM layer")
    qweight, qzeros, scales = (tensors[k] for k in TENSORS)
    if qweight.dim() != 2 or qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise QuantkitError(f"{where}: qweight/qzeros must be 2-D int32, got {qweight.dtype} "
                            f"{tuple(qweight.shape)} and {qzeros.dtype}")
    in_features, out_features = qweight.shape[0], 8 * qweight.shape[1]
    size = in_features if group_size == -1 else group_size
    if in_features % size:
        raise QuantkitError(f"{where}: in_features {in_features} is not a multiple of group_size {size}")
    n_groups = in_features // size
    expected = {"qzeros": (n_groups, out_features // 8), "scales": (n_groups, out_features)}
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise QuantkitError(f"{where}: {key} has shape {tuple(tensors[key].shape)}, expected {shape} "
                                f"for qweight {tuple(qweight.shape)} with group size {group_size}")
    return QuantizedWeight(q=unpack_awq(qweight).t().contiguous(), scale=scales.float().t().contiguous(),
                           zero=unpack_awq(qzeros).t().to(torch.int32).contiguous(), bits=BITS,
                           group_size=group_size, symmetric=False)


def quantization_config(group_size: int, modules_to_not_convert: list[str] | None = None) -> dict:
    """config.json["quantization_config"] as AutoAWQ writes it (to_transformers_dict); vLLM's awq_marlin
    upgrade needs exactly bits, group_size and zero_point."""
    return {"quant_method": QUANT_METHOD, "zero_point": True, "group_size": group_size, "bits": BITS,
            "version": VERSION, "modules_to_not_convert": list(modules_to_not_convert) if modules_to_not_convert
            else None}


def weight_scheme(qconfig: dict, where: str = "quantization_config") -> int:
    """The group size of an AutoAWQ GEMM config, in transformers' keys or AutoAWQ's own (w_bit, q_group_size)."""
    def bad(what: str) -> QuantkitError:
        return QuantkitError(f"{where}: {what}", hint="quantkit reads AutoAWQ GEMM checkpoints (4-bit, zero point)")
    if not isinstance(qconfig, dict):
        raise bad(f"expected an object, got {type(qconfig).__name__}")
    method = str(qconfig.get("quant_method", QUANT_METHOD)).lower()  # AutoAWQ's quant_config.json has none
    if method != QUANT_METHOD:
        raise bad(f"quant_method is {method!r}, expected {QUANT_METHOD!r}")
    bits = qconfig.get("bits", qconfig.get("w_bit"))
    group_size = qconfig.get("group_size", qconfig.get("q_group_size"))
    version = str(qconfig.get("version", VERSION)).lower()
    if bits != BITS:
        raise bad(f"bits {bits!r}: AutoAWQ GEMM is 4-bit only")
    if version != VERSION:
        raise bad(f"version {version!r}: only the GEMM layout is supported")
    if qconfig.get("zero_point", True) is not True:
        raise bad("zero_point is false: the GEMM layout always stores zero points")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or (group_size <= 0 and group_size != -1):
        raise bad(f"group_size {group_size!r} is not a positive integer or -1")
    return group_size


def write_checkpoint(out_dir: str | Path, hf_config: dict, dense_tensors: dict[str, torch.Tensor],
                     quantized: dict[str, QuantizedWeight], quant_config: dict) -> Path:
    """Write model.safetensors + config.json (with quantization_config) into `out_dir`.

    Same contract as compressed_tensors.write_checkpoint, minus the dtype: scales are always fp16 here.
    A tied lm_head.weight is not written.
    """
    return write_quantized_dir(out_dir, hf_config, dense_tensors, module_tensors(quantized, quant_config),
                               quant_config)


def module_tensors(quantized: dict[str, QuantizedWeight], quant_config: dict):
    """(module, its on-disk tensors) for every quantized Linear; each must have the config's group size."""
    group_size = weight_scheme(quant_config)
    for module, qw in quantized.items():
        if qw.group_size != group_size:
            raise ValueError(f"{module}: group_size {qw.group_size} differs from quantization_config {group_size}")
        yield module, weight_tensors(qw, where=module)


def find_quant_config(root: Path) -> tuple[dict, dict, str]:
    """(config.json, the AWQ quant config, where it was found)."""
    return common.find_quant_config(root, SIDE_CONFIG, "an AutoAWQ")


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
    """Read an AutoAWQ GEMM checkpoint (ours or AutoAWQ's): (hf config, dense tensors, quantized)."""
    return open_checkpoint(path).read_all()


def open_checkpoint(path: str | Path) -> StoredCheckpoint:
    """The checkpoint's config and tensor names, to read a module at a time (see read_checkpoint).

    The GEMM layout always stores zero points; when every one of them is 8 the weights are marked
    symmetric (the same weights, and they stay one scheme). Deciding that reads every qzeros up front,
    which are small (1 / group size of qweight)."""
    root = Path(path)
    config, qconfig, where = find_quant_config(root)
    group_size = weight_scheme(qconfig, where)
    files = TensorFiles(root)
    zeros = [n for n in files.names() if n.endswith(".qzeros") and n.removesuffix("qzeros") + "qweight" in files]
    symmetric = bool(zeros) and all(bool((unpack_awq(z) == 2 ** (BITS - 1)).all()) for z in files.load(zeros).values())

    def read(parts: dict[str, torch.Tensor], at: str) -> QuantizedWeight:
        weight = read_weight(parts, group_size, where=at)
        weight.symmetric = symmetric
        return weight

    return stored_checkpoint(config, files, "qweight", TENSORS, read, stray=(".qzeros", ".scales"))


@register
class AutoAWQ(CheckpointFormat):
    name = "autoawq"
    quant_method = QUANT_METHOD
    side_config = SIDE_CONFIG
    fp16_scales = True

    def can_hold(self, scheme: CheckpointScheme) -> str | None:
        if scheme.kind != "int":
            return "AutoAWQ GEMM holds integer weights; FP8 checkpoints are written as compressed-tensors"
        if scheme.bits != BITS:
            return f"AutoAWQ GEMM stores 4-bit weights only, not {scheme.bits}-bit"
        if scheme.act_order == "permuted":
            return ("act-order (permuted g_idx) groups cannot be stored in AutoAWQ GEMM, which has no g_idx: "
                    "every group must be contiguous input channels")
        if scheme.activations:
            return "AutoAWQ GEMM is weight-only: it cannot hold quantized activations"
        return None

    def quantization_config(self, scheme: CheckpointScheme, ignore: list[str]) -> dict:
        return quantization_config(scheme.group_size, modules_to_not_convert=ignore)

    def module_tensors(self, quantized: dict, quant_config: dict, dtype: torch.dtype):
        return module_tensors(quantized, quant_config)

    def notes(self, scheme: CheckpointScheme) -> list[str]:
        notes = []
        if scheme.symmetric:
            notes.append("symmetric weights written with their zero points (8): the GEMM layout always stores them")
        if scheme.kv_cache:
            notes.append(KV_SCALES_NOTE.format(format=self.name))
        return notes

    def open(self, path: Path) -> StoredCheckpoint:
        return open_checkpoint(path)
