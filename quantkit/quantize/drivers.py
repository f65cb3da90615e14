"""Per-method drivers: the state and order of work for one decoder layer. The math is in quantkit.algorithms.

- RTN needs no data.
- GPTQ quantizes stage by stage (q/k/v, o, gate/up, down); each stage's Hessian comes from inputs that
  already went through the quantized stages before it, and the quantized output propagates. v_proj
  goes one KV head at a time with tokens weighted by the attention they receive; with residual_weighted,
  o_proj and down_proj tokens by 1 / rms^2 of the residual stream they feed. With fp_targets an
  untouched copy of the layer runs beside it on the full-precision model's inputs, and each linear's
  target moves that fraction of the way from its own output on the quantized inputs to the
  full-precision output.
- FP8 casts weights per output channel (no data); static recipes take each stage's input absmax as its
  per-tensor input scale, with the fp8 outputs of earlier stages propagating.
- AWQ observes one pass with the original weights, then searches scales and clipping per mapping
  (norm -> q/k/v, v -> o when shapes match, norm -> gate/up, up -> down), optionally refines the
  rounded codes by coordinate descent (optionally on GPTQ's token weights: v_proj per KV head by the
  attention received, o/down by the residual stream); the next layer gets the unquantized output, as
  AutoAWQ does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from quantkit.algorithms import awq, fp8, gptq
from quantkit.algorithms.rtn import fake_quantize, rtn_quantize
from quantkit.formats.quantized import Fp8Weight, QuantizedWeight, stack_rows
from quantkit.quantize.staged import (STAGES, Activations, Keep, Rotary, StagedLayer, evenly_spaced,
                                      residual_token_weights, run_paired_stages, run_stages, sample_lengths,
                                      value_token_weights)
from quantkit.recipes import ComputeDtypes, Recipe


@dataclass
class LinearReport:
    name: str
    method: str
    error_rtn: float | None  # relative output error of plain rounding on the same inputs
    error: float | None  # relative output error of the method
    note: str = ""


@dataclass
class LayerResult:
    outputs: Activations | None
    reference_outputs: Activations | None = None  # the full-precision layer's, when a driver ran it
    quantized: dict[str, QuantizedWeight | Fp8Weight] = field(default_factory=dict)  # name within the layer
    reports: list[LinearReport] = field(default_factory=list)


def relative_errors(original: torch.Tensor, hessian: torch.Tensor, scheme,
                    effective: torch.Tensor) -> tuple[float, float]:
    """Output error of plain rounding and of ``effective``, each relative to the layer's output energy."""
    energy = max(float(((original @ hessian) * original).sum()), 1e-30)
    rtn = awq.output_error(original, fake_quantize(original, scheme), hessian)
    return rtn / energy, awq.output_error(original, effective, hessian) / energy


class Driver:
    def __init__(self, recipe: Recipe, prefix: str, scale_dtype: torch.dtype = torch.float16, keep: Keep = list):
        """keep: how the layer's stages hold their per-sample activations (in memory, or on disk)."""
        self.recipe, self.prefix, self.scale_dtype, self.keep = recipe, prefix, scale_dtype, keep
        self.scheme = recipe.weights.scheme(scale_dtype)
        # what the method's Hessian products run in: its recipe's choice for AWQ and GPTQ, float32 for the rest
        method = recipe.quantization
        self.hessian_dtype = method.hessian_torch_dtype() if isinstance(method, ComputeDtypes) else torch.float32

    def targets(self, names: tuple[str, ...]) -> list[str]:
        return [n for n in names if self.recipe.is_quantized(f"{self.prefix}.{n}")]

    def forward_dtype(self) -> torch.dtype:
        """What the staged layer's linears and attention run in (see StagedLayer): the recipe's choice for AWQ
        and GPTQ, float32 for the rest."""
        method = self.recipe.quantization
        return method.forward_torch_dtype() if isinstance(method, ComputeDtypes) else torch.float32

    def reference_picks(self, num_samples: int) -> list[int] | None:
        """Which calibration samples the full-precision model's stream should run on for this driver
        (None: it reads no such stream)."""
        return None

    def quantize_layer(self, staged: StagedLayer, hidden, rotary, reference_hidden=None) -> LayerResult:
        """reference_hidden: the full-precision model's inputs to this layer, for the samples that
        reference_picks named (only GPTQ fp_targets reads them)."""
        raise NotImplementedError


class RTNDriver(Driver):
    def quantize_layer(self, staged: StagedLayer, hidden=None, rotary=None, reference_hidden=None) -> LayerResult:
        result = LayerResult(outputs=None)
        for name in self.targets(tuple(n for stage in STAGES for n in stage)):
            result.quantized[name] = rtn_quantize(staged.linear(name).weight.detach(), self.scheme)
            result.reports.append(LinearReport(f"{self.prefix}.{name}", "rtn", None, None))
        return result


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


class GPTQDriver(Driver):
    def reference_picks(self, num_samples: int) -> list[int] | None:
        options = self.recipe.quantization
        return evenly_spaced(options.fp_target_samples, num_samples) if options.fp_targets > 0 else None

    def quantize_layer(self, staged: StagedLayer, hidden: Activations, rotary: list[Rotary],
                       reference_hidden: Activations | None = None) -> LayerResult:
        """With ``fp_targets`` and the full-precision model's hidden states, each linear fits (partly) the
        full-precision output from the quantized model's input; the untouched layer's outputs come back
        as ``reference_outputs`` for the next layer."""
        options = self.recipe.quantization
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
                                    forward_dtype=staged.forward_dtype)
            result.outputs, result.reference_outputs = run_paired_stages(
                staged, reference, hidden, reference_hidden, rotary, quantize_stage, self.keep, picks)
        else:
            result.outputs = run_stages(staged, hidden, rotary,
                                        lambda names, inputs, residual: quantize_stage(names, inputs, None, residual),
                                        self.keep)
        return result

    def _quantize(self, weight: torch.Tensor, data: StageData) -> tuple[QuantizedWeight, str]:
        options = self.recipe.quantization
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


class AWQDriver(Driver):
    def quantize_layer(self, staged: StagedLayer, hidden: Activations, rotary: list[Rotary],
                       reference_hidden=None) -> LayerResult:
        options = self.recipe.quantization
        observed: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor]] = {}

        lengths = sample_lengths(rotary)
        # with descent_weighted, the descent's own Hessians (per KV head for v_proj), tokens weighted as GPTQ's
        descent_hessians: dict[str, list[torch.Tensor]] = {}

        def observe(names: tuple[str, ...], inputs: Activations, residual=None) -> None:
            x_mean = sum(x.abs().sum(dim=0) for x in inputs) / sum(lengths)
            observed[names] = (gptq.input_hessian(inputs, dtype=self.hessian_dtype), x_mean)
            if options.coordinate_descent and options.descent_weighted:
                descent_hessians.update(self._weighted_hessians(staged, names, inputs, residual, rotary,
                                                                self.hessian_dtype))

        result = LayerResult(outputs=run_stages(staged, hidden, rotary, observe, self.keep))
        originals = {n: staged.linear(n).weight.detach().float().clone() for stage in STAGES for n in stage}
        col_scale = {n: torch.ones(originals[n].shape[1]) for n in originals}
        row_scale = {n: torch.ones(originals[n].shape[0]) for n in originals}
        hessians = {}
        for names, prev in zip(STAGES, self._previous_ops(staged)):
            hessian, x_mean = observed[names]
            targets = self.targets(names)
            if prev is not None and targets:
                search = awq.search_scales([staged.linear(n).weight.detach() for n in targets], x_mean, hessian,
                                           self.scheme, duo=options.duo_scaling, n_grid=options.n_grid)
                self._apply_scales(staged, prev, names, search.scales, col_scale, row_scale)
                hessian = awq.scale_hessian(hessian, search.scales)
            hessians.update({n: (hessian, observed[names][0]) for n in names})
        for name in self.targets(tuple(originals)):
            linear = staged.linear(name)
            scaled_hessian, hessian = hessians[name]
            scaled = weight = linear.weight.detach().float()
            if options.clip and not name.endswith(("q_proj", "k_proj")):
                weight = awq.search_clip(weight, scaled_hessian, self.scheme, n_grid=options.n_grid,
                                         independent=options.clip_independent)
            qw = rtn_quantize(weight, self.scheme)
            if options.coordinate_descent:  # clipping chose the grid; the codes fit the unclipped weight
                hessians_of_rows = ([awq.scale_hessian(h, col_scale[name]) for h in descent_hessians[name]]
                                    if name in descent_hessians else [scaled_hessian])
                qw = self._descend(qw, scaled, hessians_of_rows)
            result.quantized[name] = qw
            effective = qw.dequantize() * row_scale[name][:, None] / col_scale[name][None, :]
            result.reports.append(LinearReport(
                f"{self.prefix}.{name}", "awq", *relative_errors(originals[name], hessian, self.scheme, effective)))
        return result

    @staticmethod
    def _weighted_hessians(staged: StagedLayer, names: tuple[str, ...], inputs: Activations,
                           residual: Activations | None, rotary: list[Rotary],
                           dtype: torch.dtype) -> dict[str, list[torch.Tensor]]:
        """The Hessians GPTQ fits these linears on: v_proj one per KV head, tokens weighted by the attention
        they receive; o_proj and down_proj tokens weighted by 1 / rms^2 of the residual stream they feed. Fitted
        on a plain Hessian, the descent spends its freedom on tokens (the attention sink) whose errors matter
        more or less than their count (docs/quantization-experiments.md, AWQ)."""
        if names == STAGES[0]:
            return {"self_attn.v_proj": [gptq.input_hessian(inputs, token_weights, dtype)
                                         for token_weights in value_token_weights(staged, inputs, rotary)]}
        if residual is None:
            return {}
        hessian = gptq.input_hessian(inputs, residual_token_weights(residual, sample_lengths(rotary)), dtype)
        return {name: [hessian] for name in names}

    def _descend(self, rounded: QuantizedWeight, target: torch.Tensor,
                 hessians_of_rows: list[torch.Tensor]) -> QuantizedWeight:
        """Coordinate descent over the codes; the rows split evenly over the Hessians (one per KV head, or one)."""
        options = self.recipe.quantization
        rows = rounded.shape[0] // len(hessians_of_rows)
        return stack_rows([gptq.coordinate_descent(rounded.rows(i * rows, (i + 1) * rows),
                                                   target[i * rows:(i + 1) * rows], hessian,
                                                   options.descent_dampening, options.coordinate_descent)
                           for i, hessian in enumerate(hessians_of_rows)])

    @staticmethod
    def _previous_ops(staged: StagedLayer) -> list[str | None]:
        """What each stage's input scales fold into; v -> o only when shapes match (no GQA)."""
        v, o = staged.linear("self_attn.v_proj"), staged.linear("self_attn.o_proj")
        v_to_o = "self_attn.v_proj" if v.weight.shape == o.weight.shape else None
        return ["input_layernorm", v_to_o, "post_attention_layernorm", "mlp.up_proj"]

    @staticmethod
    def _apply_scales(staged: StagedLayer, prev: str, names: tuple[str, ...], scales: torch.Tensor,
                      col_scale: dict, row_scale: dict) -> None:
        """Multiply the layers' input columns by s and divide the previous op's outputs by s."""
        previous = staged.layer.get_submodule(prev)
        with torch.no_grad():
            if isinstance(previous, torch.nn.Linear):
                previous.weight.div_(scales[:, None].to(previous.weight.dtype))
                if previous.bias is not None:
                    previous.bias.div_(scales.to(previous.bias.dtype))
                row_scale[prev] = row_scale[prev] * scales  # rows were divided by s: multiply back
            else:  # RMSNorm: y = w * x / rms(x)
                previous.weight.div_(scales.to(previous.weight.dtype))
            for name in names:
                linear = staged.linear(name)
                linear.weight.mul_(scales[None, :].to(linear.weight.dtype))
                col_scale[name] = col_scale[name] * scales


class FP8Driver(Driver):
    def quantize_layer(self, staged: StagedLayer, hidden: Activations | None = None,
                       rotary: list[Rotary] | None = None, reference_hidden=None) -> LayerResult:
        static = self.recipe.quantization.activations == "static"
        result = LayerResult(outputs=None)

        def quantize_stage(names: tuple[str, ...], inputs: Activations, residual=None) -> None:
            absmax = max(float(x.abs().max()) for x in inputs) if inputs else None
            hessian = gptq.input_hessian(inputs) if inputs else None
            for name in self.targets(names):
                linear = staged.linear(name)
                original = linear.weight.detach().float().clone()
                weight = fp8.quantize_weight(original, self.scale_dtype, absmax if static else None)
                dequantized = weight.dequantize()
                linear.weight.data = dequantized.to(linear.weight.dtype)
                result.quantized[name] = weight
                error = None
                if hessian is not None:
                    energy = max(float(((original @ hessian) * original).sum()), 1e-30)
                    error = awq.output_error(original, dequantized, hessian) / energy
                result.reports.append(LinearReport(f"{self.prefix}.{name}", "fp8", None, error))

        if hidden is None:
            for names in STAGES:
                quantize_stage(names, [])
        else:
            result.outputs = run_stages(staged, hidden, rotary, quantize_stage, self.keep)
        return result


DRIVERS: dict[str, type[Driver]] = {"rtn": RTNDriver, "gptq": GPTQDriver, "awq": AWQDriver, "fp8": FP8Driver}
