import numpy as np

from quantkit.eval.stats import mean_difference, paired_bootstrap, perplexity_increase_pct


def test_interval_covers_the_true_paired_delta():
    rng = np.random.default_rng(42)
    covered = 0
    for trial in range(40):
        item_difficulty = rng.normal(0, 3, 200)  # shared by both models: pairing removes it
        base = item_difficulty + rng.normal(0, 0.5, 200)
        cand = item_difficulty + 0.3 + rng.normal(0, 0.5, 200)
        est = mean_difference(base, cand, resamples=300, seed=trial)
        covered += est.low <= 0.3 <= est.high
        assert est.high - est.low < 0.4  # paired: the 3.0 spread of difficulty is not in the interval
    assert covered >= 34  # 95% intervals: expect ~38 of 40


def test_seeded_and_reports_sample_size():
    data = np.arange(10.0)
    a = paired_bootstrap(10, lambda idx: data[idx].mean(), seed=3)
    b = paired_bootstrap(10, lambda idx: data[idx].mean(), seed=3)
    assert a == b and a.n == 10 and a.value == 4.5 and a.low < 4.5 < a.high


def test_one_unit_has_no_interval_and_infinite_values_survive():
    assert paired_bootstrap(1, lambda idx: 2.0).low is None
    est = paired_bootstrap(4, lambda idx: float("inf"))
    assert est.low == est.high == float("inf")


def test_perplexity_increase_is_the_token_weighted_ratio_with_an_interval():
    counts = np.array([511, 511, 300, 511])
    base = counts * np.array([3.0, 3.2, 2.9, 3.1])  # per-sequence NLL sums
    cand = base + counts * 0.1  # 0.1 nats more per token everywhere
    est = perplexity_increase_pct(base, cand, counts)
    assert np.isclose(est.value, (np.exp(0.1) - 1) * 100)
    assert np.isclose(est.low, est.value) and np.isclose(est.high, est.value)  # no spread: every draw agrees
    noisy = cand + np.array([30.0, -30.0, 10.0, -10.0])
    spread = perplexity_increase_pct(base, noisy, counts)
    assert spread.low < est.value < spread.high
