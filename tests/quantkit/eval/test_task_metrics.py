import numpy as np
import pytest

from quantkit.eval.lm_tasks import TaskScores
from quantkit.eval.suite import BootstrapSpec, TaskPowerSpec
from quantkit.eval.task_metrics import measurements


def scores(correct: list[int], chance=0.25, majority=0.3) -> TaskScores:
    return TaskScores({i: float(c) for i, c in enumerate(correct)}, chance, majority)


def test_drop_is_paired_over_shared_items():
    base = scores([1, 1, 0, 1] * 100)
    cand = scores([1, 0, 0, 1] * 100)
    [row] = measurements({"t": base}, {"t": cand}, BootstrapSpec(resamples=200), TaskPowerSpec())
    assert row.estimate.value == pytest.approx(25.0) and row.estimate.low > 20 and row.estimate.n == 400
    assert row.details["discordance"] == pytest.approx(0.25) and row.gated


def test_task_at_chance_or_at_the_majority_rate_is_not_gated():
    rng = np.random.default_rng(0)
    at_chance = scores(list(rng.random(400) < 0.27))  # 27% against 25% chance: not clearly above
    [row] = measurements({"t": at_chance}, {"t": at_chance}, BootstrapSpec(resamples=50), TaskPowerSpec())
    assert not row.gated and not row.details["above_chance"]
    # 45% correct is clearly above 25% chance, but not above a 50% majority answer ("always yes")
    yes_no = scores(list(rng.random(400) < 0.45), chance=0.25, majority=0.5)
    [row] = measurements({"t": yes_no}, {"t": yes_no}, BootstrapSpec(resamples=50), TaskPowerSpec())
    assert not row.gated
    clear = scores(list(rng.random(400) < 0.45), chance=0.25, majority=0.3)
    [row] = measurements({"t": clear}, {"t": clear}, BootstrapSpec(resamples=50), TaskPowerSpec())
    assert row.gated and row.details["minimum_detectable_drop"] == pytest.approx(5.42, abs=0.01)
