"""Assemble a quantized checkpoint directory: weights + config through quantkit.formats, the source
model's tokenizer files, the recipe, and quantkit.json (what made it). Weights are written as the
pipeline makes them, a layer at a time, so the whole quantized model is never in memory.

Formats: compressed-tensors (every recipe), AutoAWQ GEMM and GPTQ (INT4/INT8 weight-only recipes; their
kernels read fp16 scales, so the pipeline must round scales to fp16 for them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from quantkit.errors import QuantkitError
from quantkit.formats import autoawq, gptq
from quantkit.formats import compressed_tensors as ct
from quantkit.formats import float_quantized
from quantkit.formats.common import DEFAULT_MAX_SHARD_BYTES, QuantizedDirWriter
from quantkit.formats.quantized import Fp8Weight, QuantizedWeight
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


class CheckpointWriter:
    """A quantized checkpoint in the making: ``add`` converts each piece the pipeline hands over to the
    format's tensors and writes them out in shards (see QuantizedDirWriter); ``finish`` writes the configs
    (the ignore list is only known at the end), the tokenizer files, the recipe and quantkit.json."""

    def __init__(self, recipe: Recipe, fmt: str, source: Path, out: Path, config: dict, dtype: torch.dtype,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES):
        self.recipe, self.fmt, self.source, self.out, self.dtype = recipe, fmt, source, out, dtype
        self.config = {k: v for k, v in config.items() if k != "quantization_config"}
        self.config["dtype"] = str(dtype).replace("torch.", "")
        self._files = QuantizedDirWriter(out, bool(config.get("tie_word_embeddings", False)), max_shard_bytes)
        # The weight scheme the tensors are checked against; the ignore list does not change it.
        self._scheme = _quantization_config(recipe, fmt, ignored=[])

    def add(self, dense: dict[str, torch.Tensor], quantized: dict[str, QuantizedWeight | Fp8Weight]) -> None:
        self._files.add_dense(dense)
        if self.fmt == "compressed-tensors":
            self._files.add_modules(ct.module_tensors(quantized, self._scheme, self.dtype))
        elif self.fmt == "autoawq":
            self._files.add_modules(autoawq.module_tensors(quantized, self._scheme))
        else:
            self._files.add_modules(gptq.module_tensors(quantized, self._scheme))

    def finish(self, ignored: list[str], provenance: dict) -> list[str]:
        """Returns warnings for the user (what a consumer may not honour)."""
        quant_config = _quantization_config(self.recipe, self.fmt, ignored)
        self._files.finish(self.config, quant_config)
        warnings = []
        if self.fmt == "gptq":
            gptq.write_side_config(self.out, quant_config)
        if self.fmt != "compressed-tensors" and self.recipe.kv_cache_scheme is not None:
            warnings.append(f"KV-cache scales written as <layer>.self_attn.k_scale/v_scale; vLLM's {self.fmt} "
                            "method may ignore them and fall back to 1.0: prefer --format compressed-tensors "
                            "for FP8 KV")
        for file in self.source.iterdir():
            if file.is_file() and file.suffix != ".safetensors" and file.name not in NOT_COPIED:
                shutil.copy2(file, self.out / file.name)
        (self.out / "recipe.yaml").write_text(self.recipe.to_yaml())
        (self.out / "quantkit.json").write_text(json.dumps(provenance, indent=2, ensure_ascii=False))
        return warnings


def _quantization_config(recipe: Recipe, fmt: str, ignored: list[str]) -> dict:
    """The format's quantization_config; `ignored` are the decoder linears left dense (lm_head always is)."""
    if fmt == "compressed-tensors":
        return _ct_quantization_config(recipe, ignore=["lm_head", *ignored])
    weights = recipe.weights
    if fmt == "autoawq":
        return autoawq.quantization_config(weights.group_size, modules_to_not_convert=["lm_head", *ignored])
    # Static act-order groups stay contiguous (g_idx[k] = k // G): no desc_act needed to read them.
    options = recipe.quantization
    return gptq.quantization_config(weights.bits, weights.group_size, weights.symmetric, desc_act=False,
                                    damp_percent=getattr(options, "dampening", 0.01),
                                    static_groups=bool(getattr(options, "act_order", False)))


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
