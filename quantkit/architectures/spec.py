"""What quantkit needs to know about a model architecture, declared once: calibration, quantization, the
runtime and the loaders read it instead of keeping their own tables.

Module names are relative to one decoder layer (``self_attn.q_proj``) unless they say otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InputGroup:
    """Linears that read the same input, in the order the layer runs them."""
    linears: tuple[str, ...]
    # the runtime's single projection for them (its weight is theirs, concatenated along the outputs)
    fused_as: str | None = None
    # the op right before them whose outputs AWQ may divide by its input scales (a norm, or a linear
    # whose outputs feed them unchanged); None where nothing in between can absorb a scale
    scales_into: str | None = None


@dataclass(frozen=True)
class Architecture:
    name: str
    hf_architectures: tuple[str, ...]  # config.json "architectures" values this declaration covers
    input_groups: tuple[InputGroup, ...]
    # per-head RMSNorm of queries and keys before rotary (Qwen3): self_attn.q_norm / self_attn.k_norm
    qk_norm: bool = False
    # rope types (config rope_parameters / rope_scaling) the runtime and calibration compute exactly
    rope_types: tuple[str, ...] = ("default", "llama3")
    # whether the config's sliding_window bounds attention (Mistral); Qwen2/3 say so with use_sliding_window
    sliding_window: bool = False

    @property
    def stages(self) -> tuple[tuple[str, ...], ...]:
        """The linears of each input group, in execution order."""
        return tuple(group.linears for group in self.input_groups)

    @property
    def linears(self) -> tuple[str, ...]:
        return tuple(name for group in self.input_groups for name in group.linears)

    @property
    def fused(self) -> dict[str, tuple[str, ...]]:
        """The runtime's fused projections and the linears behind each."""
        return {group.fused_as: group.linears for group in self.input_groups if group.fused_as}

    def window(self, config: dict) -> int | None:
        """The attention window in tokens where this config bounds attention, else None."""
        window = config.get("sliding_window")
        if not window:
            return None
        if self.sliding_window or config.get("use_sliding_window"):
            return int(window)
        return None
