"""What every quantization method is: a registered class that holds its recipe options (a pydantic model,
the recipe's ``quantization:`` section), says whether it needs calibration data and what it multiplies
in, and does its work on one decoder layer at a time. The math is in quantkit.algorithms; the order of
a layer's stages is in quantkit.quantize.staged.

A new method is one module in this package: an options class with ``method: Literal["name"]`` and a
QuantMethod subclass decorated with ``@register``; quantkit.recipes builds its union from the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict

from quantkit.algorithms import awq
from quantkit.architectures import Architecture
from quantkit.algorithms.rtn import fake_quantize
from quantkit.compute_dtype import resolve_compute_dtype
from quantkit.formats.quantized import Fp8Weight, QuantizedWeight
from quantkit.formats.scheme import CheckpointScheme
from quantkit.quantize.staged import Activations, Keep, Rotary, StagedLayer

if TYPE_CHECKING:
    from quantkit.recipes import Recipe, WeightsSpec


class MethodOptions(BaseModel):
    """A method's section of a recipe. Unknown keys are errors naming the key and the file."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    method: str


class ComputeDtypes(MethodOptions):
    """What a calibrating method multiplies in."""
    # the Hessian products: "auto" takes bfloat16 where the CPU multiplies it natively (see
    # quantkit.compute_dtype); "float32" gives the same bytes on every machine that runs the same BLAS code path
    hessian_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # the layer's own linears and attention while calibrating (their outputs are the next stage's inputs):
    # "auto" as hessian_dtype. Results and the residual stream stay float32; see quantize.staged.StagedLayer
    forward_dtype: Literal["auto", "float32", "bfloat16"] = "auto"


@dataclass
class LinearReport:
    name: str
    method: str
    error_rtn: float | None  # relative output error of plain rounding on the same inputs
    error: float | None  # relative output error of the method
    note: str = ""  # what a user should see (printed after the run)
    detail: str = ""  # what the method chose for this linear (recorded in quantkit.json, not printed)


@dataclass
class LayerResult:
    outputs: Activations | None
    reference_outputs: Activations | None = None  # the full-precision layer's, when a method ran it
    quantized: dict[str, QuantizedWeight | Fp8Weight] = field(default_factory=dict)  # name within the layer
    reports: list[LinearReport] = field(default_factory=list)


def relative_errors(original: torch.Tensor, hessian: torch.Tensor, scheme,
                    effective: torch.Tensor) -> tuple[float, float]:
    """Output error of plain rounding and of ``effective``, each relative to the layer's output energy."""
    energy = max(float(((original @ hessian) * original).sum()), 1e-30)
    rtn = awq.output_error(original, fake_quantize(original, scheme), hessian)
    return rtn / energy, awq.output_error(original, effective, hessian) / energy


class QuantMethod:
    """One method's work on one decoder layer (an instance per layer), and what it says about itself."""
    name: ClassVar[str]
    options_class: ClassVar[type[MethodOptions]]

    def __init__(self, recipe: Recipe, prefix: str, scale_dtype: torch.dtype = torch.float16, keep: Keep = list):
        """keep: how the layer's stages hold their per-sample activations (in memory, or on disk)."""
        self.recipe, self.options, self.prefix = recipe, recipe.quantization, prefix
        self.scale_dtype, self.keep = scale_dtype, keep
        self.scheme = recipe.weights.scheme(scale_dtype)
        dtypes = self.compute_dtypes(self.options)
        self.hessian_dtype = dtypes.get("hessian", torch.float32)
        self._forward_dtype = dtypes.get("forward", torch.float32)

    # --- what the method says about itself, from its options alone ---

    @classmethod
    def needs_calibration(cls, options: MethodOptions) -> bool:
        return False

    @classmethod
    def compute_dtypes(cls, options: MethodOptions) -> dict[str, torch.dtype]:
        """What its "auto" choices resolve to on this machine (empty: it multiplies nothing "auto" would choose)."""
        if not isinstance(options, ComputeDtypes):
            return {}
        return {"hessian": resolve_compute_dtype(options.hessian_dtype),
                "forward": resolve_compute_dtype(options.forward_dtype)}

    @classmethod
    def check_weights(cls, weights: WeightsSpec) -> None:
        """Raise ValueError (the recipe's validation error) for a weight scheme the method cannot make."""

    @classmethod
    def check_architecture(cls, options: MethodOptions, architecture: Architecture) -> str | None:
        """None, or why the method with these options cannot quantize this architecture (refused before any work)."""
        return None

    @classmethod
    def checkpoint_scheme(cls, recipe: Recipe) -> CheckpointScheme:
        """What the checkpoint will hold: integer codes on the recipe's grid, for every method but FP8."""
        w = recipe.weights
        return CheckpointScheme(kind="int", bits=w.bits, group_size=w.group_size, symmetric=w.symmetric,
                                kv_cache=recipe.kv_cache_scheme is not None)

    # --- the work on one layer ---

    def targets(self, names: tuple[str, ...]) -> list[str]:
        return [n for n in names if self.recipe.is_quantized(f"{self.prefix}.{n}")]

    def forward_dtype(self) -> torch.dtype:
        """What the staged layer's linears and attention run in (see StagedLayer)."""
        return self._forward_dtype

    def reference_picks(self, num_samples: int) -> list[int] | None:
        """Which calibration samples the full-precision model's stream should run on for this method
        (None: it reads no such stream)."""
        return None

    def quantize_layer(self, staged: StagedLayer, hidden: Activations | None, rotary: list[Rotary] | None,
                       reference_hidden: Activations | None = None) -> LayerResult:
        """hidden / rotary: the layer's inputs per calibration sample (None for a method without data).
        reference_hidden: the full-precision model's inputs for the samples reference_picks named."""
        raise NotImplementedError


METHODS: dict[str, type[QuantMethod]] = {}


def register(cls: type[QuantMethod]) -> type[QuantMethod]:
    """Class decorator: make a method known to recipes and the pipeline under its options' ``method`` name."""
    cls.name = cls.options_class.model_fields["method"].annotation.__args__[0]
    if cls.name in METHODS:
        raise ValueError(f"method {cls.name!r} registered twice")
    METHODS[cls.name] = cls
    return cls
