"""fixedhead.studies.kit.stats: mean ± std over seeds and the three verdict rules, side by side."""

import math
import statistics

import numpy as np
import pytest

from fixedhead.studies.kit.stats import mean_std, pm, pooled_verdict, threshold_verdict, welch, welch_verdict


def test_mean_std_is_the_sample_deviation():
    values = [1.0, 2.0, 4.0]
    assert mean_std(values) == pytest.approx((statistics.mean(values), statistics.stdev(values)))
    m, s = mean_std([3.0])
    assert m == 3.0 and math.isnan(s)
    assert all(math.isnan(x) for x in mean_std([]))
    assert pm(1.23456, 0.1, 3) == "1.235 ± 0.100"
    assert pm(1.0, float("nan")) == "1.00 (1 seed)" and pm(float("nan"), float("nan")) == "–"


def test_welch_rule():
    d, p = welch([10.0, 10.1], [12.0, 12.1])
    assert d == pytest.approx(2.0) and p < 0.05
    assert welch_verdict(d, p, +1) == "agrees" and welch_verdict(d, p, -1) == "does not agree"
    d, p = welch([10.0, 12.0], [10.5, 11.9])  # overlapping seeds
    assert welch_verdict(d, p, +1) == "cannot tell at this scale"
    d, p = welch([10.0], [20.0])  # one seed: no test, no verdict
    assert welch_verdict(d, p, +1) == "cannot tell at this scale"


@pytest.mark.parametrize(
    "a, b, verdict",
    [
        ([5.00, 5.01, 4.99], [4.90, 4.91, 4.89], "lower loss"),
        ([4.90, 4.91, 4.89], [5.00, 5.01, 4.99], "higher loss"),
        ([5.00, 5.01, 4.99], [4.99, 5.00, 4.98], "no measurable difference"),
        ([5.0], [4.0], "undecided (one seed)"),
    ],
)
def test_pooled_sigma_rule(a, b, verdict):
    c = pooled_verdict(a, b)
    assert c["verdict"] == verdict
    assert c["difference"] == pytest.approx(sum(a) / len(a) - sum(b) / len(b))
    if len(a) > 1:
        assert c["threshold"] == pytest.approx(2 * 0.01)  # both stds are 0.01


def test_threshold_rule():
    assert threshold_verdict([0.95, 0.91, 0.99]) == "succeeds"
    assert threshold_verdict([0.95, 0.89]) == "in between"  # one seed below the bar
    assert threshold_verdict([0.1, 0.49]) == "fails"
    assert threshold_verdict([0.1, 0.5]) == "in between"
    assert threshold_verdict([]) == "not run"


def test_spearman_p_is_exact_for_few_pairs_and_scipys_beyond():
    import itertools

    from scipy.stats import spearmanr

    from fixedhead.studies.kit.stats import spearman

    # a perfect ρ on 5 runs: only the identity and the reversal of 5! pairings reach |ρ| = 1
    rho, p = spearman([397.7, 388.4, 385.5, 380.7, 390.1], [0.667, 0.692, 0.720, 0.722, 0.680])
    assert rho == pytest.approx(-1.0) and p == pytest.approx(2 / 120)
    # an independent count: ρ = 1 − 6 Σd² / (n(n² − 1)) over every pairing of 6 distinct ranks
    x, y = [1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5]
    observed = 1 - 6 * sum((a - b) ** 2 for a, b in zip(x, y, strict=True)) / (6 * 35)
    count = sum(
        abs(1 - 6 * sum((a - b) ** 2 for a, b in zip(x, perm, strict=True)) / (6 * 35)) >= abs(observed) - 1e-12
        for perm in itertools.permutations(y)
    )
    assert spearman(x, y) == pytest.approx((observed, count / 720))
    # beyond 8 pairs: SciPy's value
    x9, y9 = list(range(10)), [0, 2, 1, 3, 5, 4, 9, 6, 8, 7]
    assert spearman(x9, y9) == pytest.approx(tuple(float(v) for v in spearmanr(x9, y9)))
    rho, p = spearman([1, 2, 3, 4], [0.5, 0.5, 0.5, 0.5])  # a constant side: undefined
    assert math.isnan(rho) and math.isnan(p)


# the held-out losses (nats) of two arms over five seeds; arm b is lower by about 0.01 on every seed
LOSS_A = [5.931, 5.918, 5.957, 5.940, 5.925]
LOSS_B = [5.920, 5.909, 5.944, 5.932, 5.913]


def test_paired_difference_is_scipys_paired_t_interval():
    from scipy.stats import ttest_rel

    from fixedhead.studies.kit.stats import paired_difference

    ref = ttest_rel(LOSS_B, LOSS_A)
    ci = ref.confidence_interval(0.95)
    got = paired_difference(LOSS_A, LOSS_B)
    assert got["difference"] == pytest.approx(sum(LOSS_B) / 5 - sum(LOSS_A) / 5)
    assert (got["low"], got["high"]) == pytest.approx((ci.low, ci.high))
    assert got["p"] == pytest.approx(ref.pvalue) and got["df"] == 4 and got["paired"]
    # the pairing removes the seeds' shared spread: the interval is far narrower than Welch's
    from fixedhead.studies.kit.stats import welch_difference

    unpaired = welch_difference(LOSS_A, LOSS_B)
    assert got["high"] - got["low"] < (unpaired["high"] - unpaired["low"]) / 5


def test_welch_difference_is_scipys_welch_interval():
    from scipy.stats import t, ttest_ind

    from fixedhead.studies.kit.stats import welch_difference

    a, b = [375.7, 371.9, 385.1, 370.0], [379.2, 385.6, 373.5]  # unequal lengths
    ref = ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(0.95)
    got = welch_difference(a, b)
    assert (got["low"], got["high"], got["p"]) == pytest.approx((ci.low, ci.high, ref.pvalue))
    # the Welch–Satterthwaite degrees of freedom, by hand in NumPy
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    assert got["df"] == pytest.approx(df) and got["n"] == (4, 3) and not got["paired"]
    half = t.ppf(0.95, df) * np.sqrt(va + vb)  # a 90% interval
    assert welch_difference(a, b, 0.90)["high"] == pytest.approx(np.mean(b) - np.mean(a) + half)


def test_differences_refuse_what_they_cannot_compute():
    from fixedhead.studies.kit.stats import paired_difference, welch_difference

    with pytest.raises(ValueError, match="got 3 and 2"):
        paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least 2 values a side, got 1 and 1"):
        paired_difference([1.0], [2.0])
    with pytest.raises(ValueError, match="at least 2 values a side, got 1 and 3"):
        welch_difference([1.0], [2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="nan"):
        welch_difference([1.0, float("nan")], [2.0, 3.0])
    with pytest.raises(ValueError, match="confidence .* got 95"):
        welch_difference([1.0, 2.0], [2.0, 3.0], confidence=95)
    # identical per-seed differences: the interval is the point, and p says it is decided
    same = paired_difference([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert (same["low"], same["high"], same["p"]) == pytest.approx((0.5, 0.5, 0.0))


@pytest.mark.parametrize(
    "difference, low, high, p, word",
    [
        (-0.05, -0.08, -0.02, 0.001, "decided"),
        (0.05, 0.02, 0.08, 0.001, "decided"),
        (-0.05, -0.08, -0.02, 0.03, "cannot tell (underpowered)"),  # excludes 0, but p misses α = 0.01
        (-0.004, -0.015, 0.007, 0.4, "equivalent: no difference larger than 0.02 nats"),
        (-0.010, -0.045, 0.025, 0.5, "cannot tell (underpowered)"),
        (0.0, -0.02, 0.01, 1.0, "cannot tell (underpowered)"),  # touching the target is not inside it
        (-0.005, -0.009, -0.001, float("nan"), "equivalent: no difference larger than 0.02 nats"),
    ],
)
def test_difference_word(difference, low, high, p, word):
    from fixedhead.studies.kit.stats import difference_word

    assert difference_word(difference, low, high, p) == word


def test_difference_word_target_and_errors():
    from fixedhead.studies.kit.stats import difference_word

    assert difference_word(-0.01, -0.025, 0.005, 0.3, target=0.03) == "equivalent: no difference larger than 0.03 nats"
    assert difference_word(-0.01, -0.025, 0.005, 0.3) == "cannot tell (underpowered)"
    with pytest.raises(ValueError, match=r"\[0.1, 0.2\] must contain the difference 0.3"):
        difference_word(0.3, 0.1, 0.2, 0.01)
    with pytest.raises(ValueError, match="finite, got nan"):
        difference_word(float("nan"), 0.1, 0.2, 0.01)
    with pytest.raises(ValueError, match="target .* got -0.02"):
        difference_word(0.0, -0.1, 0.1, 0.5, target=-0.02)
    with pytest.raises(ValueError, match="alpha .* got 5"):
        difference_word(0.0, -0.1, 0.1, 0.5, alpha=5)


def test_seeds_for_matches_g_power_matched_pairs():
    """G*Power 3.1, t tests, means, difference between two dependent means (matched pairs), two tails,
    α = 0.05, power 0.80: d_z = 1.0 needs 10 pairs, d_z = 0.5 needs 34."""
    from fixedhead.studies.kit.stats import seeds_for

    assert seeds_for(sd=1.0, target=1.0, alpha=0.05) == 10
    assert seeds_for(sd=2.0, target=1.0, alpha=0.05) == 34
    assert seeds_for(sd=0.0, target=0.02) == 2
    with pytest.raises(ValueError, match="sd"):
        seeds_for(sd=-1.0)


def test_seeds_for_a_large_effect_is_not_lost_to_the_far_tail():
    """At d_z = 2.5 (sd 0.014, target 0.035 nats, α = 0.01 / 3) SciPy's noncentral t gives NaN for the far lower
    tail; the power there is the upper tail's. A simulated paired t-test (NumPy draws, SciPy's t quantile)
    puts the power near 0.73 at 6 seeds and 0.89 at 7, so 7 is the answer; and a larger effect never needs
    more seeds."""
    from scipy import stats as st

    from fixedhead.studies.kit.stats import seeds_for

    rng = np.random.default_rng(0)
    power = {}
    for n in (6, 7):
        d = rng.normal(0.035, 0.014, (40_000, n))
        t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
        power[n] = np.mean(np.abs(t) > st.t.ppf(1 - 0.01 / 6, n - 1))
    assert power[6] < 0.8 < power[7]
    assert seeds_for(0.014, 0.035, 0.01 / 3) == 7
    needed = [seeds_for(0.014, t / 1000, 0.01 / 3) for t in range(20, 60)]
    assert needed == sorted(needed, reverse=True)


def test_seeds_for_counts_an_n_whose_lower_tail_scipy_returns_as_nan():
    """d_z = 10 at α = 0.01 / 6 (Holm over six rows): scipy's noncentral t cdf is NaN for the lower
    tail at n = 4, where the power is already about 0.98. The reference is a simulation of the
    paired t-test itself (plain NumPy draws): n = 3 rejects in about 39% of trials, n = 4 in 98%."""
    from scipy import stats as st

    from fixedhead.studies.kit.stats import seeds_for

    alpha, rng = 0.01 / 6, np.random.default_rng(0)

    def simulated_power(n):
        d = rng.normal(0.02, 0.002, size=(100_000, n))
        t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
        return float((np.abs(t) > st.t.ppf(1 - alpha / 2, n - 1)).mean())

    assert simulated_power(3) < 0.8 <= simulated_power(4)
    assert seeds_for(sd=0.002, target=0.02, alpha=alpha) == 4
