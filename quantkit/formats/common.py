"""What every checkpoint format shares: JSON configs, safetensors (one file or sharded), fp16 scales, act order.

Readers report a broken file as a QuantkitError naming the file, so a user sees which download or
copy went wrong rather than a safetensors or json traceback.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from quantkit.errors import QuantkitError
from quantkit.formats.quantized import QuantizedWeight
from quantkit.memory import release_freed_memory

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
    """Every tensor of a checkpoint directory (see TensorFiles for which files count)."""
    files = TensorFiles(root)
    return files.load(files.names())


class TensorFiles:
    """The tensors of a checkpoint directory, read on demand: the shards an index names, else every
    *.safetensors file. Opening one reads only the files' headers, so a reader can go through a model
    larger than memory a module at a time.

    Honouring the index matters when a directory also holds stray files (an old unsharded copy):
    loaders such as transformers read only what the index lists.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self._file_of: dict[str, Path] = {}  # tensor name -> its file, in file order
        index = self.root / INDEX_FILE
        if index.is_file():
            self._map_indexed(index)
            return
        files = sorted(self.root.glob("*.safetensors"))
        if not files:
            raise QuantkitError(f"{self.root}: no *.safetensors files", hint="point at a checkpoint directory")
        for file in files:
            self._file_of.update(dict.fromkeys(_header_names(file), file))

    def _map_indexed(self, index: Path) -> None:
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise QuantkitError(f"{index}: weight_map is missing or empty")
        for name in sorted(set(weight_map.values())):
            shard = index.parent / name
            if not shard.is_file():
                raise QuantkitError(f"{index}: names shard {name}, which does not exist")
            self._file_of.update(dict.fromkeys(_header_names(shard), shard))
        missing = sorted(set(weight_map) - set(self._file_of))
        if missing:
            raise QuantkitError(f"{index}: {len(missing)} tensors listed but not in their shards, e.g. {missing[0]}")

    def names(self) -> list[str]:
        return list(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def dtype(self, name: str) -> str:
        """The stored dtype's safetensors name ("F8_E4M3", "I32", ...), without reading the tensor."""
        file = self._file_of[name]
        with _open(file) as handle:
            return handle.get_slice(name).get_dtype()

    def load(self, names) -> dict[str, torch.Tensor]:
        """The named tensors, each file opened once."""
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self._file_of[name], []).append(name)
        tensors = {}
        for file, file_names in by_file.items():
            try:
                with _open(file) as handle:
                    tensors.update({name: handle.get_tensor(name) for name in file_names})
            except (SafetensorError, OSError) as exc:
                raise QuantkitError(f"{file}: not a readable safetensors file ({exc})") from exc
        return tensors


def _open(file: Path):
    return safe_open(str(file), framework="pt")


def _header_names(file: Path) -> list[str]:
    try:
        with _open(file) as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as exc:
        raise QuantkitError(f"{file}: not a readable safetensors file ({exc})") from exc


# Modules read between two hand-backs of freed heap pages (one decoder layer of a Llama has 7 linears).
RELEASE_EVERY = 8


class StoredWeights(Mapping):
    """module name -> its weight, read from disk each time it is asked for (nothing is cached).

    Freed heap pages go back to the OS every RELEASE_EVERY reads: the modules' temporaries come in many
    sizes, and without it glibc's heap fragments and resident memory ratchets up (`quantkit convert` of a
    32-layer random Llama to GPTQ: 1.5-1.9 GB of heap at the peak, against ~0.55 GB with it)."""

    def __init__(self, modules: list[str], read_module: Callable[[str], object]):
        self._modules, self._read = modules, read_module
        self._reads = 0

    def __getitem__(self, module: str):
        if module not in self._modules:
            raise KeyError(module)
        self._reads += 1
        if self._reads % RELEASE_EVERY == 0:
            release_freed_memory(collect_cycles=False)
        return self._read(module)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)


@dataclass
class StoredCheckpoint:
    """A quantized checkpoint opened for reading a module at a time: its config.json, the names of its dense
    tensors and of its quantized modules, and how to read one module's weight (QuantizedWeight or Fp8Weight)."""
    config: dict
    files: TensorFiles
    dense_names: list[str]
    modules: list[str]
    read_module: Callable[[str], object]

    def dense(self) -> dict[str, torch.Tensor]:
        return self.files.load(self.dense_names)

    def weights(self) -> StoredWeights:
        """Every quantized module, read as it is iterated: a writer given this holds one module at a time."""
        return StoredWeights(self.modules, self.read_module)

    def read_all(self) -> tuple[dict, dict[str, torch.Tensor], dict]:
        """(config, dense tensors, module -> weight), everything in memory."""
        return self.config, self.dense(), {module: self.read_module(module) for module in self.modules}


def stored_checkpoint(config: dict, files: TensorFiles, anchor: str, suffixes: tuple[str, ...],
                      read: Callable[[dict[str, torch.Tensor], str], object], stray: tuple[str, ...] = (),
                      is_module: Callable[[str], bool] = lambda name: True) -> StoredCheckpoint:
    """The modules are the names before ".{anchor}" (that ``is_module`` accepts); each owns its tensors
    "{module}.{suffix}", read with ``read(tensors by suffix, where)``. Everything else is dense, except a
    tensor ending in one of ``stray`` suffixes: a piece of a module whose anchor is missing, an error."""
    names = files.names()
    modules = [n[: -len(anchor) - 1] for n in names if n.endswith(f".{anchor}") and is_module(n)]
    owned = {f"{module}.{suffix}" for module in modules for suffix in suffixes}
    dense_names = [n for n in names if n not in owned]
    orphans = [n for n in dense_names if n.endswith(stray)]
    if orphans:
        raise QuantkitError(f"{files.root}: {orphans[0]} has no matching {anchor}")

    def read_module(module: str):
        present = [f"{module}.{suffix}" for suffix in suffixes if f"{module}.{suffix}" in files]
        parts = {name[len(module) + 1:]: tensor for name, tensor in files.load(present).items()}
        return read(parts, f"{files.root}: {module}")

    return StoredCheckpoint(config, files, dense_names, modules, read_module)


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
