import numpy as np
import pytest

from quantkit.errors import QuantkitError
from quantkit.eval.power import check_task_margin, items_needed, minimum_detectable_drop, wilson_low


def test_minimum_detectable_drop_and_items_needed_agree():
    # (1.96 + 0.8416) * sqrt(0.15 / 500) * 100
    assert minimum_detectable_drop(500, 0.15) == pytest.approx(4.853, abs=1e-3)
    assert items_needed(5, 0.15) == 471
    assert minimum_detectable_drop(471, 0.15) <= 5 < minimum_detectable_drop(470, 0.15)


def test_power_holds_for_a_candidate_without_a_real_drop():
    """Simulated paired items at discordance 0.15 and no real drop: at the items needed for a 5-point margin,
    the upper end of the interval is within the margin about 80% of the time."""
    rng = np.random.default_rng(0)
    n, trials, passed = items_needed(5, 0.15), 2000, 0
    for _ in range(trials):
        diff = rng.choice([-1, 0, 1], size=n, p=[0.075, 0.85, 0.075])
        upper = diff.mean() + 1.96 * diff.std(ddof=1) / np.sqrt(n)
        passed += upper * 100 <= 5
    assert 0.76 < passed / trials < 0.84


def test_wilson_low_is_below_the_proportion():
    assert wilson_low(50, 100) == pytest.approx(0.4038, abs=1e-3)
    assert wilson_low(0, 10) == pytest.approx(0, abs=1e-12) and wilson_low(5, 0) == 0


def test_check_task_margin_names_the_task_and_items_needed():
    check_task_margin(5, {"arc_easy": 570}, 0.15, 0.95, 0.8, "gate.yaml")
    with pytest.raises(QuantkitError, match=r"gate.yaml: .* 5 points is finer than task 'copa' resolves with 100 "
                                            r"items \(10.9 points.*it needs 471 items"):
        check_task_margin(5, {"arc_easy": 570, "copa": 100}, 0.15, 0.95, 0.8, "gate.yaml")
