"""`fixedhead bottleneck`: one head's low-rank bottleneck against head size, as a CSV and a PNG.

For random attention matrices P (:func:`fixedhead.theory.random_attention`), the best logit-space
error (:func:`~fixedhead.theory.logit_errors`) and KL fit (:func:`~fixedhead.theory.fit_head`) a
head of each size 1..n can reach, with the sharp threshold n − 1 and the paper's n marked; with
``causal`` the same for causal P beside it, whose threshold is ⌈(n − 1)/2⌉ generically
(:func:`~fixedhead.theory.complete_causal_logits`). The mathematics is :mod:`fixedhead.theory`;
this module is the experiment around it (progress, files, plot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import log_softmax

from ..checks import check_fields, positive_int
from ..plotting import pyplot, save_figure
from ..theory import (
    causal_logit_lower_bounds,
    causal_threshold,
    fit_causal_logits,
    fit_head,
    logit_errors,
    min_head_dim,
    random_attention,
)
from .kit import render
from .kit.study import Point, Study

SWEEP_COLUMNS = [
    "mask",
    "n",
    "seed",
    "temperature",
    "head_dim",
    "min_head_dim",
    "logit_error",
    "logit_error_lower",
    "logit_error_rel",
    "kl_svd",
    "kl_fit",
    "max_abs_error",
]


def _bidirectional_fits(P: np.ndarray, max_iter: int):
    """Per head size k = 1..n, a bidirectional row's numbers (:data:`SWEEP_COLUMNS` from ``logit_error``)."""
    errs = logit_errors(P)
    for k in range(1, len(P) + 1):
        fit = fit_head(np.eye(len(P)), P, k, max_iter=max_iter)
        yield errs[k], errs[k], errs[k] / errs[0], fit.kl_svd_init, fit.kl, fit.max_abs_error


def _causal_fits(P: np.ndarray, max_iter: int):
    """Per head size k = 1..n, a causal row's numbers (:data:`SWEEP_COLUMNS` from ``logit_error``)."""
    n = len(P)
    lower, seen = causal_logit_lower_bounds(P), np.tri(n, dtype=bool)
    logp = np.where(seen, np.log(np.where(seen, P, 1.0)), 0.0)  # log P where a query sees, 0 above
    for k in range(1, n + 1):
        fit = fit_causal_logits(P, k, max_iter=max_iter)
        log_att = np.where(seen, log_softmax(np.where(seen, fit.logits, -np.inf), axis=1), 0.0)  # masked
        kl = np.sum(P * (logp - log_att)) / n
        yield fit.error, lower[k], fit.error / lower[0], math.nan, kl, np.max(np.abs(np.exp(log_att) * seen - P))


@dataclass(frozen=True)
class BottleneckOptions:
    """What the sweep fits: random attention matrices P of each size n and seed, and every head size 1..n."""

    n: tuple[int, ...] = field(default=(16, 32, 64), metadata={"nonempty": True, "distinct": True})
    """sequence lengths (each >= 2)"""
    seeds: tuple[int, ...] = field(
        default=(0, 1, 2), metadata={"check": "non_negative", "nonempty": True, "distinct": True}
    )
    """seeds of the random attention matrices P"""
    temperature: float = 1.0
    """P = softmax(G / T); lower is more peaked"""
    max_iter: int = 100
    """L-BFGS iterations per fit (KL; causal: logit space)"""
    causal: bool = False
    """also a causal head: its threshold ceil((n - 1)/2) beside n - 1"""

    def __post_init__(self):
        check_fields(self)
        for v in self.n:
            positive_int("n", v, minimum=2)
        object.__setattr__(self, "n", tuple(sorted(self.n)))  # one plan whatever the order given
        object.__setattr__(self, "seeds", tuple(sorted(self.seeds)))
        positive_int("max_iter", self.max_iter)
        random_attention(2, self.temperature)  # validates the temperature


QUICK = BottleneckOptions(n=(4, 6), seeds=(0,), max_iter=20)


class BottleneckStudy(Study):
    """One point per (n, mask, seed): P = :func:`random_attention` (generic, so min_head_dim(P) = n − 1) and,
    for every head size k = 1..n, a ``bottleneck.csv`` row (:data:`SWEEP_COLUMNS`):

    * ``logit_error``: e_k = min_{rank L <= k, c} ||L − (log P + c 1^T)||_F in nats (:func:`logit_errors`;
      exact, so ``logit_error_lower`` is the same), ``logit_error_rel`` = e_k / e_0;
    * ``kl_svd``: mean row KL(P || softmax(best rank-k logits)); ``kl_fit``: the same after :func:`fit_head`
      on X = I_n (``max_iter`` L-BFGS iterations from the SVD start: an achieved value, an upper bound);
      ``max_abs_error``: max |achieved attention − P|.

    ``causal`` adds ``mask="causal"`` rows for the causal attention of the same logits (threshold ⌈(n − 1)/2⌉):
    ``logit_error`` reached by :func:`fit_causal_logits` (an upper bound), ``logit_error_lower`` the certified
    bound of :func:`causal_logit_lower_bounds`, ``kl_svd`` NaN. The summary is the report's table (head sizes
    1, n/2, threshold − 1, threshold, n); ``bottleneck.png`` draws every head size."""

    name = "bottleneck"
    help = "one head's low-rank bottleneck against head size (Theorem 1)"
    Options = BottleneckOptions
    quick = QUICK
    files = ("bottleneck.csv", "bottleneck.png")
    points_only = ("n", "seeds", "causal")

    def plan(self, o):
        masks = ("bidirectional", "causal") if o.causal else ("bidirectional",)
        return [Point(f"n{n}-{mask}-s{seed}", (n, mask, seed)) for n in o.n for seed in o.seeds for mask in masks]

    def run(self, o, point, folder, done, progress):
        n, mask, seed = point.spec
        P = random_attention(n, o.temperature, seed, causal=mask == "causal")
        r = min_head_dim(P, causal=mask == "causal")
        fits = _causal_fits(P, o.max_iter) if mask == "causal" else _bidirectional_fits(P, o.max_iter)
        rows = []
        for k, numbers in enumerate(fits, 1):
            values = (mask, n, seed, float(o.temperature), k, r, *map(float, numbers))
            rows.append(dict(zip(SWEEP_COLUMNS, values, strict=True)))
        return {"rows": rows}

    def summarise(self, state):
        """Per mask, n and head size 1, n/2, threshold − 1, threshold and n: the mean logit and KL errors."""
        rows = [r for res in state["results"] for r in res["rows"]]
        out = []
        for mask in dict.fromkeys(r["mask"] for r in rows):
            for n in sorted({r["n"] for r in rows}):
                sel_n = [r for r in rows if r["n"] == n and r["mask"] == mask]
                t = max(r["min_head_dim"] for r in sel_n)
                for k in sorted({1, n // 2, t - 1, t, n} - {0}):
                    sel = [r for r in sel_n if r["head_dim"] == k]
                    le, kl = (sum(r[key] for r in sel) / len(sel) for key in ("logit_error", "kl_fit"))
                    out.append({"mask": mask, "n": n, "head_dim": k, "threshold": t, "logit_error": le, "kl_fit": kl})
        return out

    def report(self, state):
        o = state["options"]
        columns = [
            *(
                (h, f"{{{k}}}")
                for h, k in (("mask", "mask"), ("n", "n"), ("d_p", "head_dim"), ("threshold", "threshold"))
            ),
            ("logit error (nats)", "{logit_error:.3e}"),
            ("KL of the fit (nats)", "{kl_fit:.3e}"),
        ]
        return render.markdown(
            render.Report(
                "One head's low-rank bottleneck against head size (`fixedhead bottleneck`)",
                [
                    f"Random attention matrices P (temperature {o.temperature:g}), n ∈ {list(o.n)}, seeds "
                    f"{list(o.seeds)}; the best logit-space error and the KL of an L-BFGS fit a head of size d_p "
                    "reaches (mean over seeds; paper Theorem 1: zero from d_p = n − 1, causal from ⌈(n − 1)/2⌉). "
                    "Every head size is in `bottleneck.csv`, the curves in `bottleneck.png`.",
                    f"Command: `{state['meta']['command']}`",
                    render.Table(columns, state["summary"]),
                ],
            )
        )

    def write_files(self, state, folder):
        rows = [r for res in state["runs"].values() for r in res["rows"]]
        render.write_csv(folder / "bottleneck.csv", SWEEP_COLUMNS, rows)
        _plot_sweep(rows, list(state["options"].n), folder / "bottleneck.png")


def _plot_sweep(rows: list[dict], ns: list[int], path) -> None:
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()

    floor = 1e-17  # exact zeros (and float64 rounding noise, which can be negative) drawn here
    causal = any(r["mask"] == "causal" for r in rows)
    fig, axes = plt.subplots(2, len(ns), figsize=(4.2 * len(ns), 6.6), squeeze=False, sharey="row")
    panels = [  # (key, the SVD start's key, y label, the causal curve's label)
        ("logit_error", None, "logit-space error e_k (nats, Frobenius)", "causal: achieved (L-BFGS-B)"),
        ("kl_fit", "kl_svd", "mean row KL(P || fit) (nats)", "causal: logit-space fit"),
    ]

    def mean_curve(sel, key):  # [seeds, k] -> geometric mean over seeds, each curve with the floor
        seeds = sorted({r["seed"] for r in sel})
        vals = np.maximum(np.array([[r[key] for r in sel if r["seed"] == s] for s in seeds]), floor)
        return vals, np.exp(np.log(vals).mean(0))

    for col, n in enumerate(ns):
        sel = [r for r in rows if r["n"] == n and r["mask"] == "bidirectional"]
        csel = [r for r in rows if r["n"] == n and r["mask"] == "causal"]
        ks = np.arange(1, n + 1)
        for row, (key, key2, label, causal_label) in enumerate(panels):
            ax = axes[row, col]
            vals, mean = mean_curve(sel, key)
            for v in vals:
                ax.plot(ks, v, color="C0", alpha=0.25, lw=0.8)
            name = "bidirectional: " if causal else ""
            mean_label = f"{name}optimised (L-BFGS)" if key2 else f"{name}{len(vals)} seeds, geometric mean"
            ax.plot(ks, mean, color="C0", lw=2, label=mean_label)
            if key2:
                ax.plot(ks, mean_curve(sel, key2)[1], color="C1", lw=1.5, ls="--", label=f"{name}truncated-SVD logits")
            if csel:
                upper = mean_curve(csel, key)[1]
                ax.plot(ks, upper, color="C2", lw=2, label=causal_label)
                r_causal = sorted({r["min_head_dim"] for r in csel})
                if not key2:
                    lower = mean_curve(csel, "logit_error_lower")[1]
                    ax.plot(ks, lower, color="C2", lw=1, ls=":", label="causal: certified lower bound")
                    below = ks <= r_causal[-1] - 1  # from the threshold on both are 0 up to rounding
                    ax.fill_between(ks[below], lower[below], upper[below], color="C2", alpha=0.15, lw=0)
                for i, rc in enumerate(r_causal):
                    generic = "⌈(n − 1)/2⌉ (causal threshold)" if rc == causal_threshold(n) else "causal threshold"
                    ax.axvline(rc, color="C2", ls="--", lw=1, label=None if i else generic)
            sharp = "bidirectional" if causal else "sharp"
            ax.axvline(n - 1, color="C3", ls="--", lw=1, label=f"n − 1 ({sharp} threshold)")
            ax.axvline(n, color="k", ls=":", lw=1, label="n (paper's d_p ≥ n)")
            ax.axhline(floor, color="0.6", lw=0.6)
            ax.set_yscale("log")
            ax.set_ylim(floor / 3, None)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if col == 0:
                ax.set_ylabel(label)
                ax.legend(fontsize=7, loc="lower left")
        axes[0, col].set_title(f"n = {n}")
        axes[1, col].set_xlabel("head size d_p")
    temp = rows[0]["temperature"]
    what = "bidirectional and causal (masked) heads" if causal else "one head"
    fig.suptitle(
        f"Low-rank bottleneck of {what}, random P = softmax(G / T), T = {temp:g}; "
        f"values at {floor:g} are exact zeros (float64)",
        fontsize=10,
    )
    save_figure(fig, path, axes.flat, legend=False, dpi=110)
