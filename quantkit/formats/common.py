"""What every checkpoint format shares: JSON configs, safetensors (one file or sharded), fp16 scales, act order.

Readers report a broken file as a QuantkitError naming the file, so a user sees which download or
copy went wrong rather than a safetensors or json traceback.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from quantkit.errors import QuantkitError
from quantkit.formats.quantized import QuantizedWeight

INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"


def read_json(file: Path) -> dict:
    """A JSON object from `file`; missing, unparsable or non-object files are user errors."""
    if not file.is_file():
        raise QuantkitError(f"{file}: not found", hint="point at a checkpoint directory")
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise QuantkitError(f"{file}: invalid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise QuantkitError(f"{file}: expected a JSON object, got {type(value).__name__}")
    return value


def find_quant_config(root: Path, side_config: str, kind: str) -> tuple[dict, dict, str]:
    """(config.json, the quant config, where it was found): config.json's quantization_config first, else the
    format's own side file (AutoAWQ quant_config.json, AutoGPTQ quantize_config.json)."""
    config_file = root / "config.json"
    config = read_json(config_file)
    if "quantization_config" in config:
        return config, config["quantization_config"], f"{config_file}: quantization_config"
    if (root / side_config).is_file():
        return config, read_json(root / side_config), str(root / side_config)
    raise QuantkitError(f"{config_file}: no quantization_config and no {side_config} beside it",
                        hint=f"this is not {kind} checkpoint")


def write_json(file: Path, value: dict) -> None:
    """Sorted keys and a trailing newline, the way the compressed-tensors writer does it, so files diff well."""
    file.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_safetensors(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory: the shards an index names, else every *.safetensors file.

    Honouring the index matters when a directory also holds stray files (an old unsharded copy):
    loaders such as transformers read only what the index lists.
    """
    index = root / INDEX_FILE
    if index.is_file():
        return _load_indexed(index)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise QuantkitError(f"{root}: no *.safetensors files", hint="point at a checkpoint directory")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(_load_file(file))
    return tensors


def _load_indexed(index: Path) -> dict[str, torch.Tensor]:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise QuantkitError(f"{index}: weight_map is missing or empty")
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(set(weight_map.values())):
        shard = index.parent / name
        if not shard.is_file():
            raise QuantkitError(f"{index}: names shard {name}, which does not exist")
        tensors.update(_load_file(shard))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise QuantkitError(f"{index}: {len(missing)} tensors listed but not in their shards, e.g. {missing[0]}")
    return tensors


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise QuantkitError(f"{file}: not a readable safetensors file ({exc})") from exc


def save_safetensors(tensors: dict[str, torch.Tensor], out: Path) -> None:
    """One model.safetensors (contiguous copies, "pt" metadata as transformers expects)."""
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / WEIGHTS_FILE), metadata={"format": "pt"})


def write_quantized_dir(out_dir: str | Path, hf_config: dict, dense_tensors: dict[str, torch.Tensor],
                        module_tensors, quant_config: dict) -> Path:
    """model.safetensors and config.json (with quantization_config) in `out_dir`, for any format.

    module_tensors yields (module name, its on-disk tensors without the module prefix), already checked
    against the format's scheme; a tied lm_head.weight is not written, since loaders re-tie it.
    """
    tied = bool(hf_config.get("tie_word_embeddings", False))
    state = {k: v for k, v in dense_tensors.items() if not (tied and k == "lm_head.weight")}
    for module, tensors in module_tensors:
        if f"{module}.weight" in state:
            raise ValueError(f"{module}.weight is both dense and quantized")
        state.update({f"{module}.{k}": v for k, v in tensors.items()})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, out)
    config = copy.deepcopy(hf_config)
    config["quantization_config"] = copy.deepcopy(quant_config)
    write_json(out / "config.json", config)
    return out


def fp16_scales(scale: torch.Tensor, where: str) -> torch.Tensor:
    """`scale` as float16, refusing any value the cast would change.

    AutoAWQ and GPTQ kernels read fp16 scales. A bf16 or fp32 scale that does not survive the cast
    would silently shift every weight of its group, so the quantizer (or the source checkpoint) must
    already hold fp16-representable scales.
    """
    half = scale.to(torch.float16)
    if not torch.equal(half.float(), scale.float()):
        changed = half.float() != scale.float()
        raise QuantkitError(f"{where}: {int(changed.sum())} scales are not exactly representable in float16 "
                            f"(e.g. {scale.float()[changed][0].item():.9g})",
                            hint="this format stores fp16 scales, so the source must hold fp16 values; keep "
                                 "compressed-tensors, which stores scales in the model dtype")
    return half


def has_permuted_groups(qw: QuantizedWeight) -> bool:
    """True when g_idx differs from k // group_size (act order), i.e. it must be stored to be recovered."""
    if qw.g_idx is None or qw.group_size == -1:
        return False
    return not torch.equal(qw.g_idx.long(), torch.arange(qw.shape[1]) // qw.group_size)
