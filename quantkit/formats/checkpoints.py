"""Every checkpoint quantkit reads behind one call: detect the format from its config files, then dispatch.

    compressed-tensors  config.json quantization_config.quant_method "compressed-tensors"
    autoawq             quant_method "awq" in config.json, or AutoAWQ's own quant_config.json
    gptq                quant_method "gptq" in config.json, or AutoGPTQ's quantize_config.json
    dense               config.json without a quantization config (a plain HF model)

Only the config decides; tensor names are checked by the format's reader, which then names the
module that does not fit.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit.errors import QuantkitError
from quantkit.formats import autoawq, compressed_tensors, gptq  # noqa: F401  (each registers its format)
from quantkit.formats.common import StoredCheckpoint, load_safetensors, read_json
from quantkit.formats.registry import FORMATS, CheckpointFormat


def get_format(name: str, option: str = "--format") -> CheckpointFormat:
    """The registered format of that name; QuantkitError naming the option otherwise."""
    if name not in FORMATS:
        raise QuantkitError(f"unknown {option} {name!r}", hint=f"use one of {', '.join(FORMATS)}")
    return FORMATS[name]


def detect_format(path: str | Path) -> str:
    """"compressed-tensors", "autoawq", "gptq" or "dense"; QuantkitError for anything else."""
    root = Path(path)
    if not root.is_dir():
        raise QuantkitError(f"{root}: not a checkpoint directory", hint="point at a directory with config.json")
    config_file = root / "config.json"
    config = read_json(config_file)
    if "quantization_config" in config:
        return _format_of(config["quantization_config"], f"{config_file}: quantization_config")
    # older tools write a side file instead of quantization_config; GPTQ's wins where a directory has both
    for fmt in sorted(FORMATS.values(), key=lambda f: f.name != "gptq"):
        if fmt.side_config and (root / fmt.side_config).is_file():
            return _format_of(read_json(root / fmt.side_config), str(root / fmt.side_config),
                              default_method=fmt.quant_method)
    return "dense"


def _format_of(qconfig: dict, where: str, default_method: str | None = None) -> str:
    if not isinstance(qconfig, dict):
        raise QuantkitError(f"{where}: expected an object, got {type(qconfig).__name__}")
    method = str(qconfig.get("quant_method") or default_method).lower()
    for fmt in FORMATS.values():
        if fmt.quant_method == method:
            return fmt.name
    raise QuantkitError(f"{where}: quant_method {method!r} is not a format quantkit reads",
                        hint="supported: compressed-tensors (pack-quantized and float-quantized), awq (GEMM), gptq")


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """(hf config, dense tensors, quantized weights by module name) of a checkpoint in any supported format.

    Quantized values are QuantizedWeight for the int formats; compressed-tensors may also yield other
    weight objects (e.g. FP8) that offer .dequantize(dtype) and .shape but no integer codes.
    """
    root = Path(path)
    fmt = detect_format(root)
    if fmt == "dense":
        return read_json(root / "config.json"), load_safetensors(root), {}
    return FORMATS[fmt].open(root).read_all()


def open_checkpoint(path: str | Path) -> StoredCheckpoint:
    """A quantized checkpoint in any supported format, opened to read a module at a time."""
    root = Path(path)
    fmt = detect_format(root)
    if fmt == "dense":
        raise QuantkitError(f"{root} is a dense checkpoint: it has no quantized weights")
    return FORMATS[fmt].open(root)
