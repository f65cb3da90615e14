"""The checkpoint formats quantkit writes and reads, one registered class each (write / read / can_hold).
`quantize --format`, `convert --to` and every reader (eval, the runtime's loader) go through FORMATS;
quantkit.formats.checkpoints imports the format modules, which register themselves.

A new format is one module: its tensors and quantization_config, and a CheckpointFormat subclass
decorated with ``@register``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import torch

from quantkit.formats.common import StoredCheckpoint, write_quantized_dir
from quantkit.formats.scheme import CheckpointScheme


class CheckpointFormat:
    name: ClassVar[str]  # what --format and --to take
    quant_method: ClassVar[str]  # config.json quantization_config.quant_method
    side_config: ClassVar[str | None] = None  # the file older tools write instead of quantization_config
    fp16_scales: ClassVar[bool] = False  # its kernels read float16 scales, whatever the model dtype

    def can_hold(self, scheme: CheckpointScheme) -> str | None:
        """None, or why this format cannot store weights of that scheme exactly."""
        raise NotImplementedError

    def quantization_config(self, scheme: CheckpointScheme, ignore: list[str]) -> dict:
        """config.json's quantization_config; ``ignore``: the linears left dense (lm_head among them)."""
        raise NotImplementedError

    def module_tensors(self, quantized: dict, quant_config: dict,
                       dtype: torch.dtype) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        """(module, its on-disk tensors) for every quantized linear; ``dtype``: the model's, for scales."""
        raise NotImplementedError

    def write(self, out: Path, hf_config: dict, dense: dict[str, torch.Tensor], quantized, quant_config: dict,
              dtype: torch.dtype) -> None:
        """A whole checkpoint at once (convert); quantize writes a layer at a time through the same methods."""
        write_quantized_dir(out, hf_config, dense, self.module_tensors(quantized, quant_config, dtype), quant_config)
        self.write_side_files(out, quant_config)

    def write_side_files(self, out: Path, quant_config: dict) -> None:
        """Files beside config.json that the format's older loaders read."""

    def notes(self, scheme: CheckpointScheme) -> list[str]:
        """What a user should know about a checkpoint of this scheme in this format (loaders that refuse it...)."""
        return []

    def open(self, path: Path) -> StoredCheckpoint:
        """The checkpoint's config and tensor names, to read a module at a time."""
        raise NotImplementedError


# Weight-only formats that carry FP8 KV-cache scales as plain tensors, which their vLLM methods may not read.
KV_SCALES_NOTE = ("KV-cache scales written as <layer>.self_attn.k_scale/v_scale; vLLM's {format} method may "
                  "ignore them and fall back to 1.0: prefer --format compressed-tensors for FP8 KV")

FORMATS: dict[str, CheckpointFormat] = {}


def register(cls: type[CheckpointFormat]) -> type[CheckpointFormat]:
    if cls.name in FORMATS:
        raise ValueError(f"format {cls.name!r} registered twice")
    FORMATS[cls.name] = cls()
    return cls
