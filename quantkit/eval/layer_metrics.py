"""Where in the network a candidate departs from its baseline: per decoder layer, the mean Jensen-Shannon
divergence between the two models' attention probabilities (every head and query row) and the SQNR of
the layer's output hidden state, on a few samples.

Baseline tensors are kept in float16 (so they can be cached); the candidate's are rounded the same way
before comparing, so identical models compare exactly equal (divergence 0, SQNR infinite).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from quantkit.eval.stats import Measurement, paired_bootstrap


@dataclass
class LayerComparison:
    js: np.ndarray  # [samples, layers] mean JS divergence of attention rows, nats
    signal: np.ndarray  # [samples, layers] sum of squared baseline hidden state
    noise: np.ndarray  # [samples, layers] sum of squared difference

    def sqnr_db(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Per-layer SQNR with signal and noise pooled over the chosen samples."""
        idx = np.arange(len(self.js)) if idx is None else idx
        signal, noise = self.signal[idx].sum(0), self.noise[idx].sum(0)
        with np.errstate(divide="ignore"):
            return np.where(noise > 0, 10 * np.log10(signal / np.where(noise > 0, noise, 1)), math.inf)

    def attention_shift(self, idx: np.ndarray | None = None) -> np.ndarray:
        idx = np.arange(len(self.js)) if idx is None else idx
        return self.js[idx].mean(0)


@contextmanager
def eager_attention(model):
    """Attention probabilities exist only on the eager path; restore the model's own afterwards."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


@torch.no_grad()
def _layer_outputs(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention probabilities [layers, heads, T, T] and layer outputs [layers, T, hidden], as float16."""
    device = next(model.parameters()).device
    with eager_attention(model):
        out = model(torch.tensor([ids], device=device), output_attentions=True, output_hidden_states=True)
    attentions = torch.stack([a[0] for a in out.attentions]).half().cpu()
    hidden = torch.stack([h[0] for h in out.hidden_states[1:]]).half().cpu()
    return attentions, hidden


def baseline_pass(model, samples: list[list[int]], on_step=None) -> dict[str, torch.Tensor]:
    tensors = {}
    for i, ids in enumerate(samples):
        tensors[f"layers.{i}.attn"], tensors[f"layers.{i}.hidden"] = _layer_outputs(model, ids)
        if on_step:
            on_step()
    return tensors


def candidate_pass(model, samples: list[list[int]], baseline: dict[str, torch.Tensor], on_step=None) -> LayerComparison:
    js, signal, noise = [], [], []
    for i, ids in enumerate(samples):
        attn, hidden = _layer_outputs(model, ids)
        js.append(js_divergence(baseline[f"layers.{i}.attn"].double(), attn.double()).mean(dim=(1, 2)).numpy())
        base = baseline[f"layers.{i}.hidden"].double()
        signal.append(base.pow(2).sum(dim=(1, 2)).numpy())
        noise.append((base - hidden.double()).pow(2).sum(dim=(1, 2)).numpy())
        if on_step:
            on_step()
    return LayerComparison(np.stack(js), np.stack(signal), np.stack(noise))


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence (nats) along the last dimension; 0 log 0 counts as 0."""
    m = (p + q) / 2

    def part(x):
        return torch.where(x > 0, x * (x.clamp(min=1e-300).log() - m.clamp(min=1e-300).log()), 0.0).sum(-1)

    return ((part(p) + part(q)) / 2).clamp(min=0)


def measurements(comparison: LayerComparison, bootstrap) -> list[Measurement]:
    c = comparison
    kwargs = dict(resamples=bootstrap.resamples, confidence=bootstrap.confidence, seed=bootstrap.seed)
    n = len(c.js)
    shift = paired_bootstrap(n, lambda idx: c.attention_shift(idx).max(), **kwargs)
    sqnr = paired_bootstrap(n, lambda idx: c.sqnr_db(idx).min(), **kwargs)
    return [Measurement("attention_shift_max", "layers", 0.0, shift.value, shift, "samples"),
            Measurement("layer_sqnr_min_db", "layers", math.inf, sqnr.value, sqnr, "samples")]
