import numpy as np
import pytest
from collections import Counter

from quantkit.data.coverage import compare, js_divergence, ks_statistic, write_report
from quantkit.data.records import Record


def test_ks_statistic_hand_cases():
    assert ks_statistic(np.array([1, 2, 3]), np.array([1, 2, 3])) == 0.0
    assert ks_statistic(np.array([1, 2]), np.array([10, 20])) == 1.0
    # CDFs: a = {1,2,3,4}, b = {3,4,5,6}: at x=2, F_a = 0.5 and F_b = 0
    assert ks_statistic(np.array([1, 2, 3, 4]), np.array([3, 4, 5, 6])) == pytest.approx(0.5)


def test_js_divergence_hand_cases():
    assert js_divergence(Counter({1: 5, 2: 5}), Counter({1: 1, 2: 1})) == pytest.approx(0.0)
    assert js_divergence(Counter({1: 3}), Counter({2: 7})) == pytest.approx(1.0)
    # p = (1, 0), q = (1/2, 1/2): m = (3/4, 1/4)
    expected = 0.5 * np.log2(1 / 0.75) + 0.5 * (0.5 * np.log2(0.5 / 0.75) + 0.5 * np.log2(0.5 / 0.25))
    assert js_divergence(Counter({1: 2}), Counter({1: 1, 2: 1})) == pytest.approx(expected)


def _recs(n, task, lang):
    return [Record(f"f:{i}", "text", text="x", task=task, lang=lang) for i in range(n)]


def test_matching_traffic_gives_no_warning():
    rng = np.random.default_rng(0)
    ids = [list(rng.integers(0, 50, size=rng.integers(20, 60))) for _ in range(200)]
    report = compare(_recs(100, "qa", "en"), ids[:100], _recs(100, "qa", "en"), ids[100:])
    assert report.warnings == [] and not report.poor_match


def test_mismatch_says_what_is_missing(tmp_path):
    rng = np.random.default_rng(0)
    calib_ids = [list(rng.integers(0, 50, size=30)) for _ in range(50)]
    traffic_ids = [list(rng.integers(100, 150, size=300)) for _ in range(50)]
    traffic = _recs(40, "refund", "zh") + _recs(10, "qa", "en")
    report = compare(_recs(50, "qa", "en"), calib_ids, traffic, traffic_ids)
    text = "\n".join(report.warnings)
    assert "languages in traffic but not in the calibration set: zh" in text
    assert "refund (80%)" in text
    assert "traffic is longer" in text
    assert "vocabulary differs" in text
    write_report(report, calib_ids, traffic_ids, tmp_path)
    assert "POOR MATCH" in (tmp_path / "coverage.md").read_text()
    assert (tmp_path / "coverage_lengths.png").read_bytes()[:4] == b"\x89PNG"
