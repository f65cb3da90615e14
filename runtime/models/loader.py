"""Build a runtime model from any checkpoint quantkit reads (dense, compressed-tensors, AutoAWQ, GPTQ).

Quantized weights are dequantized at load for now (INT4/FP8 kernels come later). q/k/v and gate/up
are fused into one projection each. KV-cache scales (model.layers.N.self_attn.{k,v}_scale) are returned.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from quantkit.errors import QuantkitError
from quantkit.formats.checkpoints import read_checkpoint
from quantkit.formats.float_quantized import per_layer_kv_scales
from quantkit.formats.quantized import Fp8Weight
from quantkit.runtime.models.llama import LlamaConfig, LlamaForCausalLM

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def load_model(path: Path, dtype: torch.dtype, device: torch.device):
    """(model in eval mode on device, KV scales {layer: (k_scale, v_scale)})."""
    config, dense, quantized = read_checkpoint(path)
    if any(isinstance(w, Fp8Weight) and w.input_scale is not None for w in quantized.values()):
        warnings.warn("the runtime runs W8A8 checkpoints weight-only for now (activations stay in high precision)",
                      stacklevel=2)
    tensors = {name: t for name, t in dense.items() if not name.endswith(("k_scale", "v_scale"))}
    tensors.update({f"{name}.weight": w.dequantize(torch.float32) for name, w in quantized.items()})
    cfg = LlamaConfig.from_hf(config, attention_bias="model.layers.0.self_attn.q_proj.bias" in tensors)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    state = _runtime_state(tensors, cfg)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise QuantkitError(f"checkpoint {path} does not fit {config['architectures'][0]}: "
                            f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    converted: dict[int, torch.Tensor] = {}  # by source tensor, so tied weights stay one tensor
    model.load_state_dict({k: converted.setdefault(id(v), v.to(dtype)) for k, v in state.items()}, assign=True)
    # Rotary tables are computed, not stored: build them for real off the meta device.
    rotary = model.model.layers[0].self_attn.rotary.__class__(cfg.head_dim, cfg.max_position_embeddings,
                                                               cfg.rope_theta)
    for layer in model.model.layers:
        layer.self_attn.rotary = rotary
    return model.to(device).eval(), _kv_scales(dense)


def _runtime_state(tensors: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    state = dict(tensors)
    for i in range(cfg.num_layers):
        for module, fused, parts in (("self_attn", "qkv_proj", FUSED["qkv_proj"]),
                                     ("mlp", "gate_up_proj", FUSED["gate_up_proj"])):
            prefix = f"model.layers.{i}.{module}."
            for suffix in ("weight", "bias"):
                names = [f"{prefix}{p}.{suffix}" for p in parts]
                if all(n in state for n in names):
                    state[f"{prefix}{fused}.{suffix}"] = torch.cat([state.pop(n) for n in names])
    if "lm_head.weight" not in state and cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def _kv_scales(dense: dict[str, torch.Tensor]) -> dict[int, tuple[float, float]]:
    return per_layer_kv_scales(dense)[0]
