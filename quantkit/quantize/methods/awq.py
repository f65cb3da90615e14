"""AWQ: one pass observes the layer with its original weights, then scales and clipping are searched per
norm/linear pair (norm -> q/k/v, v -> o when shapes match, norm -> gate/up, up -> down); the rounded codes
may be refined by coordinate descent (optionally on GPTQ's token weights: v_proj per KV head by the
attention received, o/down by the residual stream). The next layer gets the unquantized output, as
AutoAWQ does.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from quantkit.algorithms import awq, gptq
from quantkit.algorithms.rtn import rtn_quantize
from quantkit.formats.quantized import QuantizedWeight, stack_rows
from quantkit.quantize.folding import fold_input_scales, previous_ops
from quantkit.quantize.methods.base import (ComputeDtypes, LayerResult, LinearReport, QuantMethod, register,
                                            relative_errors)
from quantkit.quantize.staged import (Activations, Rotary, StagedLayer, residual_token_weights,
                                      run_stages, sample_lengths, value_token_weights)


class AWQOptions(ComputeDtypes):
    method: Literal["awq"]
    duo_scaling: bool = True
    clip: bool = True
    n_grid: int = Field(20, ge=2)
    # the clip search also shrinks each group's min and max by separate steps (asymmetric weights only)
    clip_independent: bool = False
    # after the clip search and rounding, sweeps of coordinate descent over the codes on each linear's scaled
    # output error, group scales held (see algorithms.gptq.coordinate_descent); 0 = off. It has a damping of
    # its own: lightly damped, it over-fits the calibration text (docs/quantization-experiments.md, AWQ)
    coordinate_descent: int = Field(0, ge=0)
    descent_dampening: float = Field(1.0, gt=0, le=100)
    # the descent weighs tokens as GPTQ does: v_proj per KV head by the attention each token receives,
    # o_proj / down_proj by 1 / rms^2 of the residual stream they feed (the scale and clip searches do not)
    descent_weighted: bool = False


@register
class AWQ(QuantMethod):
    options_class = AWQOptions

    @classmethod
    def needs_calibration(cls, options) -> bool:
        return True

    def quantize_layer(self, staged: StagedLayer, hidden: Activations, rotary: list[Rotary],
                       reference_hidden=None) -> LayerResult:
        options = self.options
        observed: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor]] = {}

        # with descent_weighted, the descent's own Hessians (per KV head for v_proj), tokens weighted as GPTQ's
        descent_hessians: dict[str, list[torch.Tensor]] = {}

        def observe(names: tuple[str, ...], inputs: Activations, residual=None) -> None:
            # an MoE expert's stages see only the tokens routed to it: count what came
            tokens, abs_sum = 0, 0
            for x in inputs:
                tokens, abs_sum = tokens + x.shape[0], abs_sum + x.abs().sum(dim=0)
            x_mean = abs_sum / tokens
            observed[names] = (gptq.input_hessian(inputs, dtype=self.hessian_dtype), x_mean)
            if options.coordinate_descent and options.descent_weighted:
                descent_hessians.update(self._weighted_hessians(staged, names, inputs, residual, rotary,
                                                                self.hessian_dtype))

        result = LayerResult(outputs=run_stages(staged, hidden, rotary, observe, self.keep))
        originals = {n: staged.linear(n).weight.detach().float().clone() for n in staged.linears}
        col_scale = {n: torch.ones(originals[n].shape[1]) for n in originals}
        row_scale = {n: torch.ones(originals[n].shape[0]) for n in originals}
        hessians = {}
        for names, prev in zip(staged.stages, previous_ops(staged)):
            hessian, x_mean = observed[names]
            targets = self.targets(names)
            if prev is not None and targets:
                search = awq.search_scales([staged.linear(n).weight.detach() for n in targets], x_mean, hessian,
                                           self.scheme, duo=options.duo_scaling, n_grid=options.n_grid)
                if fold_input_scales(staged, prev, names, search.scales):
                    row_scale[prev] = row_scale[prev] * search.scales  # rows were divided by s: multiply back
                for name in names:
                    col_scale[name] = col_scale[name] * search.scales
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
        if names == staged.stages[0]:
            return {"self_attn.v_proj": [gptq.input_hessian(inputs, token_weights, dtype)
                                         for token_weights in value_token_weights(staged, inputs, rotary)]}
        if residual is None:
            return {}
        hessian = gptq.input_hessian(inputs, residual_token_weights(residual, sample_lengths(rotary)), dtype)
        return {name: [hessian] for name in names}

    def _descend(self, rounded: QuantizedWeight, target: torch.Tensor,
                 hessians_of_rows: list[torch.Tensor]) -> QuantizedWeight:
        """Coordinate descent over the codes; the rows split evenly over the Hessians (one per KV head, or one)."""
        options = self.options
        rows = rounded.shape[0] // len(hessians_of_rows)
        return stack_rows([gptq.coordinate_descent(rounded.rows(i * rows, (i + 1) * rows),
                                                   target[i * rows:(i + 1) * rows], hessian,
                                                   options.descent_dampening, options.coordinate_descent)
                           for i, hessian in enumerate(hessians_of_rows)])
