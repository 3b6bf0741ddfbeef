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
