"""A sweep's results as the paper's claims: points (mean ± std over seeds) and the claim table.

A claim is judged with Welch's t-test on the seeds by the rule the sweep recorded before training
(``meta.verdict``: p < 0.01 after Holm over the claims tested; sweeps that recorded none, p < 0.05 per
claim): significant in the paper's direction "agrees", in the other "does not agree", else CANNOT_TELL.
With few seeds small real effects end up as "cannot tell", the honest verdict.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

from ...model.paper_presets import PAPER_PRESETS
from ...model.sizes import count_parameters
from ..kit.stats import CANNOT_TELL, LEGACY_RULE, holm, mean_std, pm, spearman, welch, welch_verdict


@dataclass
class PointStats:
    """One (experiment, series, x) point: its runs over seeds and their summaries."""

    experiment: str
    series: str
    x: int
    key: str
    runs: list[dict]

    def values(self, what: str) -> list[float]:
        if what == "ppl":
            return [r["heldout_perplexity"] for r in self.runs]
        if what == "bpc":  # runs from before bits per character was measured have none
            return [
                r["heldout_bits_per_character"] for r in self.runs if r.get("heldout_bits_per_character") is not None
            ]
        return [r["finetune"]["score"] for r in self.runs if "finetune" in r]

    def mean(self, what="ppl") -> float:
        return mean_std(self.values(what))[0]

    def std(self, what="ppl") -> float:
        return mean_std(self.values(what))[1]

    @property
    def params(self) -> int:
        return self.runs[0]["parameters"] if self.runs else 0

    @property
    def head_dim(self) -> int:
        return self.runs[0]["head_dim"] if self.runs else 0


def collect_points(state: dict) -> dict[tuple[str, str], list[PointStats]]:
    """Group finished runs by (experiment, series), each list sorted by x; points with no finished run are dropped."""
    by_key: dict[str, list[dict]] = {}
    for r in state["runs"].values():
        by_key.setdefault(r["key"], []).append(r)
    series: dict[tuple[str, str], list[PointStats]] = {}
    for p in state["points"]:
        runs = sorted(by_key.get(p["key"], []), key=lambda r: r["seed"])
        if runs:
            series.setdefault((p["experiment"], p["series"]), []).append(
                PointStats(p["experiment"], p["series"], p["x"], p["key"], runs)
            )
    for v in series.values():
        v.sort(key=lambda s: s.x)
    return series


def _compare(a: PointStats | None, b: PointStats | None, what: str, label_a: str, label_b: str):
    """One measured comparison: ``(text, b − a, Welch's p)``; p is NaN where it is not measured."""
    if a is None or b is None:
        return "not measured (points missing from this sweep)", math.nan, math.nan
    if not a.values(what) or not b.values(what):
        return "not measured (no fine-tuning scores for these points)", math.nan, math.nan
    delta, p = welch(a.values(what), b.values(what))
    unit, digits = ("perplexity", 2) if what == "ppl" else ("dev score", 4)
    effect = ""
    if what == "ppl":  # the same difference as mean held-out loss, in nats and as a fraction of loss
        loss_a, loss_b = (sum(math.log(v) for v in q.values(what)) / len(q.values(what)) for q in (a, b))
        effect = f", {loss_b - loss_a:+.3f} nats = {100 * (loss_b - loss_a) / loss_a:+.1f}% of loss"
    test = f"Welch p = {p:.2g}" if math.isfinite(p) else "no test with one seed a side"
    text = (
        f"{label_a}: {pm(a.mean(what), a.std(what), digits)}; "
        f"{label_b}: {pm(b.mean(what), b.std(what), digits)} "
        f"({unit}; Δ = {delta:+.{digits}f}{effect}, {test}, n = {len(a.values(what))}/{len(b.values(what))})"
    )
    return text, delta, p


def _point(series, experiment, kind, x):
    return next((q for q in series.get((experiment, kind), []) if q.x == x), None)


def power_sentence(state: dict) -> str:
    """What the verdict rule can see with the sweep's seeds per point (one seed: no test at all)."""
    counts = Counter(r["key"] for r in state["runs"].values())
    lo, hi = min(counts.values(), default=0), max(counts.values(), default=0)
    if lo < 2:
        return "Some points have one seed: no test is possible there, and their comparisons read cannot tell."
    n = str(lo) if lo == hi else f"{lo}-{hi}"
    return (
        f"With {n} seeds per point the test finds only differences of a few standard deviations; smaller "
        "real effects read as cannot tell."
        + (
            ""
            if verdict_rule(state)["correction"] == "holm"
            else " Each claim is tested on its own (no correction for testing several)."
        )
    )


def claims(state: dict) -> list[tuple[str, str, str]]:
    """The side-by-side table: (paper claim, our measurement, verdict)."""
    s = collect_points(state)
    has_finetune = any("finetune" in r for r in state["runs"].values())
    task = state["meta"].get("finetune_task") or "sst2"
    ours = f"{task} dev" if has_finetune else "a fine-tuning score"
    std_h, fix_h = s.get(("heads", "standard"), []), s.get(("heads", "fixed"), [])
    std_e, fix_e = s.get(("embedding", "standard"), []), s.get(("embedding", "fixed"), [])
    hs = s.get(("head_size", "fixed"), [])
    rows = []

    def add(claim, a, b, what, sign, label_a, label_b=None, note=""):
        """One row: b against a on ``what``; ``sign``: the sign the paper implies for b − a; ``label_b``
        (default ``label_a``) names b."""
        text, delta, p = _compare(a, b, what, label_a(a) if a else "", (label_b or label_a)(b) if b else "")
        arms = [q.values(what) for q in (a, b) if q] if what == "ft" else []
        rows.append([claim, text + (note if a and b else ""), delta, p, sign, arms])

    def ends(pts):
        return (pts[0], pts[-1]) if len(pts) >= 2 else (None, None)

    a, b = (min(std_h[:-1], key=lambda q: q.mean()), std_h[-1]) if len(std_h) >= 2 else (None, None)
    add(
        "Fig. 3a: at fixed d the standard model gets *worse* once heads pass a threshold "
        "(LM1B, d=256: beyond 16 heads)",
        *(a, b, "ppl", +1),
        lambda q: f"best standard h={q.x} (d_p={q.head_dim})",
        lambda q: f"standard h={q.x} (d_p={q.head_dim})",
        "; the best is picked after the fact, which favours finding a difference",
    )
    mono = all(y < x for x, y in pairwise([q.mean() for q in fix_h]))
    add(
        "Fig. 3a: with a fixed head size the model keeps improving as heads are added",
        *ends(fix_h),
        *("ppl", -1, lambda q: f"fixed h={q.x}", None),
        f"; means {'fall at every step' if mono else 'do not fall at every step'}: "
        + ", ".join(f"h={q.x}: {q.mean():.2f}" for q in fix_h)
        if len(fix_h) >= 3
        else "",
    )
    # the largest h measured in both series where the two differ (a fixed d_p = d/h is the standard layer)
    std_by_h = {q.x: q for q in std_h}
    h_max = max((q.x for q in fix_h if q.x in std_by_h and std_by_h[q.x].key != q.key), default=None)
    a, b = _point(s, "heads", "standard", h_max), _point(s, "heads", "fixed", h_max)
    add(
        "Sect. 4 / Fig. 3a: at the same d and many heads, a fixed head size beats the standard d_p = d/h",
        *(a, b, "ppl", -1),
        lambda q: f"{q.series} h={q.x} (d_p={q.head_dim})",
    )
    # Fig. 1 and 2: fixed at the smallest d against the standard model of the nearest parameter count
    a = b = None
    if std_e and fix_e and fix_e[-1].key not in {q.key for q in std_e}:
        b = fix_e[-1]
        a = min(std_e, key=lambda q: abs(q.params - b.params))
    add(
        "Fig. 1: fixed-head models at the smallest d reach lower perplexity than standard models "
        "of equal parameter count (made wider instead)",
        *(a, b, "ppl", -1),
        lambda q: f"standard d={q.x} ({q.params / 1e6:.2f}M)",
        lambda q: f"fixed d={q.x}, h={q.runs[0]['num_attention_heads']} ({q.params / 1e6:.2f}M)",
    )
    a_e, b_e = a, b
    add(
        "Table 2B: at fixed d and h, a larger head size is better (d_p 32→256: SQuAD F1 "
        "88.53→90.33, MNLI 82.5→83.9; our proxy: perplexity)",
        *ends(hs),
        *("ppl", -1, lambda q: f"d_p={q.x}"),
    )
    first_finetune_row = len(rows)  # rows from here to the Spearman row are about fine-tuning
    add(
        f"Table 2B, fine-tuned: larger head size fine-tunes better (ours: {ours})",
        *ends(hs),
        *("ft", +1, lambda q: f"d_p={q.x}"),
    )
    add(
        f"Table 1: standard BERT-large with 8→32 heads fine-tunes slightly worse (MNLI 85.0→84.4, "
        f"SQuAD F1 90.89→90.45; ours: {ours})",
        *(_point(s, "heads", "standard", 8), _point(s, "heads", "standard", 32), "ft", -1),
        lambda q: f"standard h={q.x}",
    )
    add(
        f"Table 2A: fixed head size with 8→32 heads fine-tunes better (MNLI 83.5→84.9, SQuAD F1 "
        f"89.6→90.95; ours: {ours})",
        *(_point(s, "heads", "fixed", 8), _point(s, "heads", "fixed", 32), "ft", +1),
        lambda q: f"fixed h={q.x}",
    )
    add(
        f"Fig. 2: fixed-head models fine-tune at least as well as standard models of equal size (ours: {ours})",
        *(a_e, b_e, "ft", +1),
        lambda q: f"standard d={q.x}",
        lambda q: f"fixed d={q.x}, h={q.runs[0]['num_attention_heads']}",
    )
    rows.append(
        [
            "Implicit throughout: lower pretraining perplexity goes with better fine-tuning",
            *_rank_correlation(state),
            +1,
            [[r["finetune"]["score"] for r in state["runs"].values() if "finetune" in r]],
        ]
    )
    if not has_finetune:  # e.g. the causal preset: one reason for every fine-tuning claim
        rows[first_finetune_row:] = [
            [row[0], "not measured (this sweep has no fine-tuning)", math.nan, math.nan, row[4], []]
            for row in rows[first_finetune_row:]
        ]
    # the verdicts, by the rule the sweep recorded before training: Holm's correction counts every
    # claim that was tested
    rule = verdict_rule(state)
    ps = [row[3] for row in rows]
    adjusted = holm(ps) if rule["correction"] == "holm" else ps
    decided, bar = [], chance_bar(state)
    for (claim, text, delta, _, sign, arms), q in zip(rows, adjusted, strict=True):
        if rule["correction"] == "holm" and math.isfinite(q):
            text += f" (Holm-adjusted p = {q:.2g})"
        verdict = welch_verdict(delta, q, sign, rule["alpha"])
        low = min((mean_std(v)[0] for v in arms if v), default=math.nan)
        if bar is not None and low <= bar:  # a side that does not beat the majority class tested nothing
            text += f"; at chance: a side's mean score {low:.4f} ≤ {bar:.4f}, {_CHANCE_TEXT}"
            verdict = UNTESTED
        decided.append((claim, text, verdict))
    rows = decided
    errs = [
        abs(count_parameters(p.build_config()) / 1e6 - p.paper_params) / p.paper_params
        for p in PAPER_PRESETS.values()
        if p.paper_params
    ]
    return rows + [
        (
            f"Tables 1–3: reported parameter counts ({len(errs)} configurations, 130M–336M)",
            f"our architecture's count is within {100 * max(errs):.2f}% of every reported number",
            "agrees",
        ),
        (
            "Tables 1–3 / Fig. 1–3 at the paper's scale: SQuAD and MNLI scores of 24-layer BERT models, "
            "LM1B perplexities",
            f"not run here (this sweep trains {_sizes(state)}); the presets exist, see docs/experiments.md",
            CANNOT_TELL,
        ),
    ]


#: the verdict of a fine-tuning claim whose models do not beat the majority class: nothing was tested
UNTESTED = "untested (model at chance)"
#: a fine-tuned side is at chance unless its mean dev score beats the chance score by more than this
#: many standard errors of a chance-level score on the dev set (accuracy: √(m(1 − m)/N) around the
#: majority-class accuracy m; Matthews correlation: 1/√N around 0)
CHANCE_STANDARD_ERRORS = 2.0
_CHANCE_TEXT = f"the majority class + {CHANCE_STANDARD_ERRORS:g} standard errors of a chance score on the dev set"


def chance_bar(state: dict) -> float | None:
    """The mean fine-tuning dev score a side must beat not to be at chance (:data:`CHANCE_STANDARD_ERRORS`
    above the majority class); None where unknown (another metric, no recorded majority or dev-set size).
    ValueError for runs recording different dev-set sizes or a size that is not positive."""
    from ...data.glue import MAIN_METRIC

    sizes = {r["finetune"].get("dev_examples") for r in state["runs"].values() if "finetune" in r} - {None}
    if len(sizes) > 1:
        raise ValueError(
            f"fine-tuned runs record different dev-set sizes {sorted(sizes)}: one chance level cannot hold"
        )
    if not sizes:
        return None
    n = sizes.pop()
    if not (isinstance(n, int) and n > 0):
        raise ValueError(f"a dev-set size must be a positive integer, got {n!r}")
    metric = MAIN_METRIC.get(state["meta"].get("finetune_task") or "sst2")
    if metric == "matthews":
        return CHANCE_STANDARD_ERRORS / math.sqrt(n)
    majority = state["meta"].get("majority_class_accuracy")
    if metric == "accuracy" and majority is not None:
        return majority + CHANCE_STANDARD_ERRORS * math.sqrt(majority * (1 - majority) / n)
    return None


def verdict_rule(state: dict) -> dict:
    """The verdict rule a sweep recorded before training (:data:`~fixedhead.studies.kit.stats.CLAIMS_RULE`);
    a sweep that recorded none was judged at p < 0.05, each claim on its own."""
    return state["meta"].get("verdict") or LEGACY_RULE


def _rank_correlation(state: dict) -> tuple[str, float, float]:
    """Spearman's ρ between pretraining perplexity and fine-tuning score over every run:
    ``(text, −ρ, p)`` (−ρ: the paper's direction is a negative correlation)."""
    task = state["meta"].get("finetune_task") or "sst2"
    pairs = [(r["heldout_perplexity"], r["finetune"]["score"]) for r in state["runs"].values() if "finetune" in r]
    if len(pairs) < 4:
        return "fewer than 4 fine-tuned runs", math.nan, math.nan
    rho, p = spearman([x for x, _ in pairs], [y for _, y in pairs])
    rho = rho if math.isfinite(rho) else 0.0  # all scores equal (every run at the majority class)
    text = f"Spearman ρ(perplexity, {task} dev) = {rho:+.2f} over {len(pairs)} runs (p = {p:.2g})"
    return text, -rho, float(p)


def _sizes(state: dict) -> str:
    """``"2-layer models of 1.41M-2.52M parameters"``, from the runs."""
    runs = list(state["runs"].values())
    layers = sorted({r.get("num_hidden_layers") for r in runs if r.get("num_hidden_layers")})
    params = [r["parameters"] for r in runs if "parameters" in r]
    what = f"{'/'.join(map(str, layers))}-layer models" if layers else "models"
    return what + (f" of {min(params) / 1e6:.2f}M-{max(params) / 1e6:.2f}M parameters" if params else "")
