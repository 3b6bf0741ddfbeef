"""Seeds to numbers and numbers to verdicts, each rule fixed before the run it judges.

* :func:`welch_verdict` (sweep, scaling): Welch's t-test over seeds, p < α in the paper's direction agrees,
  in the other does not, else cannot tell; several claims are Holm-adjusted first (:data:`CLAIMS_RULE`);
* :func:`pooled_verdict` (widen-experiment): a difference beyond ``RULE_STDS`` pooled standard deviations;
* :func:`threshold_verdict` (farthest-point): every seed above a success bar, or every seed below a failure bar;
* :func:`paired_difference` (arms sharing seeds) and :func:`welch_difference` (independent arms): a difference
  with its 95% interval, read by :func:`difference_word` as decided, equivalent within :data:`TARGET_NATS`, or
  underpowered.
"""

from __future__ import annotations

import math
import warnings

#: Welch's test: a difference counts at p below this (sweeps recorded before :data:`CLAIMS_RULE`)
ALPHA = 0.05
#: the rule a sweep records before training: Welch's test per claim, Holm's correction over the
#: claims tested, α = 0.01 (the fair-comparison standard: a claim is decided only when it is clear)
CLAIMS_RULE = {"test": "welch", "alpha": 0.01, "correction": "holm"}
#: the rule of a results file that records none (sweeps run before the rule was recorded)
LEGACY_RULE = {"test": "welch", "alpha": ALPHA, "correction": "none"}
#: the pooled-σ rule: a difference of means counts beyond this many pooled standard deviations
RULE_STDS = 2.0
#: the threshold rule on a rate in [0, 1]: every seed at or above succeeds, every seed below fails
SUCCEEDS_AT = 0.9
FAILS_BELOW = 0.5

CANNOT_TELL = "cannot tell at this scale"


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1) of seeds' results; NaN where undefined (no value,
    or one value for the deviation)."""
    if not values:
        return float("nan"), float("nan")
    m = sum(values) / len(values)
    s = math.sqrt(sum((x - m) ** 2 for x in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return m, s


def pm(m: float, s: float, digits: int = 2) -> str:
    """``"m ± s"`` with ``digits`` decimals; ``"m (1 seed)"`` without a deviation, ``"–"`` without a mean."""
    if not math.isfinite(m):
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if math.isfinite(s) else f"{m:.{digits}f} (1 seed)"


def pm_of(values: list[float], digits: int = 2) -> str:
    """:func:`pm` of the :func:`mean_std` of ``values``."""
    return pm(*mean_std(values), digits)


# ------------------------------------------------------------------------------ Welch's test
def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """``(mean(b) - mean(a), two-sided p-value)`` of Welch's t-test; p = nan with fewer than 2 values a side."""
    from scipy.stats import ttest_ind

    delta = sum(b) / len(b) - sum(a) / len(a) if a and b else float("nan")
    if len(a) < 2 or len(b) < 2:
        return delta, float("nan")
    if max(a) == min(a) and max(b) == min(b):
        return delta, 0.0 if delta != 0 else 1.0
    with warnings.catch_warnings():  # near-identical seeds: SciPy warns about precision, the p-value stands
        warnings.simplefilter("ignore", RuntimeWarning)
        return delta, float(ttest_ind(b, a, equal_var=False).pvalue)


#: up to this many pairs :func:`spearman`'s p-value is exact (all n! pairings); beyond, SciPy's t approximation
EXACT_SPEARMAN_MAX = 8


def spearman(x: list[float], y: list[float]) -> tuple[float, float]:
    """Spearman's ρ and its two-sided p: exact (the share of the n! rank pairings with |ρ| at least the observed)
    for up to :data:`EXACT_SPEARMAN_MAX` pairs, SciPy's t approximation beyond (which gives p ≈ 1e-24 for ρ = −1
    on 5 runs, where the exact p is 2/5! = 0.017). Both nan when one side is constant."""
    import itertools

    import numpy as np
    from scipy.stats import ConstantInputWarning, rankdata, spearmanr

    with warnings.catch_warnings():  # a constant side: rho is nan, the caller says why
        warnings.simplefilter("ignore", ConstantInputWarning)
        rho, p = (float(v) for v in spearmanr(x, y))
    n = len(x)
    if n <= EXACT_SPEARMAN_MAX and math.isfinite(rho):
        rx, ry = rankdata(x), rankdata(y)
        rx, ry = rx - rx.mean(), ry - ry.mean()
        pairings = np.array(list(itertools.permutations(range(n))))
        rhos = rx[pairings] @ ry / math.sqrt((rx @ rx) * (ry @ ry))
        p = float(np.mean(np.abs(rhos) >= abs(rho) - 1e-12))
    return rho, p


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979) of ``pvalues`` in their order: the k-th smallest × (m − k + 1), made
    non-decreasing, capped at 1; NaN stays NaN and does not count in m."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if math.isfinite(p))
    m, adjusted, running = len(order), [float("nan")] * len(pvalues), 0.0
    for k, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - k) * p))
        adjusted[i] = running
    return adjusted


def welch_verdict(delta: float, p: float, paper_sign: int, alpha: float = ALPHA) -> str:
    """``agrees`` / ``does not agree`` / ``cannot tell at this scale``: a significant difference
    (p < ``alpha``; pass a Holm-adjusted p where several claims are tested) whose sign is
    ``paper_sign`` agrees, one of the other sign does not."""
    if not math.isfinite(p) or p >= alpha or delta == 0:
        return CANNOT_TELL
    return "agrees" if (delta > 0) == (paper_sign > 0) else "does not agree"


def rule_text(rule: dict) -> str:
    """A recorded verdict rule (:data:`CLAIMS_RULE`, :data:`LEGACY_RULE`) in words."""
    corrected = "Holm-adjusted over the claims tested" if rule.get("correction") == "holm" else "each claim on its own"
    return f"Welch's t-test on the seeds of each side, two-sided, p < {rule['alpha']:g} ({corrected})"


# ------------------------------------------------------------------------------- pooled σ
def pooled_verdict(losses_a: list[float], losses_b: list[float]) -> dict:
    """B against A on a loss (lower is better), by ``RULE_STDS`` pooled standard deviations:
    ``{"difference": mean(A) − mean(B), "pooled_std": √((s_A² + s_B²)/2), "threshold", "verdict"}``, the verdict
    "lower loss", "higher loss", "no measurable difference" or "undecided (one seed)"."""
    ma, sa = mean_std(losses_a)
    mb, sb = mean_std(losses_b)
    pooled = math.sqrt((sa**2 + sb**2) / 2)
    diff = ma - mb
    if not math.isfinite(pooled):
        verdict = "undecided (one seed)"
    elif diff > RULE_STDS * pooled:
        verdict = "lower loss"
    elif diff < -RULE_STDS * pooled:
        verdict = "higher loss"
    else:
        verdict = "no measurable difference"
    return {"difference": diff, "pooled_std": pooled, "threshold": RULE_STDS * pooled, "verdict": verdict}


# ------------------------------------------------------------------------------ thresholds
def threshold_verdict(rates: list[float]) -> str:
    """``succeeds`` if every seed's rate is ≥ ``SUCCEEDS_AT``, ``fails`` if every seed's is
    < ``FAILS_BELOW``, ``in between`` otherwise (seeds that disagree included); ``not run`` without seeds."""
    if not rates:
        return "not run"
    if min(rates) >= SUCCEEDS_AT:
        return "succeeds"
    if max(rates) < FAILS_BELOW:
        return "fails"
    return "in between"


# ------------------------------------------------------------------- differences with intervals
#: the smallest difference of held-out loss a study must be able to see, in nats
TARGET_NATS = 0.02
#: the words of :func:`difference_word`
DECIDED = "decided"
UNDERPOWERED = "cannot tell (underpowered)"


def _check_sides(a: list[float], b: list[float], what: str) -> None:
    """Raise ValueError naming the sides' lengths when either has fewer than 2 values, or any value is not finite."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"{what} needs at least 2 values a side, got {len(a)} and {len(b)}")
    bad = [v for v in (*a, *b) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what} needs finite values, got {bad}")


def _interval(delta: float, se: float, df: float, confidence: float) -> tuple[float, float, float]:
    """``(low, high, two-sided p)`` of a t statistic ``delta / se`` with ``df`` degrees of freedom;
    se = 0 gives the point ``[delta, delta]`` and p = 0 (1 where delta is 0 too)."""
    from scipy.stats import t

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if se == 0:
        return delta, delta, 0.0 if delta != 0 else 1.0
    half = float(t.ppf(0.5 + confidence / 2, df)) * se
    return delta - half, delta + half, float(2 * t.sf(abs(delta) / se, df))


def paired_difference(a: list[float], b: list[float], confidence: float = 0.95) -> dict:
    """``b − a`` over pairs sharing seed ``i`` (the same data order): the mean per-seed difference, its t-interval
    (n − 1 degrees of freedom) and the paired t-test's p, as ``{"difference", "low", "high", "p", "df", "n",
    "paired": True}`` in the values' unit. Raises ValueError for sides of different lengths, fewer than 2 pairs
    or a non-finite value."""
    if len(a) != len(b):
        raise ValueError(f"a paired difference needs one value per seed on each side, got {len(a)} and {len(b)}")
    _check_sides(a, b, "a paired difference")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean, sd = mean_std(diffs)
    low, high, p = _interval(mean, sd / math.sqrt(n), n - 1, confidence)
    return {"difference": mean, "low": low, "high": high, "p": p, "df": n - 1, "n": n, "paired": True}


def welch_difference(a: list[float], b: list[float], confidence: float = 0.95) -> dict:
    """``mean(b) − mean(a)`` of two independent samples (≥ 2 values each) with Welch's interval (standard error
    √(s_a²/n_a + s_b²/n_b), Welch–Satterthwaite df) and p: ``{"difference", "low", "high", "p", "df", "n":
    (n_a, n_b), "paired": False}``."""
    _check_sides(a, b, "Welch's interval")
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    va, vb = sa**2 / len(a), sb**2 / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se > 0 else float(len(a) + len(b) - 2)
    low, high, p = _interval(mb - ma, se, df, confidence)
    return {"difference": mb - ma, "low": low, "high": high, "p": p, "df": df, "n": (len(a), len(b)), "paired": False}


def difference_word(
    difference: float, low: float, high: float, p: float, alpha: float = 0.01, target: float = TARGET_NATS
) -> str:
    """What a difference and its interval (nats) say against the smallest difference of interest ``target``:
    ``"decided"`` (the interval excludes 0 and ``p < alpha``, p as the study's rule uses it; NaN fails),
    ``"equivalent: no difference larger than X nats"`` (the interval inside ±target) or
    ``"cannot tell (underpowered)"``."""
    if not all(math.isfinite(v) for v in (difference, low, high)):
        raise ValueError(f"difference and interval must be finite, got {difference}, [{low}, {high}]")
    if not low <= difference <= high:
        raise ValueError(f"the interval [{low}, {high}] must contain the difference {difference}")
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target must be a positive number of nats, got {target}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if (low > 0 or high < 0) and math.isfinite(p) and p < alpha:
        return DECIDED
    if -target < low and high < target:
        return f"equivalent: no difference larger than {target:g} nats"
    return UNDERPOWERED


def seeds_for(sd: float, target: float = TARGET_NATS, alpha: float = 0.01, power: float = 0.8) -> int:
    """Seeds a paired comparison needs to detect ``target`` nats with probability ``power`` by a two-sided paired
    t-test at ``alpha`` (alpha / m for Holm's worst case), given the differences' standard deviation ``sd``: the
    smallest n ≥ 2 whose noncentral-t power reaches it (G*Power's matched pairs, d_z = target / sd); 2 when
    ``sd`` is 0. Raises ValueError beyond 100,000 seeds."""
    from scipy import stats as st

    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be a finite number >= 0, got {sd}")
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target must be a positive number, got {target}")
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must lie in (0, 1), got {alpha} and {power}")
    if sd == 0:
        return 2
    for n in range(2, 100_001):
        df, shift = n - 1, target / sd * math.sqrt(n)
        crit = st.t.ppf(1 - alpha / 2, df)
        # the lower tail P(T < -crit) as the upper tail of -T: SciPy's nct.cdf is NaN that far out at large d_z
        if st.nct.sf(crit, df, shift) + st.nct.sf(crit, df, -shift) >= power:
            return n
    raise ValueError(f"more than 100000 seeds needed for target {target} at sd {sd}")
