"""Gates: compare each gated measurement's confidence interval (not its point estimate) with a threshold.

Token metrics are gated per dataset and on all datasets pooled (one kind of traffic may not degrade while
the pool hides it); task accuracy per task that can show a regression (baseline clearly above chance);
layer metrics once. A gate whose metric the suite did not measure is reported as skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quantkit.eval.stats import Measurement
from quantkit.eval.suite import METRICS, Gates, Threshold

TOKEN_METRICS = ("perplexity_increase_pct", "kl_mean", "kl_p99", "top1_agreement")
POOLED = "all"


@dataclass(frozen=True)
class GateResult:
    metric: str
    scope: str
    threshold: Threshold
    measurement: Measurement | None  # None: the suite did not measure this metric
    compared: float | None  # the end of the interval that decided

    @property
    def bound(self) -> str:
        return METRICS[self.metric][0]

    @property
    def limit(self) -> float:
        return getattr(self.threshold, self.bound)

    @property
    def skipped(self) -> bool:
        return self.measurement is None

    @property
    def passed(self) -> bool:
        if self.skipped:
            return True
        if math.isnan(self.compared):
            return False
        return self.compared <= self.limit if self.bound == "max" else self.compared >= self.limit

    def describe(self) -> str:
        op = "<=" if self.bound == "max" else ">="
        end = {("max", "interval_crosses"): "upper", ("max", "interval_beyond"): "lower",
               ("min", "interval_crosses"): "lower", ("min", "interval_beyond"): "upper"}
        return f"{end[self.bound, self.threshold.fail_when]} {op} {self.limit:g}"


def is_gated(m: Measurement) -> bool:
    return m.metric in METRICS and m.gated


def decide(threshold: Threshold, bound: str, m: Measurement) -> float:
    e = m.estimate
    if e.low is None:
        return e.value
    take_high = (bound == "max") == (threshold.fail_when == "interval_crosses")
    return e.high if take_high else e.low


def evaluate_gates(gates: Gates, measurements: list[Measurement]) -> list[GateResult]:
    results = []
    for metric, threshold in gates.gates.items():
        rows = [m for m in measurements if m.metric == metric and is_gated(m)]
        if not rows:
            results.append(GateResult(metric, "-", threshold, None, None))
        for m in rows:
            results.append(GateResult(metric, m.scope, threshold, m, decide(threshold, METRICS[metric][0], m)))
    return results
