"""GPTQ: stage by stage (q/k/v, o, gate/up, down), each stage's Hessian from inputs that already went
through the quantized stages before it, the quantized output propagating. v_proj goes one KV head at a
time with tokens weighted by the attention they receive; with residual_weighted, o_proj and down_proj
tokens by 1 / rms^2 of the residual stream they feed. With fp_targets an untouched copy of the layer runs
beside it on the full-precision model's inputs, and each linear's target moves that fraction of the way
from its own output on the quantized inputs to the full-precision output.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Literal

import torch
from pydantic import Field, model_validator

from quantkit.algorithms import gptq
from quantkit.algorithms.rtn import fake_quantize
from quantkit.formats.quantized import QuantizedWeight, stack_rows
from quantkit.formats.scheme import CheckpointScheme
from quantkit.quantize.methods.base import (ComputeDtypes, LayerResult, LinearReport, QuantMethod, register,
                                            relative_errors)
from quantkit.quantize.staged import (Activations, Rotary, StagedLayer, evenly_spaced, residual_token_weights,
                                      run_paired_stages, run_stages, sample_lengths, value_token_weights)


class GPTQOptions(ComputeDtypes):
    method: Literal["gptq"]
    block_size: int = Field(128, ge=1)
    dampening: float = Field(0.01, gt=0, le=1)
    act_order: bool = False
    mse: bool = False  # search each group's range for the least rounding error instead of min/max
    # How far each linear's target moves from its own output on the quantized model's inputs (0) to the
    # full-precision model's output (1): the error earlier quantized layers left in the input is then
    # corrected too (asymmetric calibration, as GPTAQ). A full fit over-fits the calibration tokens.
    fp_targets: float = Field(0.0, ge=0, le=1)
    # how many calibration samples (evenly spaced) the full-precision stream runs on for fp_targets; 0 = all.
    # The correction is estimated from them and applied to every linear fitted on all samples.
    fp_target_samples: int = Field(0, ge=0)
    # o_proj / down_proj errors count relative to the residual stream they are added to (see
    # quantize.staged.residual_token_weights)
    residual_weighted: bool = False
    # after GPTQ, re-solve each row's group scales for its final codes (see algorithms.gptq.refit_scales)
    refit_scales: bool = False
    # after GPTQ (and refit_scales), sweeps of coordinate descent over the codes on the same output error
    # (see algorithms.gptq.coordinate_descent); 0 = off
    coordinate_descent: int = Field(0, ge=0)
    # the descent's damping (None: GPTQ's). Heavier than GPTQ's it keeps the codes nearer the weight, which
    # generalizes past the calibration text better (docs/quantization-experiments.md, GPTQ)
    descent_dampening: float | None = Field(None, gt=0, le=100)

    @model_validator(mode="after")
    def _fp_target_samples(self) -> GPTQOptions:
        if self.fp_target_samples and not self.fp_targets:
            raise ValueError("fp_target_samples sets how many samples fp_targets runs the full-precision stream on: "
                             "set fp_targets above 0 too, or drop fp_target_samples")
        return self


@dataclass
class StageData:
    """What GPTQ needs of one stage's inputs. With full-precision targets, also the full-precision
    model's inputs to the same stage (reference): their Gram matrix, and how the error in ours lines up
    with ours (gptq.input_error_cross)."""
    hessian: torch.Tensor
    error_cross: torch.Tensor | None = None
    reference_hessian: torch.Tensor | None = None

    @classmethod
    def of(cls, inputs: Activations, reference_inputs: Activations | None,
           token_weights: list[torch.Tensor] | None = None, dtype: torch.dtype = torch.float32,
           reference_picks: list[int] | None = None, lengths: list[int] | None = None,
           reported: bool = True) -> StageData:
        """token_weights: how much each token's error counts (one [tokens] tensor per sample), or None.
        dtype: what the products run in (see gptq.input_hessian). reference_picks: the samples of
        ``inputs`` that ``reference_inputs`` pair with (default: all), with ``lengths`` (tokens per
        sample); their products are scaled up to all samples' token count, as estimates of the sums
        over all of them. reported: whether relative_errors will be asked for; only it reads the
        reference Hessian (an eighth of the Hessian work with 16 of 128 samples paired)."""
        hessian = gptq.input_hessian(inputs, token_weights, dtype)
        if reference_inputs is None:
            return cls(hessian)
        if reference_picks is None:
            paired, weights, scale = inputs, token_weights, 1.0
        else:  # read one sample at a time: offloaded activations stay on disk
            paired = (inputs[i] for i in reference_picks)
            weights = None if token_weights is None else [token_weights[i] for i in reference_picks]
            scale = sum(lengths) / sum(lengths[i] for i in reference_picks)
        cross = gptq.input_error_cross(reference_inputs, paired, weights, dtype) * scale
        return cls(hessian, cross, gptq.input_hessian(reference_inputs, weights, dtype) * scale if reported else None)

    def relative_errors(self, original: torch.Tensor, scheme, effective: torch.Tensor) -> tuple[float, float]:
        """Output error of plain rounding and of ``effective``: against the layer's own output on the
        same inputs, or with reference inputs against the full-precision model's output."""
        if self.error_cross is None:
            return relative_errors(original, self.hessian, scheme, effective)
        energy, (rtn, method) = gptq.target_errors(original, [fake_quantize(original, scheme), effective],
                                                   self.reference_hessian, self.error_cross, self.hessian)
        energy = max(energy, 1e-30)
        return rtn / energy, method / energy


@register
class GPTQ(QuantMethod):
    options_class = GPTQOptions

    @classmethod
    def needs_calibration(cls, options) -> bool:
        return True

    @classmethod
    def checkpoint_scheme(cls, recipe) -> CheckpointScheme:
        # act order with static groups: columns reordered while quantizing, groups stay contiguous
        options = recipe.quantization
        return replace(super().checkpoint_scheme(recipe), act_order="static" if options.act_order else None,
                       dampening=options.dampening)

    @classmethod
    def check_architecture(cls, options: GPTQOptions, architecture) -> str | None:
        if options.fp_targets and architecture.experts:
            return "fp_targets (a full-precision stream beside the quantized one) is not supported on MoE layers"
        return None

    def reference_picks(self, num_samples: int) -> list[int] | None:
        options = self.options
        return evenly_spaced(options.fp_target_samples, num_samples) if options.fp_targets > 0 else None

    def quantize_layer(self, staged: StagedLayer, hidden: Activations, rotary: list[Rotary],
                       reference_hidden: Activations | None = None) -> LayerResult:
        """With ``fp_targets`` and the full-precision model's hidden states, each linear fits (partly) the
        full-precision output from the quantized model's input; the untouched layer's outputs come back
        as ``reference_outputs`` for the next layer."""
        options = self.options
        result = LayerResult(outputs=None)
        picks = self.reference_picks(len(hidden))

        def quantize_stage(names: tuple[str, ...], inputs: Activations,
                           reference_inputs: Activations | None = None,
                           residual: Activations | None = None) -> None:
            targets = self.targets(names)
            if not targets:
                return
            weights = None
            if options.residual_weighted and residual is not None:
                weights = residual_token_weights(residual, sample_lengths(rotary))
            data = StageData.of(inputs, reference_inputs, weights, self.hessian_dtype, picks, sample_lengths(rotary))
            for name in targets:
                linear = staged.linear(name)
                original = linear.weight.detach().float().clone()
                if name == "self_attn.v_proj":
                    weight, note = self._quantize_values(staged, original, inputs, reference_inputs, rotary, picks)
                else:
                    weight, note = self._quantize(original, data)
                dequantized = weight.dequantize()
                linear.weight.data = dequantized.to(linear.weight.dtype)
                result.quantized[name] = weight
                result.reports.append(LinearReport(
                    f"{self.prefix}.{name}", "gptq", *data.relative_errors(original, self.scheme, dequantized), note))

        if picks is not None and reference_hidden is not None:
            reference = StagedLayer(copy.deepcopy(staged.layer), staged.num_heads, staged.num_kv_heads,
                                    staged.head_dim, reuse_rotated=staged.reuse_rotated,
                                    forward_dtype=staged.forward_dtype, architecture=staged.architecture,
                                    window=staged.window)
            result.outputs, result.reference_outputs = run_paired_stages(
                staged, reference, hidden, reference_hidden, rotary, quantize_stage, self.keep, picks)
        else:
            result.outputs = run_stages(staged, hidden, rotary,
                                        lambda names, inputs, residual: quantize_stage(names, inputs, None, residual),
                                        self.keep)
        return result

    def _quantize(self, weight: torch.Tensor, data: StageData) -> tuple[QuantizedWeight, str]:
        options = self.options
        if data.error_cross is not None:
            target = gptq.fp_target_weight(weight, data.hessian, data.error_cross, options.dampening)
            weight = weight + options.fp_targets * (target - weight)
        done = gptq.gptq_quantize(weight, data.hessian, self.scheme, block_size=options.block_size,
                                  damp=options.dampening, act_order=options.act_order, mse=options.mse)
        if options.refit_scales and not done.rtn_fallback:
            done.weight = gptq.refit_scales(done.weight, weight, data.hessian, done.damp, self.scale_dtype)
        if options.coordinate_descent and not done.rtn_fallback:
            damp = done.damp if options.descent_dampening is None else options.descent_dampening
            done.weight = gptq.coordinate_descent(done.weight, weight, data.hessian, damp, options.coordinate_descent)
            if options.refit_scales:  # the codes moved: their best scales did too
                done.weight = gptq.refit_scales(done.weight, weight, data.hessian, done.damp, self.scale_dtype)
        note = "RTN fallback: H not positive definite" if done.rtn_fallback else (
            f"damp raised to {done.damp}" if done.damp != options.dampening else "")
        return done.weight, note

    def _quantize_values(self, staged: StagedLayer, weight: torch.Tensor, inputs: Activations,
                         reference_inputs: Activations | None, rotary: list[Rotary],
                         picks: list[int] | None) -> tuple[QuantizedWeight, str]:
        """v_proj, one KV head's rows at a time, with tokens weighted by the attention they receive:
        a plain Hessian counts an attention-sink token once, although most queries read its value."""
        lengths = sample_lengths(rotary)
        rows = weight.shape[0] // staged.num_kv_heads
        parts, notes = [], set()
        for head, token_weights in enumerate(value_token_weights(staged, inputs, rotary)):
            # the report compares the whole v_proj on the stage's data
            data = StageData.of(inputs, reference_inputs, token_weights, self.hessian_dtype, picks, lengths,
                                reported=False)
            part, note = self._quantize(weight[head * rows:(head + 1) * rows], data)
            parts.append(part)
            notes.add(note)
        return stack_rows(parts), "; ".join(sorted(n for n in notes if n))
