"""Assemble a quantized checkpoint directory: weights + config through quantkit.formats, the source
model's tokenizer files, the recipe, and quantkit.json (what made it). Weights are written as the
pipeline makes them, a layer at a time, so the whole quantized model is never in memory.

The format is a registered one (quantkit.formats.registry): it says whether it can hold what the recipe
makes, before any work, and what notes the user should read about the result.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from quantkit.errors import QuantkitError
from quantkit.formats.checkpoints import get_format
from quantkit.formats.common import DEFAULT_MAX_SHARD_BYTES, QuantizedDirWriter
from quantkit.formats.quantized import Fp8Weight, QuantizedWeight
from quantkit.formats.registry import CheckpointFormat
from quantkit.recipes import Recipe

NOT_COPIED = {"config.json", "model.safetensors.index.json", "quantkit-source.json"}


def check_format(recipe: Recipe, fmt: str) -> CheckpointFormat:
    """The format, or a refusal before any work when it cannot hold what the recipe makes."""
    checkpoint_format = get_format(fmt)
    reason = checkpoint_format.can_hold(recipe.checkpoint_scheme)
    if reason:
        raise QuantkitError(f"--format {fmt} cannot hold recipe {recipe.name} ({recipe.weights_label}): {reason}",
                            hint="compressed-tensors holds every recipe")
    return checkpoint_format


class CheckpointWriter:
    """A quantized checkpoint in the making: ``add`` converts each piece the pipeline hands over to the
    format's tensors and writes them out in shards (see QuantizedDirWriter); ``finish`` writes the configs
    (the ignore list is only known at the end), the tokenizer files, the recipe and quantkit.json."""

    def __init__(self, recipe: Recipe, fmt: str, source: Path, out: Path, config: dict, dtype: torch.dtype,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES):
        self.recipe, self.source, self.out, self.dtype = recipe, source, out, dtype
        self.format = check_format(recipe, fmt)
        self.config = {k: v for k, v in config.items() if k != "quantization_config"}
        self.config["dtype"] = str(dtype).replace("torch.", "")
        self._files = QuantizedDirWriter(out, bool(config.get("tie_word_embeddings", False)), max_shard_bytes)
        # The weight scheme the tensors are checked against; the ignore list does not change it.
        self._scheme = self.format.quantization_config(recipe.checkpoint_scheme, ignore=["lm_head"])

    def add(self, dense: dict[str, torch.Tensor], quantized: dict[str, QuantizedWeight | Fp8Weight]) -> None:
        self._files.add_dense(dense)
        self._files.add_modules(self.format.module_tensors(quantized, self._scheme, self.dtype))

    def finish(self, ignored: list[str], provenance: dict) -> list[str]:
        """Returns warnings for the user (what a consumer may not honour)."""
        quant_config = self.format.quantization_config(self.recipe.checkpoint_scheme, ignore=["lm_head", *ignored])
        self._files.finish(self.config, quant_config)
        self.format.write_side_files(self.out, quant_config)
        warnings = self.format.notes(self.recipe.checkpoint_scheme)
        for file in self.source.iterdir():
            if file.is_file() and file.suffix != ".safetensors" and file.name not in NOT_COPIED:
                shutil.copy2(file, self.out / file.name)
        (self.out / "recipe.yaml").write_text(self.recipe.to_yaml())
        (self.out / "quantkit.json").write_text(json.dumps(provenance, indent=2, ensure_ascii=False))
        return warnings
