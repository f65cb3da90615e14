"""Recipes: YAML files validated by pydantic. A recipe names one method with its options, the weight
scheme, and which linear layers it targets or ignores. Unknown keys are errors naming key and file.

    name: gptq-w4a16-g64
    quantization: {method: gptq, block_size: 128, dampening: 0.01, act_order: false}
    weights: {bits: 4, group_size: 64, symmetric: true}
    targets: [Linear]
    ignore: [lm_head]
    kv_cache_scheme: {type: float, num_bits: 8, strategy: tensor}   # optional: FP8 KV-cache scales
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal, Union

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantkit.algorithms.gptq import resolve_compute_dtype
from quantkit.algorithms.rtn import WeightScheme
from quantkit.errors import QuantkitError
from quantkit.yaml_files import load_yaml_model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeightsSpec(_Strict):
    bits: Literal[2, 4, 8] = 4  # what the packed formats store (2 bits: for sensitivity tests)
    group_size: int = 64
    symmetric: bool = False

    @field_validator("group_size")
    @classmethod
    def _group_size(cls, value: int) -> int:
        if value != -1 and value <= 0:
            raise ValueError("group_size must be a positive number of input channels, or -1 for per channel")
        return value

    def scheme(self, scale_dtype: torch.dtype = torch.float16) -> WeightScheme:
        """The internal scheme; scales are rounded to ``scale_dtype``, the dtype they are stored in."""
        return WeightScheme(bits=self.bits, group_size=self.group_size, symmetric=self.symmetric,
                            scale_dtype=scale_dtype)


class RTNMethod(_Strict):
    method: Literal["rtn"]


class ComputeDtypes(_Strict):
    """What a calibrating method multiplies in."""
    # the Hessian products: "auto" takes bfloat16 where the CPU multiplies it natively (see
    # algorithms.gptq.resolve_compute_dtype); "float32" gives the same bytes on every machine that runs the
    # same BLAS code path
    hessian_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # the layer's own linears and attention while calibrating (their outputs are the next stage's inputs):
    # "auto" as hessian_dtype. Results and the residual stream stay float32; see quantize.staged.StagedLayer
    forward_dtype: Literal["auto", "float32", "bfloat16"] = "auto"

    def hessian_torch_dtype(self) -> torch.dtype:
        """What hessian_dtype resolves to on this machine."""
        return resolve_compute_dtype(self.hessian_dtype)

    def forward_torch_dtype(self) -> torch.dtype:
        """What forward_dtype resolves to on this machine."""
        return resolve_compute_dtype(self.forward_dtype)


class AWQMethod(ComputeDtypes):
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


class GPTQMethod(ComputeDtypes):
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
    def _fp_target_samples(self) -> GPTQMethod:
        if self.fp_target_samples and not self.fp_targets:
            raise ValueError("fp_target_samples sets how many samples fp_targets runs the full-precision stream on: "
                             "set fp_targets above 0 too, or drop fp_target_samples")
        return self


class FP8Method(_Strict):
    """float8_e4m3fn weights per output channel; activations per token at run time (dynamic) or with
    per-tensor scales from calibration (static). The weights section must say bits 8, symmetric, -1."""
    method: Literal["fp8"]
    activations: Literal["dynamic", "static"] = "dynamic"


Method = Annotated[Union[RTNMethod, AWQMethod, GPTQMethod, FP8Method], Field(discriminator="method")]


class KVCacheScheme(_Strict):
    """FP8 KV cache: one k_scale and one v_scale per attention layer (absmax / 448 over calibration),
    stored as <layer>.self_attn.k_scale / v_scale where vLLM loads them."""
    type: Literal["float"] = "float"
    num_bits: Literal[8] = 8
    strategy: Literal["tensor"] = "tensor"


class Recipe(_Strict):
    name: str
    description: str = ""
    quantization: Method
    weights: WeightsSpec = WeightsSpec()
    targets: list[str] = ["Linear"]
    ignore: list[str] = ["lm_head"]
    kv_cache_scheme: KVCacheScheme | None = None

    @model_validator(mode="after")
    def _fp8_weights(self) -> Recipe:
        w = self.weights
        if self.quantization.method == "fp8" and (w.bits, w.group_size, w.symmetric) != (8, -1, True):
            raise ValueError("method fp8 quantizes weights per output channel: "
                             "set weights to {bits: 8, group_size: -1, symmetric: true}")
        return self

    @property
    def needs_calibration(self) -> bool:
        """Whether quantizing with this recipe needs activations (KV-cache scales always do)."""
        method = self.quantization
        data = method.method in ("awq", "gptq") or (method.method == "fp8" and method.activations == "static")
        return data or self.kv_cache_scheme is not None

    @property
    def weights_label(self) -> str:
        """The weight scheme in a few characters, e.g. "int4 g64 asym" or "fp8 channel"."""
        w = self.weights
        if self.quantization.method == "fp8":
            return "fp8 channel"
        group = "channel" if w.group_size == -1 else f"g{w.group_size}"
        return f"int{w.bits} {group} {'sym' if w.symmetric else 'asym'}"

    def is_quantized(self, module_name: str) -> bool:
        """Targets and ignore entries are exact module names, name suffixes, or "re:<regex>" patterns;
        the target "Linear" means every linear layer."""
        targeted = any(t == "Linear" or _matches(t, module_name) for t in self.targets)
        return targeted and not any(_matches(pattern, module_name) for pattern in self.ignore)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern)


def shipped_recipes_dir() -> Path:
    return Path(str(resources.files("quantkit.recipe_files")))


def shipped_recipe_names() -> list[str]:
    return sorted(p.stem for p in shipped_recipes_dir().glob("*.yaml") if not p.stem.startswith(("suite", "gate")))


def load_recipe(ref: str) -> Recipe:
    """A shipped recipe name (``awq-w4a16-g64``) or a path to a YAML file."""
    path = shipped_recipes_dir() / f"{ref}.yaml" if ref in shipped_recipe_names() else Path(ref).expanduser()
    if not path.is_file():
        raise QuantkitError(f"recipe '{ref}' not found", hint=f"shipped recipes: {', '.join(shipped_recipe_names())}")
    return load_yaml_model(path, Recipe)
