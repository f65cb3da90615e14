"""Assemble a quantized checkpoint directory: weights + config through quantkit.formats, the source
model's tokenizer files, the recipe, and quantkit.json (what made it).

Formats: compressed-tensors (every recipe), AutoAWQ GEMM and GPTQ (INT4/INT8 weight-only recipes; their
kernels read fp16 scales, so the pipeline must round scales to fp16 for them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.formats import autoawq, gptq
from quantkit.formats import compressed_tensors as ct
from quantkit.formats import float_quantized
from quantkit.quantize.pipeline import QuantizedModel
from quantkit.recipes import Recipe

NOT_COPIED = {"config.json", "model.safetensors.index.json", "quantkit-source.json"}


FORMATS = ("compressed-tensors", "autoawq", "gptq")


def check_format(recipe: Recipe, fmt: str) -> None:
    """Refuse, before any work, a recipe the format cannot hold."""
    if fmt not in FORMATS:
        raise QuantkitError(f"unknown --format {fmt}", hint=f"use one of {', '.join(FORMATS)}")
    if fmt == "compressed-tensors":
        return
    if recipe.quantization.method == "fp8":
        raise QuantkitError(f"--format {fmt} holds integer weights; recipe {recipe.name} is FP8",
                            hint="FP8 checkpoints are written as compressed-tensors")
    if fmt == "autoawq" and recipe.weights.bits != 4:
        raise QuantkitError(f"--format autoawq holds 4-bit weights only; recipe {recipe.name} has "
                            f"{recipe.weights.bits}", hint="use --format gptq or compressed-tensors")


def write_checkpoint(model: QuantizedModel, recipe: Recipe, source: Path, out: Path, provenance: dict,
                     fmt: str = "compressed-tensors") -> list[str]:
    """Write the checkpoint; returns warnings for the user (what a consumer may not honour)."""
    config = {k: v for k, v in model.config.items() if k != "quantization_config"}
    config["dtype"] = str(model.dtype).replace("torch.", "")
    dense = {**model.dense, **model.kv_scales}
    warnings = []
    if fmt == "compressed-tensors":
        quant_config = _ct_quantization_config(recipe, ignore=["lm_head", *model.ignored])
        ct.write_checkpoint(out, config, dense, model.quantized, quant_config, model.dtype)
    else:
        if model.kv_scales:
            warnings.append(f"KV-cache scales written as <layer>.self_attn.k_scale/v_scale; vLLM's {fmt} method "
                            "may ignore them and fall back to 1.0: prefer --format compressed-tensors for FP8 KV")
        weights = recipe.weights
        act_order = bool(getattr(recipe.quantization, "act_order", False))
        if fmt == "autoawq":
            quant_config = autoawq.quantization_config(weights.group_size,
                                                       modules_to_not_convert=["lm_head", *model.ignored])
            autoawq.write_checkpoint(out, config, dense, model.quantized, quant_config)
        else:
            # Static act-order groups stay contiguous (g_idx[k] = k // G): no desc_act needed to read them.
            options = recipe.quantization
            quant_config = gptq.quantization_config(
                weights.bits, weights.group_size, weights.symmetric, desc_act=False,
                damp_percent=getattr(options, "dampening", 0.01), static_groups=act_order)
            gptq.write_checkpoint(out, config, dense, model.quantized, quant_config)
    for file in source.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name not in NOT_COPIED:
            shutil.copy2(file, out / file.name)
    (out / "recipe.yaml").write_text(recipe.to_yaml())
    (out / "quantkit.json").write_text(json.dumps(provenance, indent=2, ensure_ascii=False))
    return warnings


def _ct_quantization_config(recipe: Recipe, ignore: list[str]) -> dict:
    method, weights = recipe.quantization, recipe.weights
    kv_cache = recipe.kv_cache_scheme is not None
    if method.method == "fp8":
        return float_quantized.quantization_config(method.activations, ignore, kv_cache=kv_cache,
                                                   version=ct.CT_VERSION)
    # act order with static groups keeps groups contiguous: compressed-tensors calls that actorder "weight".
    act_order = getattr(method, "act_order", False)
    return ct.quantization_config(weights.bits, weights.group_size, weights.symmetric,
                                  actorder="weight" if act_order else None, ignore=ignore,
                                  kv_cache_scheme=float_quantized.kv_cache_scheme() if kv_cache else None)
