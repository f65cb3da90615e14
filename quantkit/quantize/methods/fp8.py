"""FP8 W8A8: float8_e4m3fn weights per output channel; activations per token at run time (dynamic) or with a
per-tensor scale from calibration (static: each stage's input absmax, with the fp8 outputs of earlier stages
propagating)."""

from __future__ import annotations

from typing import Literal

import torch

from quantkit.algorithms import awq, fp8, gptq
from quantkit.formats.scheme import CheckpointScheme
from quantkit.quantize.methods.base import LayerResult, LinearReport, MethodOptions, QuantMethod, register
from quantkit.quantize.staged import Activations, run_stages


class FP8Options(MethodOptions):
    """The weights section must say bits 8, symmetric, group_size -1."""
    method: Literal["fp8"]
    activations: Literal["dynamic", "static"] = "dynamic"


@register
class FP8(QuantMethod):
    options_class = FP8Options

    @classmethod
    def needs_calibration(cls, options: FP8Options) -> bool:
        return options.activations == "static"

    @classmethod
    def check_weights(cls, weights) -> None:
        if (weights.bits, weights.group_size, weights.symmetric) != (8, -1, True):
            raise ValueError("method fp8 quantizes weights per output channel: "
                             "set weights to {bits: 8, group_size: -1, symmetric: true}")

    @classmethod
    def checkpoint_scheme(cls, recipe) -> CheckpointScheme:
        return CheckpointScheme(kind="float", bits=8, group_size=-1, symmetric=True,
                                activations=recipe.quantization.activations,
                                kv_cache=recipe.kv_cache_scheme is not None)

    def quantize_layer(self, staged, hidden=None, rotary=None, reference_hidden=None) -> LayerResult:
        static = self.options.activations == "static"
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
            for names in staged.stages:
                quantize_stage(names, [])
        else:
            result.outputs = run_stages(staged, hidden, rotary, quantize_stage, self.keep)
            if static and staged.experts:
                share_expert_input_scales(result.quantized, staged)
        return result


def share_expert_input_scales(quantized: dict, staged) -> None:
    """One static input scale per projection across a layer's experts, the largest (FP8 and INT8 W8A8): vLLM fuses a layer's
    experts into one kernel that takes one scale per projection (the max of the stored ones), so per-expert
    scales would describe a model nobody serves."""
    experts = staged.experts
    for name in (experts.gate, experts.up, experts.down):
        weights = [quantized[linear] for e in range(staged.num_experts)
                   if (linear := experts.linear(e, name)) in quantized]
        if weights:
            shared = torch.stack([w.input_scale for w in weights]).amax(dim=0)
            for weight in weights:
                weight.input_scale = shared.clone()
