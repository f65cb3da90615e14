"""Quantization methods, one module each, registered by name (see base.QuantMethod). Every module of this
package is imported here, so a new method is one new file."""

import importlib
import pkgutil

from quantkit.quantize.methods.base import (METHODS, ComputeDtypes, LayerResult, LinearReport, MethodOptions,
                                            QuantMethod, register)

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
    importlib.import_module(f"{__name__}.{_module}")  # each registers itself

__all__ = ["METHODS", "ComputeDtypes", "LayerResult", "LinearReport", "MethodOptions", "QuantMethod", "register"]
