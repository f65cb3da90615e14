"""`quantkit convert`: rewrite a quantized checkpoint in another format without changing one weight.

Every format reads into the same QuantizedWeight (q, scale, zero, g_idx), so a conversion is a read
and a write. It is refused, with the reason, wherever the target cannot hold the weights exactly:
AutoAWQ GEMM is 4-bit with contiguous groups and no g_idx; AutoAWQ and GPTQ store fp16 scales; GPTQ
v1 cannot store a zero point of 0, so asymmetric weights go to gptq_v2. After writing, the new
checkpoint is read back and every dequantized weight compared with the source, so a layout bug
cannot produce a silently different model.

Conversion goes a module at a time (the source is read once to check it, once to write and once to verify),
so it never holds more than one module's weights, the dense tensors and the writer's shard buffer.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from quantkit import __version__
from quantkit.errors import QuantkitError
from quantkit.formats import float_quantized
from quantkit.formats.checkpoints import detect_format, get_format, open_checkpoint
from quantkit.formats.common import StoredCheckpoint, has_permuted_groups, read_json
from quantkit.formats.quantized import QuantizedWeight
from quantkit.formats.registry import FORMATS
from quantkit.formats.scheme import CheckpointScheme
from quantkit.outdir import atomic_output_dir, check_output_dir

# Rewritten for the target (configs, weights, provenance) rather than copied from the source.
NOT_COPIED = {"config.json", "model.safetensors.index.json", "quantkit.json",
              *(f.side_config for f in FORMATS.values() if f.side_config)}


@dataclass
class SourceScheme:
    scheme: CheckpointScheme
    scale_dtype: torch.dtype  # the model dtype when every scale is exact in it, else float16


@dataclass
class ConvertResult:
    out: Path
    source_format: str
    target_format: str
    num_quantized: int
    notes: list[str] = field(default_factory=list)


def convert(src: Path, to: str, out: Path, overwrite: bool = False) -> ConvertResult:
    """Write `src` as format `to` into `out` (atomically), verified lossless; QuantkitError where it cannot be."""
    target = get_format(to, option="--to")
    source_format = detect_format(src)
    if source_format == "dense":
        raise QuantkitError(f"{src} is a dense checkpoint: there are no quantized weights to convert",
                            hint="quantize it first with quantkit quantize")
    if source_format == to:
        raise QuantkitError(f"{src} is already {to}", hint="copy the directory instead")
    check_output_dir(out, overwrite)
    source = open_checkpoint(src)
    hf_config = {k: v for k, v in source.config.items() if k != "quantization_config"}
    survey = _survey(source, src, to, _model_dtype(hf_config))
    dense = source.dense()
    # KV-cache scales travel as dense tensors; formats that can also declare them do
    scheme = replace(survey.scheme, kv_cache=bool(float_quantized.kv_scales(dense)))
    reason = target.can_hold(scheme)
    if reason:
        raise QuantkitError(f"{src}: {reason}", hint="keep this checkpoint as it is, or convert to compressed-tensors")
    with atomic_output_dir(out, overwrite) as staging:
        quant_config = target.quantization_config(scheme, ignore=_dense_linears(dense))
        target.write(staging, hf_config, dense, source.weights(), quant_config, survey.scale_dtype)
        notes = target.notes(scheme)
        if not target.fp16_scales:  # the others store float16 scales whatever the model dtype
            notes += _scale_notes(survey.scale_dtype, _model_dtype(hf_config))
        _verify_lossless(staging, to, dense, source, bool(hf_config.get("tie_word_embeddings", False)))
        _copy_side_files(src, staging)
        _write_provenance(src, staging, source_format, to)
    return ConvertResult(out=out, source_format=source_format, target_format=to, num_quantized=len(source.modules),
                         notes=notes)


def _survey(source: StoredCheckpoint, src: Path, to: str, model_dtype: torch.dtype) -> SourceScheme:
    """One pass over the modules, each read and dropped: refuse anything but weight-only integer codes (FP8, W8A8),
    which no target holds, and mixed schemes, since every target writes one scheme per checkpoint."""
    if not source.modules:
        raise QuantkitError(f"{src}: no quantized layers found")
    schemes, act_order, scales_exact = set(), False, True
    for module, weight in source.weights().items():
        if not isinstance(weight, QuantizedWeight):
            raise QuantkitError(f"{src}: {module} is a {type(weight).__name__}, not weight-only integer codes; "
                                f"{to} stores integer weight-only layers only", hint="keep this checkpoint as it is")
        schemes.add((weight.bits, weight.group_size, weight.symmetric))
        act_order = act_order or has_permuted_groups(weight)
        scales_exact = scales_exact and torch.equal(weight.scale.to(model_dtype).float(), weight.scale.float())
    if len(schemes) > 1:
        raise QuantkitError(f"{src}: layers use different schemes (bits, group_size, symmetric) {sorted(schemes)}",
                            hint="mixed precision cannot be converted")
    bits, group_size, symmetric = schemes.pop()
    scheme = CheckpointScheme(kind="int", bits=bits, group_size=group_size, symmetric=symmetric,
                              act_order="permuted" if act_order else None)
    return SourceScheme(scheme, model_dtype if scales_exact else torch.float16)


def _model_dtype(hf_config: dict) -> torch.dtype:
    """What compressed-tensors loaders expect scales in (float16 when the config does not say)."""
    name = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float16"
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float16


def _dense_linears(dense: dict[str, torch.Tensor]) -> list[str]:
    """lm_head plus the decoder linears left unquantized: the names loaders must not expect packed."""
    names = [k[: -len(".weight")] for k, v in dense.items()
             if k.endswith(".weight") and v.dim() == 2 and ".layers." in k]
    return ["lm_head", *sorted(names)]


def _scale_notes(scale_dtype: torch.dtype, model_dtype: torch.dtype) -> list[str]:
    if scale_dtype == model_dtype:
        return []
    return [f"scales kept in float16: not all are exact in the model dtype {model_dtype}; "
            "a loader running in that dtype rounds them"]


def _verify_lossless(out: Path, to: str, dense: dict[str, torch.Tensor], source: StoredCheckpoint,
                     tied: bool) -> None:
    """Read the written checkpoint back, a tensor or module at a time, and demand identical dense tensors
    and dequantized weights."""
    written = open_checkpoint(out)
    expected_dense = {k for k in dense if not (tied and k == "lm_head.weight")}
    if set(written.dense_names) != expected_dense or set(written.modules) != set(source.modules):
        raise RuntimeError(f"conversion to {to} changed the set of tensors (a quantkit bug)")
    for name in written.dense_names:
        if not torch.equal(written.files.load([name])[name], dense[name]):
            raise RuntimeError(f"conversion to {to} changed dense tensor {name} (a quantkit bug)")
    for module, weight in written.weights().items():
        if not torch.equal(weight.dequantize(), source.read_module(module).dequantize()):
            raise RuntimeError(f"conversion to {to} changed the weight of {module} (a quantkit bug)")


def _copy_side_files(src: Path, out: Path) -> None:
    """Tokenizer files, generation config, recipe.yaml: whatever the source has besides weights and configs."""
    for file in src.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name not in NOT_COPIED \
                and not file.name.startswith("."):
            shutil.copy2(file, out / file.name)


def _write_provenance(src: Path, out: Path, source_format: str, to: str) -> None:
    """quantkit.json of the source (or a new one) with the format updated and where it was converted from."""
    source = src / "quantkit.json"
    provenance = read_json(source) if source.is_file() else {"kind": "quantkit-checkpoint"}
    hop = {"path": str(src.resolve()), "format": source_format, "quantkit": __version__}
    if "converted_from" in provenance:
        hop["converted_from"] = provenance["converted_from"]
    provenance.update(format=to, converted_from=hop)
    (out / "quantkit.json").write_text(json.dumps(provenance, indent=2, ensure_ascii=False))
