"""Quantization methods, one module each, registered by name (see base.QuantMethod)."""

from quantkit.quantize.methods.base import (METHODS, ComputeDtypes, LayerResult, LinearReport, MethodOptions,
                                            QuantMethod, register)
from quantkit.quantize.methods import awq, fp8, gptq, rtn  # noqa: F401, E402  (each registers itself)

__all__ = ["METHODS", "ComputeDtypes", "LayerResult", "LinearReport", "MethodOptions", "QuantMethod", "register"]
