"""Eval suites and gates: YAML files validated by pydantic. Unknown keys are errors naming key and file.

A suite says what to measure:

    name: default
    token_metrics: {datasets: [pile_style_en:eval, support_chat_en:eval], max_seq_len: 256, records: 32}
    layer_metrics: {dataset: pile_style_en:eval, num_samples: 4, max_seq_len: 128}
    tasks: {arc_easy: 570, piqa: 600}   # task -> items scored (null: all); or a list of names / YAML paths
    task_power: {discordance: 0.15, power: 0.8}
    bootstrap: {resamples: 1000, confidence: 0.95, seed: 0}

A gate file says how much worse the candidate may be, one threshold per metric:

    name: default
    gates:
      perplexity_increase_pct: {max: 15}
      top1_agreement: {min: 0.80}
      accuracy_drop_points: {max: 5}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantkit.errors import QuantkitError
from quantkit.yaml_files import load_yaml_model

# Gate metric name -> what it measures. "max" metrics are worse when larger, "min" metrics when smaller.
METRICS = {
    "perplexity_increase_pct": ("max", "candidate perplexity over baseline, % increase, per token dataset and pooled"),
    "kl_mean": ("max", "mean per-token KL(baseline || candidate), nats"),
    "kl_p99": ("max", "99th percentile of per-token KL(baseline || candidate), nats"),
    "top1_agreement": ("min", "fraction of tokens where both models predict the same next token"),
    "accuracy_drop_points": ("max", "task accuracy drop in points (baseline - candidate) x 100, per task"),
    "attention_shift_max": ("max", "largest per-layer mean Jensen-Shannon divergence of attention rows, nats"),
    "layer_sqnr_min_db": ("min", "smallest per-layer output SQNR, dB"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenMetricsSpec(_Strict):
    datasets: list[str] = Field(default_factory=lambda: ["pile_style_en:eval"], min_length=1)
    max_seq_len: int = Field(256, ge=2)
    records: int = Field(32, ge=1)  # per dataset: a seeded sample across the split, one sequence per record
    kl_top_k: int = Field(256, ge=1)  # baseline tokens kept exactly; the rest of its mass is one bucket


class LayerMetricsSpec(_Strict):
    dataset: str = "pile_style_en:eval"
    num_samples: int = Field(4, ge=1)
    max_seq_len: int = Field(128, ge=2)


class BootstrapSpec(_Strict):
    resamples: int = Field(1000, ge=10)
    confidence: float = Field(0.95, gt=0, lt=1)
    seed: int = 0


class TaskPowerSpec(_Strict):
    """What the power check before scoring assumes: the share of items a candidate that should pass scores
    differently from its baseline, and the chance such a candidate must have to pass (see eval/power.py)."""
    discordance: float = Field(0.15, gt=0, lt=1)
    power: float = Field(0.8, gt=0, lt=1)
    basis: str = ""  # where the assumed discordance comes from


class Suite(_Strict):
    name: str
    description: str = ""
    token_metrics: TokenMetricsSpec | None = TokenMetricsSpec()
    layer_metrics: LayerMetricsSpec | None = LayerMetricsSpec()
    # task name or YAML path -> items scored (a seeded sample across the split; null: all of them)
    tasks: Union[list[str], dict[str, Optional[int]]] = Field(default_factory=list)
    max_items_per_task: int | None = Field(None, ge=1)  # a cap on every task's items
    task_power: TaskPowerSpec = TaskPowerSpec()
    bootstrap: BootstrapSpec = BootstrapSpec()

    @field_validator("tasks")
    @classmethod
    def _positive_items(cls, tasks):
        for name, items in (tasks.items() if isinstance(tasks, dict) else []):
            if items is not None and items < 1:
                raise ValueError(f"task '{name}': items must be at least 1, not {items}")
        return tasks

    def task_items(self) -> dict[str, int | None]:
        items = self.tasks if isinstance(self.tasks, dict) else dict.fromkeys(self.tasks)
        cap = self.max_items_per_task
        return {ref: min(n for n in (count, cap) if n) if (count or cap) else None for ref, count in items.items()}


class Threshold(_Strict):
    """One bound. ``fail_when`` says how the confidence interval is compared with it:
    interval_crosses: fail when any part of the interval is past the bound (the candidate must show it is
    within); interval_beyond: fail only when the whole interval is past it (a regression is established)."""
    max: float | None = None
    min: float | None = None
    fail_when: Literal["interval_crosses", "interval_beyond"] = "interval_crosses"

    @model_validator(mode="after")
    def _one_bound(self) -> Threshold:
        if (self.max is None) == (self.min is None):
            raise ValueError("give exactly one of max or min")
        return self


class Gates(_Strict):
    name: str
    description: str = ""
    gates: dict[str, Threshold] = Field(min_length=1)

    @field_validator("gates")
    @classmethod
    def _known_metrics(cls, gates: dict[str, Threshold]) -> dict[str, Threshold]:
        for metric, threshold in gates.items():
            if metric not in METRICS:
                raise ValueError(f"unknown metric '{metric}' (known: {', '.join(METRICS)})")
            sense = METRICS[metric][0]
            if getattr(threshold, sense) is None:
                raise ValueError(f"metric '{metric}' takes a {sense} bound ({METRICS[metric][1]})")
            if metric == "accuracy_drop_points" and threshold.fail_when != "interval_crosses":
                raise ValueError("accuracy_drop_points is a non-inferiority gate: the whole interval of the drop "
                                 "must be within the margin (fail_when: interval_crosses)")
        return gates


def shipped_tasks_dir() -> Path:
    return Path(__file__).parent / "tasks"  # the data package quantkit.eval.tasks


def shipped_task_names() -> list[str]:
    directory = shipped_tasks_dir()
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []


def task_configs(suite: Suite, suite_path: Path) -> list:
    """The suite's tasks as (TaskSpec, lm-eval config) pairs: standard benchmarks by name, shipped task names,
    or task YAML paths relative to the suite."""
    from dataclasses import replace

    from quantkit.eval.benchmarks import BENCHMARKS
    from quantkit.eval.lm_tasks import benchmark_task, read_task

    tasks = []
    for ref, items in suite.task_items().items():
        if ref in BENCHMARKS:
            spec, config = benchmark_task(ref)
        else:
            path = shipped_tasks_dir() / f"{ref}.yaml" if ref in shipped_task_names() else _relative(ref, suite_path)
            if not path.is_file():
                raise QuantkitError(f"{suite_path}: 'tasks': unknown task '{ref}' (not a benchmark, a shipped task "
                                    "or a YAML file)",
                                    hint=f"benchmarks: {', '.join(BENCHMARKS)}; shipped: {', '.join(shipped_task_names())}")
            spec, config = read_task(path)
        tasks.append((replace(spec, items=items), config))
    return tasks


def _relative(ref: str, suite_path: Path) -> Path:
    path = Path(ref).expanduser()
    return path if path.is_absolute() else suite_path.parent / path


def _shipped_yaml(prefix: str, ref: str) -> Path:
    from quantkit.recipes import shipped_recipes_dir

    shipped = shipped_recipes_dir() / f"{prefix}-{ref}.yaml"
    return shipped if shipped.is_file() else Path(ref).expanduser()


def load_suite(ref: str) -> tuple[Suite, Path]:
    """A shipped suite name (``default`` for recipes/suite-default.yaml) or a YAML path."""
    path = _shipped_yaml("suite", ref)
    return _load(path, Suite, f"suite '{ref}'"), path


def load_gates(ref: str) -> tuple[Gates, Path]:
    """A shipped gate name (``default`` for recipes/gate-default.yaml) or a YAML path."""
    path = _shipped_yaml("gate", ref)
    return _load(path, Gates, f"gate file '{ref}'"), path


def _load(path: Path, schema: type[BaseModel], what: str):
    if not path.is_file():
        raise QuantkitError(f"{what} not found", hint="pass a shipped name (default) or a YAML path")
    return load_yaml_model(path, schema)


def suite_hash(suite: Suite, files: list[Path], limit: int | None, computed_with: str = "") -> str:
    """What the baseline's numbers depend on besides the model: the suite, its datasets and task files, and
    how they were computed (device, dtype, threads)."""
    from quantkit.data.readers import dataset_hash

    digest = hashlib.sha256(json.dumps([suite.model_dump(mode="json"), limit, computed_with], sort_keys=True).encode())
    datasets = list(suite.token_metrics.datasets if suite.token_metrics else [])
    datasets += [suite.layer_metrics.dataset] if suite.layer_metrics else []
    for ref in datasets:
        digest.update(dataset_hash(ref).encode())
    for file in files:
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()[:16]
