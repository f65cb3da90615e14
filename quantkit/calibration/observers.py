"""Activation statistics gathered by hooks while a decoder layer runs.

- Linear inputs: per input channel absmax and mean |x| (AWQ's activation scale, FP8 input scales).
- K and V: per KV head absmax of the keys after rotary embedding (what a KV cache stores) and of the
  values, for FP8 KV-cache scales (scale = absmax / 448).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class ChannelStats:
    absmax: torch.Tensor
    sum_abs: torch.Tensor
    count: int = 0

    @classmethod
    def empty(cls, channels: int) -> ChannelStats:
        return cls(torch.zeros(channels), torch.zeros(channels, dtype=torch.float64))

    def update(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1]).abs().float()
        self.absmax = torch.maximum(self.absmax, flat.amax(dim=0))
        self.sum_abs += flat.sum(dim=0, dtype=torch.float64)
        self.count += flat.shape[0]

    @property
    def mean_abs(self) -> torch.Tensor:
        return (self.sum_abs / max(self.count, 1)).float()


def rotate_keys(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) on keys shaped [batch, heads, seq, head_dim]."""
    half = keys.shape[-1] // 2
    rotated = torch.cat((-keys[..., half:], keys[..., :half]), dim=-1)
    return keys * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


class LayerObserver:
    """Hooks one decoder layer; call ``set_rotary`` before each forward so keys can be rotated."""

    def __init__(self, layer: nn.Module, prefix: str, num_kv_heads: int, head_dim: int, qk_norm: bool = False):
        """qk_norm: keys are normed per head after k_proj (Qwen3, Gemma 3); the cache stores them normed, then
        rotated."""
        self.prefix = prefix
        self.linears = {name: ChannelStats.empty(m.in_features)
                        for name, m in layer.named_modules() if isinstance(m, nn.Linear)}
        self.k_absmax = torch.zeros(num_kv_heads)
        self.v_absmax = torch.zeros(num_kv_heads)
        self._shape = (num_kv_heads, head_dim)
        self._rotary: tuple[torch.Tensor, torch.Tensor] | None = None
        self._handles = [
            m.register_forward_pre_hook(self._linear_hook(name))
            for name, m in layer.named_modules() if isinstance(m, nn.Linear)
        ]
        attn = layer.self_attn
        if hasattr(attn, "qkv_proj"):  # q, k and v fused in one linear (Phi-3): slice k and v out of its output
            q_size = attn.qkv_proj.out_features - 2 * num_kv_heads * head_dim
            kv_size = num_kv_heads * head_dim
            self._handles.append(attn.qkv_proj.register_forward_hook(
                self._kv_hook(is_key=True, part=slice(q_size, q_size + kv_size))))
            self._handles.append(attn.qkv_proj.register_forward_hook(
                self._kv_hook(is_key=False, part=slice(q_size + kv_size, None))))
        else:
            self._handles.append(attn.k_proj.register_forward_hook(self._kv_hook(is_key=True)))
            self._handles.append(attn.v_proj.register_forward_hook(self._kv_hook(is_key=False)))
        # keys are normed per head before rotary (Qwen3, Gemma 3): norm them here as the layer does (an RMSNorm
        # over each head's vector, whatever layout the layer calls it on)
        self._key_norm = attn.k_norm if qk_norm else None

    def set_rotary(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self._rotary = (cos, sin)

    def _linear_hook(self, name: str):
        def hook(module, args):
            self.linears[name].update(args[0])
        return hook

    def _kv_hook(self, is_key: bool, part: slice | None = None):
        def hook(module, args, output):
            if part is not None:
                output = output[..., part]
            batch, seq, _ = output.shape
            states = output.detach().float().reshape(batch, seq, *self._shape)
            if is_key and self._key_norm is not None:
                states = self._key_norm(states).float()
            states = states.transpose(1, 2)
            if is_key:
                cos, sin = self._rotary
                states = rotate_keys(states, cos.float(), sin.float())
                self.k_absmax = torch.maximum(self.k_absmax, states.abs().amax(dim=(0, 2, 3)))
            else:
                self.v_absmax = torch.maximum(self.v_absmax, states.abs().amax(dim=(0, 2, 3)))
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def tensors(self) -> dict[str, torch.Tensor]:
        """Flat name -> tensor, with the checkpoint's module names, ready for safetensors."""
        out = {}
        for name, stats in self.linears.items():
            out[f"{self.prefix}.{name}.input_absmax"] = stats.absmax.clone()
            out[f"{self.prefix}.{name}.input_mean_abs"] = stats.mean_abs
        out[f"{self.prefix}.self_attn.k_absmax"] = self.k_absmax.clone()
        out[f"{self.prefix}.self_attn.v_absmax"] = self.v_absmax.clone()
        return out
