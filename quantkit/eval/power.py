"""What a task gate can resolve at its item count: the smallest accuracy drop margin that a candidate with no
real drop passes with the wanted power, and the items a finer margin needs.

A task gate is a non-inferiority test on paired items: the candidate passes when the upper end of the
two-sided interval of the drop is within the margin. Each item's difference (baseline score - candidate
score) is -1, 0 or 1, so with a discordance d (the share of items the two models score differently) and no
real drop its standard deviation is sqrt(d). The upper end then lies below the margin with probability
``power`` when margin >= (z_{1-alpha/2} + z_power) * sqrt(d / n).
"""

from __future__ import annotations

import math
from statistics import NormalDist


def _z_sum(confidence: float, power: float) -> float:
    normal = NormalDist()
    return normal.inv_cdf(1 - (1 - confidence) / 2) + normal.inv_cdf(power)


def minimum_detectable_drop(items: int, discordance: float, confidence: float = 0.95, power: float = 0.8) -> float:
    """In accuracy points: the finest margin ``items`` paired items resolve."""
    return 100 * _z_sum(confidence, power) * math.sqrt(discordance / items)


def items_needed(margin_points: float, discordance: float, confidence: float = 0.95, power: float = 0.8) -> int:
    return math.ceil(discordance * (_z_sum(confidence, power) * 100 / margin_points) ** 2)


def wilson_low(successes: float, n: int, confidence: float = 0.95) -> float:
    """Lower end of the Wilson score interval of a proportion: is a baseline's accuracy above chance?"""
    if n == 0:
        return 0.0
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


def check_task_margin(margin_points: float, item_counts: dict[str, int], discordance: float, confidence: float,
                      power: float, gates_path) -> None:
    """Refuse, before any scoring, a task margin finer than some task's item count can resolve."""
    from quantkit.errors import QuantkitError

    for task, items in item_counts.items():
        finest = minimum_detectable_drop(items, discordance, confidence, power)
        if margin_points < finest:
            raise QuantkitError(
                f"{gates_path}: 'accuracy_drop_points.max': {margin_points:g} points is finer than task '{task}' "
                f"resolves with {items} items ({finest:.1f} points at discordance {discordance:g}, "
                f"power {power:g}); it needs {items_needed(margin_points, discordance, confidence, power)} items",
                hint="score more items (the suite's tasks, --limit) or gate with a wider margin "
                     "(the quick suite has its own gate file)")
