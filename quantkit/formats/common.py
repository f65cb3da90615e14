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


def save_safetensors(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """One safetensors file (contiguous copies, "pt" metadata as transformers expects)."""
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(file), metadata={"format": "pt"})


# What a checkpoint writer holds before it writes a shard: bounds its memory on large models, while a
# small model (SmolLM2 quantized is ~0.1 GB) stays one model.safetensors; 1 GiB is about one
# layer of an 8B model in float32. Loaders read any number of shards.
DEFAULT_MAX_SHARD_BYTES = 1024**3


class QuantizedDirWriter:
    """Streams a quantized checkpoint into a directory: tensors are added as they are made (a layer at a
    time) and written in safetensors shards of at most ``max_shard_bytes``, so a writer holds at most one
    shard. ``finish`` names the files: a single model.safetensors, or model-0000i-of-0000n.safetensors
    with the model.safetensors.index.json that transformers and vLLM read.

    A tied lm_head.weight is not written, since loaders re-tie it.
    """

    def __init__(self, out_dir: str | Path, tie_word_embeddings: bool,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES):
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tied = tie_word_embeddings
        self.max_shard_bytes = max_shard_bytes
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffer_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []  # written so far: (file, its tensor names)
        self._names: set[str] = set()
        self._modules: set[str] = set()  # the quantized ones
        self._total_bytes = 0

    def add_dense(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, tensor in tensors.items():
            if name.endswith(".weight") and name[: -len(".weight")] in self._modules:
                raise ValueError(f"{name} is both dense and quantized")
            if not (self.tied and name == "lm_head.weight"):
                self._add(name, tensor)

    def add_modules(self, module_tensors) -> None:
        """module_tensors yields (module name, its on-disk tensors without the module prefix)."""
        for module, tensors in module_tensors:
            if f"{module}.weight" in self._names:
                raise ValueError(f"{module}.weight is both dense and quantized")
            self._modules.add(module)
            for suffix, tensor in tensors.items():
                self._add(f"{module}.{suffix}", tensor)

    def _add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._names:
            raise ValueError(f"{name} is written twice")
        size = tensor.numel() * tensor.element_size()
        if self._buffer and self._buffer_bytes + size > self.max_shard_bytes:
            self._flush()
        self._names.add(name)
        self._buffer[name] = tensor.contiguous()
        self._buffer_bytes += size
        self._total_bytes += size

    def _flush(self) -> None:
        file = self.out / f".shard-{len(self._shards) + 1:05d}.safetensors"
        save_safetensors(self._buffer, file)
        self._shards.append((file, list(self._buffer)))
        self._buffer, self._buffer_bytes = {}, 0

    def finish(self, hf_config: dict, quant_config: dict) -> Path:
        """Write the last shard, name the shards, and write config.json with its quantization_config."""
        if not self._shards:
            save_safetensors(self._buffer, self.out / WEIGHTS_FILE)
        else:
            if self._buffer:
                self._flush()
            count = len(self._shards)
            weight_map = {}
            for number, (file, names) in enumerate(self._shards, start=1):
                final = f"model-{number:05d}-of-{count:05d}.safetensors"
                file.rename(self.out / final)
                weight_map.update({name: final for name in names})
            write_json(self.out / INDEX_FILE, {"metadata": {"total_size": self._total_bytes},
                                               "weight_map": dict(sorted(weight_map.items()))})
        config = copy.deepcopy(hf_config)
        config["quantization_config"] = copy.deepcopy(quant_config)
        write_json(self.out / "config.json", config)
        return self.out


def write_quantized_dir(out_dir: str | Path, hf_config: dict, dense_tensors: dict[str, torch.Tensor],
                        module_tensors, quant_config: dict,
                        max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """A whole quantized checkpoint at once (weights and config.json), for any format; see QuantizedDirWriter.

    module_tensors yields (module name, its on-disk tensors without the module prefix), already checked
    against the format's scheme.
    """
    writer = QuantizedDirWriter(out_dir, bool(hf_config.get("tie_word_embeddings", False)), max_shard_bytes)
    writer.add_dense(dense_tensors)
    writer.add_modules(module_tensors)
    return writer.finish(hf_config, quant_config)


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
