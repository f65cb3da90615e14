"""Paired bootstrap confidence intervals, seeded.

Both models are measured on the same units (sequences, task items, samples), so a resample draws unit
indices once and the statistic sees both models' numbers for the same draw: the interval reflects the
spread of the paired difference, not of each model separately.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float | None  # None when there are too few units to resample
    high: float | None
    n: int


def paired_bootstrap(n: int, statistic: Callable[[np.ndarray], float], resamples: int = 1000,
                     confidence: float = 0.95, seed: int = 0) -> Estimate:
    """``statistic(indices)`` computed on all ``n`` units, with a percentile interval over resamples of
    unit indices drawn with replacement."""
    value = float(statistic(np.arange(n)))
    if n < 2:
        return Estimate(value, None, None, n)
    rng = np.random.default_rng(seed)
    draws = np.array([statistic(rng.integers(0, n, n)) for _ in range(resamples)], dtype=np.float64)
    draws = draws[np.isfinite(draws)] if np.isfinite(value) else draws
    alpha = (1 - confidence) / 2
    # "nearest": interpolating between two infinite draws (SQNR of identical layers) would give nan
    low, high = np.quantile(draws, [alpha, 1 - alpha], method="nearest") if len(draws) else (value, value)
    return Estimate(value, float(low), float(high), n)


def mean_difference(baseline: np.ndarray, candidate: np.ndarray, **kwargs) -> Estimate:
    """Mean of candidate - baseline over paired units."""
    diff = np.asarray(candidate, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    return paired_bootstrap(len(diff), lambda idx: diff[idx].mean(), **kwargs)


def perplexity_increase_pct(baseline_nll: np.ndarray, candidate_nll: np.ndarray, counts: np.ndarray,
                            **kwargs) -> Estimate:
    """Perplexity increase in percent, exp((NLL_cand - NLL_base) / tokens) - 1, from each sequence's NLL sum
    and token count, with a paired bootstrap interval over sequences."""
    base, cand = np.asarray(baseline_nll, dtype=np.float64), np.asarray(candidate_nll, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)

    def increase(idx: np.ndarray) -> float:
        return (np.exp((cand[idx].sum() - base[idx].sum()) / counts[idx].sum()) - 1) * 100

    return paired_bootstrap(len(counts), increase, **kwargs)


@dataclass(frozen=True)
class Measurement:
    """One row of the report. ``estimate`` is the quantity a gate compares (for perplexity the % increase,
    for accuracy the drop in points); baseline and candidate are each model's own value where it has one."""
    metric: str
    scope: str
    baseline: float | None
    candidate: float | None
    estimate: Estimate
    units: str  # what estimate.n counts: sequences, items, samples
    tokens: int | None = None
    gated: bool = True  # False: measured and reported, but it cannot show a regression (e.g. a task at chance)
    details: dict = field(default_factory=dict)  # what a reader needs to judge the row (chance level, power)
