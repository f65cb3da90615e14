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
from quantkit.formats import autoawq, compressed_tensors, gptq
from quantkit.formats.common import StoredCheckpoint, load_safetensors, read_json

FORMATS = ("compressed-tensors", "autoawq", "gptq", "dense")
QUANT_METHODS = {"compressed-tensors": "compressed-tensors", "awq": "autoawq", "gptq": "gptq"}
# Side files older tools write instead of config.json's quantization_config, and what each implies.
SIDE_CONFIGS = ((gptq.SIDE_CONFIG, "gptq"), (autoawq.SIDE_CONFIG, "awq"))
OPENERS = {"compressed-tensors": compressed_tensors.open_checkpoint, "autoawq": autoawq.open_checkpoint,
           "gptq": gptq.open_checkpoint}


def detect_format(path: str | Path) -> str:
    """"compressed-tensors", "autoawq", "gptq" or "dense"; QuantkitError for anything else."""
    root = Path(path)
    if not root.is_dir():
        raise QuantkitError(f"{root}: not a checkpoint directory", hint="point at a directory with config.json")
    config_file = root / "config.json"
    config = read_json(config_file)
    if "quantization_config" in config:
        return _format_of(config["quantization_config"], f"{config_file}: quantization_config")
    for name, method in SIDE_CONFIGS:
        if (root / name).is_file():
            return _format_of(read_json(root / name), str(root / name), default_method=method)
    return "dense"


def _format_of(qconfig: dict, where: str, default_method: str | None = None) -> str:
    if not isinstance(qconfig, dict):
        raise QuantkitError(f"{where}: expected an object, got {type(qconfig).__name__}")
    method = str(qconfig.get("quant_method") or default_method).lower()
    if method not in QUANT_METHODS:
        raise QuantkitError(f"{where}: quant_method {method!r} is not a format quantkit reads",
                            hint="supported: compressed-tensors (pack-quantized), awq (GEMM), gptq")
    return QUANT_METHODS[method]


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """(hf config, dense tensors, quantized weights by module name) of a checkpoint in any supported format.

    Quantized values are QuantizedWeight for the int formats; compressed-tensors may also yield other
    weight objects (e.g. FP8) that offer .dequantize(dtype) and .shape but no integer codes.
    """
    root = Path(path)
    fmt = detect_format(root)
    if fmt == "dense":
        return read_json(root / "config.json"), load_safetensors(root), {}
    return OPENERS[fmt](root).read_all()


def open_checkpoint(path: str | Path) -> StoredCheckpoint:
    """A quantized checkpoint in any supported format, opened to read a module at a time."""
    root = Path(path)
    fmt = detect_format(root)
    if fmt == "dense":
        raise QuantkitError(f"{root} is a dense checkpoint: it has no quantized weights")
    return OPENERS[fmt](root)
