"""Round to nearest: each weight onto its group's min/max grid. No data; the baseline every method must beat."""

from __future__ import annotations

from typing import Literal

from quantkit.algorithms.rtn import rtn_quantize
from quantkit.quantize.methods.base import LayerResult, LinearReport, MethodOptions, QuantMethod, register


class RTNOptions(MethodOptions):
    method: Literal["rtn"]


@register
class RTN(QuantMethod):
    options_class = RTNOptions

    def quantize_layer(self, staged, hidden=None, rotary=None, reference_hidden=None) -> LayerResult:
        result = LayerResult(outputs=None)
        for name in self.targets(staged.linears):
            result.quantized[name] = rtn_quantize(staged.linear(name).weight.detach(), self.scheme)
            result.reports.append(LinearReport(f"{self.prefix}.{name}", "rtn", None, None))
        return result
