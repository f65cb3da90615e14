"""Build a runtime model from any checkpoint quantkit reads (dense, compressed-tensors, AutoAWQ, GPTQ).

q/k/v and gate/up are fused into one projection each. Quantized projections stay quantized (Int4Linear,
Fp8Linear, Int8Linear); those no runtime layer runs (2-bit integers, 8-bit ones outside W8A8 INT8, parts of
one fusion quantized differently) are dequantized to the compute dtype with a warning. KV-cache scales
(model.layers.N.self_attn.{k,v}_scale) are returned.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from quantkit.architectures import Architecture, architecture_of
from quantkit.errors import QuantkitError
from quantkit.formats.checkpoints import read_checkpoint
from quantkit.formats.float_quantized import per_layer_kv_scales
from quantkit.formats.quantized import Fp8Weight, Int8Weight, QuantizedWeight
from quantkit.memory import release_freed_memory
from quantkit.runtime.layers.int8_linear import Int8Linear
from quantkit.runtime.layers.linear import Fp8Linear, Int4Linear
from quantkit.runtime.models.llama import LlamaConfig, LlamaForCausalLM


def load_model(path: Path, dtype: torch.dtype, device: torch.device, kernels: str = "auto"):
    """(model in eval mode on device, KV scales {layer: (k_scale, v_scale)})."""
    config, dense, quantized = read_checkpoint(path)
    if any(isinstance(w, Fp8Weight) and w.input_scale is not None for w in quantized.values()):
        warnings.warn("the runtime runs FP8 W8A8 checkpoints weight-only for now (activations stay in high "
                      "precision)", stacklevel=2)
    tensors = {name: t for name, t in dense.items() if not name.endswith(("k_scale", "v_scale"))}
    architecture = architecture_of(config, str(path))
    cfg = LlamaConfig.from_hf(config, attention_bias="model.layers.0.self_attn.q_proj.bias" in tensors,
                              o_proj_bias="model.layers.0.self_attn.o_proj.bias" in tensors)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    for name, parts in _runtime_modules(quantized, cfg, architecture).items():
        bias_names = [f"{n}.bias" for n in _parts(name, architecture)]
        bias = torch.cat([tensors[n] for n in bias_names]) if all(n in tensors for n in bias_names) else None
        layer = _quantized_linear(parts, bias, dtype, kernels, device)
        if layer is None:  # not runnable quantized: dense weights, loaded with the rest below
            tensors.update({f"{n}.weight": w.dequantize(torch.float32)
                            for n, w in zip(_parts(name, architecture), parts)})
            continue
        for n in bias_names:
            tensors.pop(n, None)
        parent, child = name.rsplit(".", 1) if "." in name else ("", name)
        setattr(model.get_submodule(parent), child, layer)
    state = _runtime_state(tensors, cfg, architecture)
    expected = {k for k, v in model.state_dict().items() if v.is_meta}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise QuantkitError(f"checkpoint {path} does not fit {config['architectures'][0]}: "
                            f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    converted: dict[int, torch.Tensor] = {}  # by source tensor, so tied weights stay one tensor
    model.load_state_dict({k: converted.setdefault(id(v), v.to(dtype)) for k, v in state.items()},
                          strict=False, assign=True)
    # Rotary tables are computed, not stored: build them for real off the meta device.
    rotary = model.model.layers[0].self_attn.rotary.__class__(cfg.head_dim, cfg.max_position_embeddings,
                                                               cfg.rope_theta, dict(cfg.rope))
    for layer in model.model.layers:
        layer.self_attn.rotary = rotary
    model, kv_scales = model.to(device).eval(), _kv_scales(dense)
    del dense, quantized, tensors, state, converted
    release_freed_memory()
    return model, kv_scales


def _runtime_state(tensors: dict[str, torch.Tensor], cfg: LlamaConfig,
                   architecture: Architecture) -> dict[str, torch.Tensor]:
    """Dense tensors by runtime name: the declared fused projections' parts concatenated (weights and biases)."""
    state = dict(tensors)
    for i in range(cfg.num_layers):
        for fused, parts in architecture.fused.items():
            for suffix in ("weight", "bias"):
                names = [f"model.layers.{i}.{p}.{suffix}" for p in parts]
                if all(n in state for n in names):
                    state[f"model.layers.{i}.{fused}.{suffix}"] = torch.cat([state.pop(n) for n in names])
    if "lm_head.weight" not in state and cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def _runtime_modules(quantized: dict, cfg: LlamaConfig, architecture: Architecture) -> dict[str, list]:
    """Quantized weights by runtime module name, the parts of a declared fused projection under its name."""
    modules = dict((name, [w]) for name, w in quantized.items())
    for i in range(cfg.num_layers):
        for fused, parts in architecture.fused.items():
            names = [f"model.layers.{i}.{p}" for p in parts]
            if all(n in modules for n in names):
                modules[f"model.layers.{i}.{fused}"] = [modules.pop(n)[0] for n in names]
    return modules


def _parts(name: str, architecture: Architecture) -> list[str]:
    """The checkpoint module names behind a runtime module name."""
    if ".layers." not in name:
        return [name]
    within = name.split(".layers.", 1)[1].split(".", 1)[1]
    prefix = name[: -len(within)]
    return [prefix + p for p in architecture.fused.get(within, (within,))]


def _quantized_linear(parts: list, bias: torch.Tensor | None, dtype: torch.dtype, kernels: str,
                      device: torch.device) -> nn.Module | None:
    """A runtime layer that keeps the weights quantized, or None (with a warning) when none runs them."""
    if all(isinstance(w, Fp8Weight) for w in parts):
        return Fp8Linear(parts, bias, dtype, device)
    if all(isinstance(w, Int8Weight) for w in parts) and len({w.input_scale is None for w in parts}) == 1:
        return Int8Linear(parts, bias, dtype, kernels, device)
    first = parts[0]
    same_scheme = all(isinstance(w, QuantizedWeight) and w.bits == first.bits and w.group_size == first.group_size
                      and _same_g_idx(w.g_idx, first.g_idx) for w in parts)
    if same_scheme and first.bits == 4:
        return Int4Linear(parts, bias, dtype, kernels, device)
    reason = f"{first.bits}-bit integers" if same_scheme else "parts of one fused projection quantized differently"
    warnings.warn(f"no quantized runtime layer for {reason}: dequantized to the compute dtype", stacklevel=3)
    return None


def _same_g_idx(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _kv_scales(dense: dict[str, torch.Tensor]) -> dict[int, tuple[float, float]]:
    return per_layer_kv_scales(dense)[0]
