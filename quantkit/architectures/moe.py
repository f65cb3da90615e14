"""Experts as separate linears. transformers keeps an MoE block's experts as fused 3-D parameters; quantkit
quantizes, observes and stores each expert's linears on their own, under the checkpoint's own names
(``mlp.experts.<e>.gate_proj``), so the skeletons it builds swap the fused module for this one."""

from __future__ import annotations

import torch
from torch import nn

from quantkit.architectures.spec import Architecture


class Expert(nn.Module):
    """One SwiGLU expert: down(act(gate(x)) * up(x)), its linears named as the architecture declares."""

    def __init__(self, names: tuple[str, str, str], hidden: int, intermediate: int, act_fn):
        super().__init__()
        self.names, self.act_fn = names, act_fn
        gate, up, down = names
        setattr(self, gate, nn.Linear(hidden, intermediate, bias=False))
        setattr(self, up, nn.Linear(hidden, intermediate, bias=False))
        setattr(self, down, nn.Linear(intermediate, hidden, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(self.act_fn(gate(x)) * up(x))


class ExpertLinears(nn.ModuleList):
    """A drop-in for transformers' fused experts: called as experts(hidden [T, H], top_k_index [T, k],
    top_k_weights [T, k]) -> [T, H], the routed experts' outputs weighted and summed per token."""

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        for index, expert in enumerate(self):
            tokens, slot = torch.where(top_k_index == index)
            if tokens.numel():
                y = expert(hidden[tokens]) * top_k_weights[tokens, slot, None]
                out.index_add_(0, tokens, y.to(out.dtype))
        return out


def unfuse_experts(model: nn.Module, architecture: Architecture, config) -> None:
    """Swap each decoder layer's fused experts for ExpertLinears (on the model's current device, e.g. meta)."""
    experts = architecture.experts
    if experts is None:
        return
    names = (experts.gate, experts.up, experts.down)
    for layer in model.model.layers:
        block = layer.get_submodule(experts.block)
        fused = block.experts
        device = next(fused.parameters()).device
        with torch.device(device):
            block.experts = ExpertLinears(
                Expert(names, fused.hidden_dim, fused.intermediate_dim, fused.act_fn)
                for _ in range(architecture.num_experts(config.to_dict())))
