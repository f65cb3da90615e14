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

from quantkit.algorithms.rtn import WeightScheme
from quantkit.errors import QuantkitError
from quantkit.formats.scheme import CheckpointScheme
from quantkit.quantize.methods import METHODS, QuantMethod
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


# The recipe's ``quantization:`` section: one options class per registered method, told apart by ``method``.
Method = Annotated[Union[tuple(m.options_class for m in METHODS.values())], Field(discriminator="method")]


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
    def _method_weights(self) -> Recipe:
        self.method_class.check_weights(self.weights)
        return self

    @property
    def method_class(self) -> type[QuantMethod]:
        return METHODS[self.quantization.method]

    @property
    def needs_calibration(self) -> bool:
        """Whether quantizing with this recipe needs activations (KV-cache scales always do)."""
        return self.method_class.needs_calibration(self.quantization) or self.kv_cache_scheme is not None

    @property
    def checkpoint_scheme(self) -> CheckpointScheme:
        return self.method_class.checkpoint_scheme(self)

    @property
    def weights_label(self) -> str:
        """The weight scheme in a few characters, e.g. "int4 g64 asym" or "fp8 channel"."""
        return self.checkpoint_scheme.label

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
