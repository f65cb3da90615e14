"""Run a Llama-family model one decoder layer at a time, holding only that layer's weights in memory.

The model is built as a skeleton on the meta device; a layer's weights are read from safetensors
just before it runs and dropped right after. Peak memory is about one layer plus the cached
activations, which is what makes calibrating a model larger than RAM possible.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from quantkit.architectures import architecture_of
from quantkit.architectures.moe import unfuse_experts
from quantkit.errors import QuantkitError
from quantkit.models import load_config, restore_embedding_scale


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
        restore_embedding_scale(self.decoder.embed_tokens)

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

    def position_embeddings(self, hidden: torch.Tensor, layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary cos/sin for [1, tokens, ...]; layer: whose tables, where layers differ (see rotary_kind)."""
        positions = torch.arange(hidden.shape[1]).unsqueeze(0)
        kind = None if layer is None else self.rotary_kind(layer)
        return self.rotary(hidden, positions) if kind is None else self.rotary(hidden, positions, kind)

    def rotary_kind(self, layer: int) -> str | None:
        """The key of a layer's rotary tables where a model keeps several (Gemma 3: local and global layers
        differ in rope base), else None: every layer shares one."""
        if "layer_type" not in inspect.signature(self.rotary.forward).parameters:
            return None
        return self.config.layer_types[layer]

    @contextmanager
    def layer(self, index: int) -> Iterator[nn.Module]:
        with self._materialized(self.decoder.layers[index], f"model.layers.{index}") as layer:
            yield layer

    def run_layer(self, layer: nn.Module, hidden: torch.Tensor,
                  rotary: tuple[torch.Tensor, torch.Tensor], window: int | None = None) -> torch.Tensor:
        """One sample [1, tokens, hidden] through a layer: causal attention (no mask needed), bounded to
        ``window`` tokens where the layer has a sliding window shorter than the sample."""
        mask = None
        tokens = hidden.shape[1]
        if window is not None and tokens > window:
            query, key = torch.arange(tokens)[:, None], torch.arange(tokens)[None, :]
            mask = ((key <= query) & (key > query - window))[None, None]
        with torch.no_grad():
            out = layer(hidden, position_embeddings=rotary, attention_mask=mask)
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
