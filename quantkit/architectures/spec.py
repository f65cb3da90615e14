"""What quantkit needs to know about a model architecture, declared once: calibration, quantization, the
runtime and the loaders read it instead of keeping their own tables.

Module names are relative to one decoder layer (``self_attn.q_proj``) unless they say otherwise.
"""

from __future__ import annotations

import re
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
class Experts:
    """A sparse mixture-of-experts block in place of the MLP: a router (kept 16-bit) picks top-k experts per
    token, each expert a SwiGLU MLP stored as its own linears (``<block>.experts.<e>.<linear>``, the layout
    vLLM loads), which transformers fuses into 3-D parameters in memory."""
    block: str  # the block's module within the layer ("mlp")
    gate: str  # each expert's linears, by their names in the checkpoint
    up: str
    down: str
    router: str = "gate"  # within the block
    # the block's name in the checkpoint where transformers renames it on load (Mixtral: block_sparse_moe)
    stored_block: str | None = None
    count_key: str = "num_local_experts"  # the config.json key for the number of experts

    def linear(self, expert: int, name: str) -> str:
        return f"{self.block}.experts.{expert}.{name}"

    def groups(self, expert: int) -> tuple[InputGroup, InputGroup]:
        """One expert's input groups: gate/up read the routed tokens (no op of their own before them: the norm
        is shared by every expert and the router), down reads act(gate) * up, whose scales up may take."""
        gate, up, down = (self.linear(expert, n) for n in (self.gate, self.up, self.down))
        return InputGroup((gate, up)), InputGroup((down,), scales_into=up)


@dataclass(frozen=True)
class Architecture:
    name: str
    hf_architectures: tuple[str, ...]  # config.json "architectures" values this declaration covers
    input_groups: tuple[InputGroup, ...]
    # per-head RMSNorm of queries and keys before rotary (Qwen3): self_attn.q_norm / self_attn.k_norm
    qk_norm: bool = False
    # rope types (config rope_parameters / rope_scaling) the runtime computes; calibration and quantization take
    # transformers' own rotary tables
    rope_types: tuple[str, ...] = ("default", "llama3")
    # whether the config's sliding_window bounds attention (Mistral); Qwen2/3 say so with use_sliding_window
    sliding_window: bool = False
    # a sparse MoE block instead of the MLP (the input groups then declare the attention's only)
    experts: Experts | None = None
    # Gemma: attention and MLP outputs normed before they join the residual stream (post_attention_layernorm,
    # post_feedforward_layernorm), and the MLP's input normed by pre_feedforward_layernorm
    sandwich_norms: bool = False
    # what RMSNorm adds to its weight before scaling (Gemma: x * (1 + w)); AWQ folds scales into 1 + w
    norm_offset: float = 0.0

    def layer_window(self, config: dict, index: int) -> int | None:
        """The attention window of one decoder layer: configs with layer_types (Gemma 3) bound only their
        "sliding_attention" layers."""
        window = self.window(config)
        types = config.get("layer_types")
        if window and types and types[index] != "sliding_attention":
            return None
        return window

    def num_experts(self, config: dict) -> int:
        return int(config[self.experts.count_key]) if self.experts else 0

    def layer_groups(self, config: dict) -> tuple[InputGroup, ...]:
        """Every input group of one decoder layer, each expert's own groups included."""
        experts = tuple(group for e in range(self.num_experts(config)) for group in self.experts.groups(e))
        return self.input_groups + experts

    def layer_linears(self, config: dict) -> tuple[str, ...]:
        return tuple(name for group in self.layer_groups(config) for name in group.linears)

    def stored_name(self, name: str) -> str:
        """A module or tensor name (full, or within a layer) as the checkpoint spells it."""
        return self._rename(name, self.experts.block, self.experts.stored_block) if self._renamed else name

    def memory_name(self, name: str) -> str:
        """A checkpoint name as transformers' (and quantkit's) modules spell it."""
        return self._rename(name, self.experts.stored_block, self.experts.block) if self._renamed else name

    @property
    def _renamed(self) -> bool:
        return bool(self.experts and self.experts.stored_block and self.experts.stored_block != self.experts.block)

    @staticmethod
    def _rename(name: str, old: str, new: str) -> str:
        return re.sub(rf"(^|\.layers\.\d+\.){re.escape(old)}\.", rf"\g<1>{new}.", name)

    @property
    def fused_qkv(self) -> bool:
        """Whether the checkpoint itself stores q, k and v as one linear (Phi-3), in that order."""
        return self.input_groups[0].linears == ("self_attn.qkv_proj",)

    @property
    def fused_gate_up(self) -> bool:
        """Whether the checkpoint stores the MLP's gate and up as one linear (Phi-3), gate first."""
        return not self.experts and self.input_groups[2].linears == ("mlp.gate_up_proj",)

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
