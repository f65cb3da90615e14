"""Assemble a quantized checkpoint directory: weights + config through quantkit.formats, the source
model's tokenizer files, the recipe, and quantkit.json (what made it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from quantkit.formats import compressed_tensors as ct
from quantkit.formats import float_quantized
from quantkit.quantize.pipeline import QuantizedModel
from quantkit.recipes import Recipe

NOT_COPIED = {"config.json", "model.safetensors.index.json", "quantkit-source.json"}


def write_compressed_tensors(model: QuantizedModel, recipe: Recipe, source: Path, out: Path,
                             provenance: dict) -> None:
    quant_config = _ct_quantization_config(recipe, ignore=["lm_head", *model.ignored])
    config = {k: v for k, v in model.config.items() if k != "quantization_config"}
    config["dtype"] = str(model.dtype).replace("torch.", "")
    ct.write_checkpoint(out, config, {**model.dense, **model.kv_scales}, model.quantized, quant_config, model.dtype)
    for file in source.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name not in NOT_COPIED:
            shutil.copy2(file, out / file.name)
    (out / "recipe.yaml").write_text(recipe.to_yaml())
    (out / "quantkit.json").write_text(json.dumps(provenance, indent=2, ensure_ascii=False))


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
