"""fixedhead.studies.stats: mean ± std over seeds and the three verdict rules, side by side."""

import math
import statistics

import pytest

from fixedhead.studies.stats import mean_std, pm, pooled_verdict, threshold_verdict, welch, welch_verdict


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

    from fixedhead.studies.stats import spearman

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
