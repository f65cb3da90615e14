"""Task accuracy of a candidate against its baseline on the same items: the drop in points with a paired
interval, whether the task can show a regression at all (its baseline clearly above chance), and what the
item count resolves."""

from __future__ import annotations

import numpy as np

from quantkit.eval.lm_tasks import TaskScores
from quantkit.eval.power import minimum_detectable_drop, wilson_low
from quantkit.eval.stats import Measurement, paired_bootstrap


def measurements(baseline: dict[str, TaskScores], candidate: dict[str, TaskScores], bootstrap, power) -> list:
    """Per task: each model's accuracy and the drop in points, paired over the items both were scored on.
    ``power``: the suite's TaskPowerSpec (assumed discordance and wanted power)."""
    rows = []
    for task, base_scores in baseline.items():
        cand_scores = candidate.get(task, TaskScores({}))
        items = sorted(set(base_scores.scores) & set(cand_scores.scores))
        base = np.array([base_scores.scores[i] for i in items])
        cand = np.array([cand_scores.scores[i] for i in items])
        diff = base - cand
        drop = paired_bootstrap(len(items), lambda idx: diff[idx].mean() * 100, resamples=bootstrap.resamples,
                                confidence=bootstrap.confidence, seed=bootstrap.seed)
        details = above_chance(base_scores, base, bootstrap.confidence)
        details["discordance"] = float(np.mean(diff != 0)) if len(items) else None
        details["minimum_detectable_drop"] = minimum_detectable_drop(
            max(len(items), 1), power.discordance, bootstrap.confidence, power.power)
        rows.append(Measurement("accuracy_drop_points", task, float(base.mean()), float(cand.mean()), drop, "items",
                                gated=details["above_chance"], details=details))
    return rows


def above_chance(scores: TaskScores, base: np.ndarray, confidence: float) -> dict:
    """A task can show a regression only when the baseline's accuracy is clearly above what guessing gets:
    the lower end of its Wilson interval above both the chance level and the majority-answer rate."""
    bar = max(x for x in (scores.chance, scores.majority, 0.0) if x is not None)
    binary = bool(len(base)) and bool(np.all((base == 0) | (base == 1)))
    low = wilson_low(float(base.sum()), len(base), confidence) if binary else None
    above = low is None or low > bar  # non-binary scores (f1) and generation tasks have no chance level here
    return {"chance": scores.chance, "majority": scores.majority, "baseline_low": low, "above_chance": above}
