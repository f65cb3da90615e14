"""What a quantized checkpoint holds, in the terms formats decide on: the one description that
`quantize` (from a recipe) and `convert` (from a checkpoint's weights) hand to a format's ``can_hold``,
its ``quantization_config`` and its writer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CheckpointScheme:
    kind: Literal["int", "float"]  # integer codes on a grid, or float8_e4m3fn values
    bits: int
    group_size: int  # input channels per scale; -1: one scale per output channel
    symmetric: bool
    # "static": columns were reordered while quantizing but groups stay contiguous (nothing extra on disk);
    # "permuted": groups follow a stored g_idx
    act_order: Literal["static", "permuted"] | None = None
    activations: Literal["dynamic", "static"] | None = None  # W8A8: inputs quantized per token, or by a stored scale
    kv_cache: bool = False  # FP8 KV-cache scales travel with the weights
    dampening: float | None = None  # GPTQ's, recorded where the format keeps it

    @property
    def label(self) -> str:
        """A few characters for tables and messages, e.g. "int4 g64 asym" or "fp8 channel"."""
        if self.kind == "float":
            return "fp8 channel"
        if self.activations:
            return f"int{self.bits} w8a8 {self.activations}"
        group = "channel" if self.group_size == -1 else f"g{self.group_size}"
        return f"int{self.bits} {group} {'sym' if self.symmetric else 'asym'}"
