"""The auto mix: recovers a known mixture, predicts what coverage then measures, and says what no set has."""

import numpy as np
import pytest

from quantkit.data import coverage
from quantkit.data.mix import choose_mix, profile, score
from quantkit.data.records import Record

GRID, VOCAB = 201, 300


def _set(n, lo, hi, lengths, lang, rng, task="unknown"):
    ids = [list(rng.integers(lo, hi, size=rng.integers(*lengths))) for _ in range(n)]
    return [Record(f"f:{i}", "text", text="x", task=task, lang=lang) for i in range(n)], ids


def test_recovers_a_known_mixture():
    rng = np.random.default_rng(0)
    short_en, long_en = _set(200, 0, 100, (10, 30), "en", rng), _set(200, 100, 200, (80, 150), "en", rng)
    # Traffic: one part of the short set's kind to three of the long set's, drawn afresh.
    a, b = _set(50, 0, 100, (10, 30), "en", rng), _set(150, 100, 200, (80, 150), "en", rng)
    traffic = profile(a[0] + b[0], a[1] + b[1], GRID, VOCAB, None)
    parts = [profile(*short_en, GRID, VOCAB, 200), profile(*long_en, GRID, VOCAB, 200)]
    mix = choose_mix(["short", "long"], parts, [200, 200], traffic, 40)
    assert sum(mix.counts.values()) == 40
    assert abs(mix.counts["short"] - 10) <= 2
    assert mix.score.total < mix.best_single_score.total


def test_predicted_measures_are_the_coverage_report_measures():
    """With every record of one set, the profile-based KS and JSD equal coverage.compare's."""
    rng = np.random.default_rng(1)
    records, ids = _set(60, 0, 150, (5, 90), "en", rng)
    t_records, t_ids = _set(40, 50, 200, (20, 120), "en", rng)
    predicted = score(np.array([1.0]), [profile(records, ids, GRID, VOCAB, 200)],
                      profile(t_records, t_ids, GRID, VOCAB, None), use_tasks=False)
    measured = coverage.compare(records, ids, t_records, t_ids)
    assert predicted.ks_length == pytest.approx(measured.ks_length)
    assert predicted.jsd_unigram == pytest.approx(measured.jsd_unigram)


def test_a_language_no_candidate_has_is_named_and_a_mix_still_chosen():
    rng = np.random.default_rng(2)
    en = _set(50, 0, 100, (10, 30), "en", rng)
    zh = _set(30, 100, 200, (10, 30), "zh", rng)
    mix = choose_mix(["en_set"], [profile(*en, GRID, VOCAB, 200)], [50],
                     profile(zh[0] + en[0][:10], zh[1] + en[1][:10], GRID, VOCAB, None), 8)
    assert mix.counts == {"en_set": 8}
    assert len(mix.warnings) == 1 and "'zh'" in mix.warnings[0] and "75%" in mix.warnings[0]


def test_never_draws_more_than_a_set_holds():
    rng = np.random.default_rng(3)
    small, big = _set(3, 0, 100, (10, 30), "en", rng), _set(100, 100, 200, (10, 30), "en", rng)
    traffic = profile(*_set(50, 0, 100, (10, 30), "en", rng), GRID, VOCAB, None)
    mix = choose_mix(["small", "big"], [profile(*small, GRID, VOCAB, 200), profile(*big, GRID, VOCAB, 200)],
                     [3, 100], traffic, 20)
    assert mix.counts == {"small": 3, "big": 17}
