"""Run a Llama-family model one decoder layer at a time, holding only that layer's weights in memory.

The model is built as a skeleton on the meta device; a layer's weights are read from safetensors
just before it runs and dropped right after. Peak memory is about one layer plus the cached
activations, which is what makes calibrating a model larger than RAM possible.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from quantkit.architectures import architecture_of
from quantkit.architectures.moe import unfuse_experts
from quantkit.errors import QuantkitError
from quantkit.models import load_config


class WeightStore:
    """Reads individual tensors from a model directory's safetensors files on demand."""

    def __init__(self, path: Path):
        index = path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._file_of = {name: path / file for name, file in weight_map.items()}
        else:
            from safetensors import safe_open

            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise QuantkitError(f"model directory {path} has no *.safetensors weights")
            self._file_of = {}
            for file in files:
                with safe_open(file, framework="pt") as f:
                    self._file_of.update({name: file for name in f.keys()})

    def names(self) -> list[str]:
        return list(self._file_of)

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        missing = [n for n in names if n not in self._file_of]
        if missing:
            raise QuantkitError(f"weights missing from the checkpoint: {', '.join(missing[:3])}")
        out = {}
        for file in {self._file_of[n] for n in names}:
            with safe_open(file, framework="pt") as f:
                out.update({n: f.get_tensor(n) for n in names if self._file_of[n] == file})
        return out


class LayerwiseModel:
    """Embedding, decoder layers and rotary embedding of a causal LM, materialized one piece at a time."""

    def __init__(self, path: Path, dtype: torch.dtype = torch.float32):
        from transformers import AutoModelForCausalLM

        self.config = load_config(path)
        self.dtype = dtype
        self.store = WeightStore(path)
        # sdpa with no mask is causal attention, which is what single unpadded sequences need.
        self.config._attn_implementation = "sdpa"
        with torch.device("meta"):
            self.skeleton = AutoModelForCausalLM.from_config(self.config, dtype=dtype)
        self.architecture = architecture_of(self.config.to_dict(), str(path))
        unfuse_experts(self.skeleton, self.architecture, self.config)  # experts as their stored linears
        self.decoder = self.skeleton.model
        # The rotary embedding has only computed buffers, no weights: build a real one on CPU.
        self.rotary = type(self.decoder.rotary_emb)(config=self.config)

    @property
    def num_layers(self) -> int:
        return len(self.decoder.layers)

    def embed(self, input_ids: list[list[int]]) -> list[torch.Tensor]:
        return list(self.embed_each(input_ids))

    def embed_each(self, input_ids: list[list[int]]) -> Iterator[torch.Tensor]:
        """Sample by sample, for callers that store each embedding as it comes (e.g. to disk)."""
        with self._materialized(self.decoder.embed_tokens, "model.embed_tokens") as embed, torch.no_grad():
            for ids in input_ids:
                yield embed(torch.tensor([ids]))

    def position_embeddings(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(hidden.shape[1]).unsqueeze(0)
        return self.rotary(hidden, positions)

    @contextmanager
    def layer(self, index: int) -> Iterator[nn.Module]:
        with self._materialized(self.decoder.layers[index], f"model.layers.{index}") as layer:
            yield layer

    def run_layer(self, layer: nn.Module, hidden: torch.Tensor,
                  rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            out = layer(hidden, position_embeddings=rotary, attention_mask=None)
        return out[0] if isinstance(out, tuple) else out

    @contextmanager
    def _materialized(self, module: nn.Module, prefix: str) -> Iterator[nn.Module]:
        names = list(module.state_dict().keys())
        stored = {n: self.architecture.stored_name(f"{prefix}.{n}") for n in names}  # Mixtral's block is renamed
        tensors = self.store.load(list(stored.values()))
        state = {n: tensors[stored[n]].to(self.dtype) for n in names}
        module.load_state_dict(state, assign=True)
        try:
            yield module
        finally:
            module.to_empty(device="meta")  # drop the weights; the skeleton stays
