"""INT8 W8A8: int8 weights per output channel (GPTQ or plain rounding) and int8 inputs, per token at run time
(dynamic) or by a per-tensor scale from calibration (static: each stage's input absmax, the quantized outputs
of earlier stages propagating). With SmoothQuant, a first pass over the layer observes each stage's inputs and
folds per-channel smoothing scales into the op before it (see quantkit.algorithms.smoothquant); the second
pass quantizes the smoothed layer.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from quantkit.algorithms import gptq, int8, smoothquant
from quantkit.algorithms.rtn import rtn_quantize
from quantkit.formats.quantized import Int8Weight
from quantkit.formats.scheme import CheckpointScheme
from quantkit.quantize.folding import fold_input_scales, previous_ops
from quantkit.quantize.methods.base import (ComputeDtypes, LayerResult, LinearReport, QuantMethod, register,
                                            relative_errors)
from quantkit.quantize.methods.fp8 import share_expert_input_scales
from quantkit.quantize.staged import Activations, StagedLayer, run_stages

SMOOTHING_SAMPLE_TOKENS = 512  # rows each alpha candidate is scored on: ~0.1 s per stage on SmolLM2


class Int8Options(ComputeDtypes):
    """The weights section must say bits 8, symmetric, group_size -1."""
    method: Literal["int8"]
    activations: Literal["dynamic", "static"] = "dynamic"
    rounding: Literal["gptq", "rtn"] = "gptq"  # how the weights find their codes
    dampening: float = Field(0.01, gt=0, le=1)  # GPTQ's
    block_size: int = Field(128, ge=1)  # GPTQ's
    smoothquant: bool = True
    # SmoothQuant's alpha; None: searched per group of linears on the calibration tokens (see algorithms.smoothquant)
    smoothing_strength: float | None = Field(None, ge=0, le=1)


@register
class Int8(QuantMethod):
    options_class = Int8Options

    @classmethod
    def needs_calibration(cls, options: Int8Options) -> bool:
        return options.activations == "static" or options.rounding == "gptq" or options.smoothquant

    @classmethod
    def check_weights(cls, weights) -> None:
        if (weights.bits, weights.group_size, weights.symmetric) != (8, -1, True):
            raise ValueError("method int8 (W8A8) quantizes weights per output channel, symmetric, as int8 GEMMs "
                             "take them: set weights to {bits: 8, group_size: -1, symmetric: true}")

    @classmethod
    def check_architecture(cls, options: Int8Options, architecture) -> str | None:
        if options.smoothquant and architecture.experts:
            return ("smoothquant on MoE layers: the norm before the experts also feeds the router, which would "
                    "have to take the smoothing too; set smoothquant: false")
        return None

    @classmethod
    def checkpoint_scheme(cls, recipe) -> CheckpointScheme:
        return CheckpointScheme(kind="int", bits=8, group_size=-1, symmetric=True,
                                activations=recipe.quantization.activations,
                                kv_cache=recipe.kv_cache_scheme is not None)

    def quantize_layer(self, staged: StagedLayer, hidden: Activations | None, rotary=None,
                       reference_hidden=None) -> LayerResult:
        options = self.options
        static = options.activations == "static"
        result = LayerResult(outputs=None)
        smoothing = self._smooth(staged, hidden, rotary) if options.smoothquant else {}

        def quantize_stage(names: tuple[str, ...], inputs: Activations, residual=None) -> None:
            targets = self.targets(names)
            if not targets:
                return
            hessian = gptq.input_hessian(inputs, dtype=self.hessian_dtype) if inputs else None
            input_scale = None
            if static:
                absmax = max(float(x.abs().max()) for x in inputs)
                input_scale = _stored(int8.scale_for(torch.tensor([absmax])), self.scale_dtype)
            for name in targets:
                linear = staged.linear(name)
                original = linear.weight.detach().float().clone()
                if options.rounding == "gptq":
                    done = gptq.gptq_quantize(original, hessian, self.scheme, block_size=options.block_size,
                                              damp=options.dampening)
                    codes = done.weight
                    note = "RTN fallback: H not positive definite" if done.rtn_fallback else ""
                else:
                    codes, note = rtn_quantize(original, self.scheme), ""
                weight = Int8Weight.from_codes(codes, None if input_scale is None else input_scale.clone())
                dequantized = weight.dequantize()
                linear.weight.data = dequantized.to(linear.weight.dtype)
                result.quantized[name] = weight
                errors = (None, None) if hessian is None else relative_errors(original, hessian, self.scheme,
                                                                              dequantized)
                result.reports.append(LinearReport(f"{self.prefix}.{name}", "int8", *errors, note,
                                                   detail=smoothing.get(name, "")))

        if hidden is None:  # dynamic RTN without smoothing: no data
            for names in staged.stages:
                quantize_stage(names, [])
            return result
        result.outputs = run_stages(staged, hidden, rotary, quantize_stage, self.keep)
        if static and staged.experts:
            share_expert_input_scales(result.quantized, staged)
        return result

    def _smooth(self, staged: StagedLayer, hidden: Activations, rotary) -> dict[str, str]:
        """Observe the layer as it is, then fold each stage's smoothing scales into the op before it.
        Returns, per linear, what was chosen and the W8A8 error it scored against none."""
        observed: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor]] = {}

        def observe(names: tuple[str, ...], inputs: Activations, residual=None) -> None:
            absmax = torch.stack([x.abs().amax(dim=0) for x in inputs]).amax(dim=0).float()
            observed[names] = (absmax, smoothquant.sample_rows(inputs, SMOOTHING_SAMPLE_TOKENS))

        run_stages(staged, hidden, rotary, observe, self.keep)
        notes = {}
        for names, prev in zip(staged.stages, previous_ops(staged)):
            if prev is None or not self.targets(names):
                continue
            absmax, sample = observed[names]
            search = smoothquant.search_smoothing([staged.linear(n).weight.detach() for n in names], absmax, sample,
                                                  self.scheme, self.options.activations == "static",
                                                  alpha=self.options.smoothing_strength)
            if search.scales is not None:
                fold_input_scales(staged, prev, names, search.scales)
            chosen = "none" if search.alpha is None else f"alpha {search.alpha:.2f}"
            notes.update({n: f"smoothing {chosen} ({search.error_unsmoothed:.2e} -> {search.error:.2e} "
                             f"W8A8 error on {len(sample)} tokens)" for n in names})
        return notes


def _stored(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`scale` as the checkpoint stores it (the model dtype), rounded up so the calibration absmax never clips."""
    stored = scale.to(dtype)
    if float(stored) < float(scale):  # one step up in the stored dtype: its bits as an integer, plus one
        int_type = {2: torch.int16, 4: torch.int32}[torch.finfo(dtype).bits // 8]
        stored = (stored.view(int_type) + 1).view(dtype)
    return stored.float()
