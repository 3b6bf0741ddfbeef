"""The scaling study's summary and rendering: per family, held-out loss per size, power laws L = a·X^(−b)
against non-embedding parameters N and training FLOPs C, each family against ``standard`` (Welch's p,
Holm-corrected; the compute multiplier) and the trained heads' ranks, from the results state alone."""

from __future__ import annotations

import math
from pathlib import Path

from ...plotting import pyplot, save_figure
from ...theory import causal_threshold
from ..kit import render
from ..kit.stats import CLAIMS_RULE, holm, mean_std, pm, welch

REPORT_FILE = "report.md"
PLOT_FILE = "scaling.png"
RANK_PLOT_FILE = "ranks.png"
#: a per-size difference counts at the claims' Holm-corrected level (corrected over the sizes of a family)
ALPHA = CLAIMS_RULE["alpha"]


# ------------------------------------------------------------------------------- summary
def chosen_rows(state: dict) -> dict[str, list[dict]]:
    """{point key: its runs at the chosen rate (the recipe's rate without a grid)}, seeds ascending.
    A point still choosing its rate has none: its grid runs are not results."""
    rows = {}
    grid = state["meta"]["plan"]["learning_rates"]
    for r in state["runs"].values():
        tuning = state["tuning"].get(r["point"])
        if grid and tuning is None:
            continue
        if r["learning_rate"] == (tuning["chosen"] if tuning else r["learning_rate"]):
            rows.setdefault(r["point"], []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in rows.items()}


def power_law(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) of the least-squares fit log y = log a − b·log x (L = a·X^(−b)). Raises ValueError
    with fewer than 2 distinct x."""
    import numpy as np

    if len(set(xs)) < 2:
        raise ValueError(f"a power law needs at least 2 distinct sizes, got {sorted(set(xs))}")
    slope, intercept = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(math.exp(intercept)), float(-slope)


def summarise(state: dict) -> dict:
    """Per family: its points (mean ± std loss, bits per character), power laws against N and C (pooled and per
    seed), and against ``standard`` the per-size difference with Welch's p and the compute multiplier (the FLOPs
    the standard fit needs to reach the family's loss over the family's; > 1: the family is cheaper)."""
    rows = chosen_rows(state)
    points = {pt["key"]: pt for pt in state["meta"]["plan"]["points"]}
    families: dict[str, dict] = {}
    for key, pt in points.items():
        runs = rows.get(key, [])
        if not runs:
            continue
        losses = [r["heldout_loss"] for r in runs]
        bpc = [r["heldout_bits_per_character"] for r in runs if r.get("heldout_bits_per_character") is not None]
        f = families.setdefault(pt["family"], {"points": []})
        f["points"].append(
            {
                **{k: pt[k] for k in ("key", "hidden_size", "num_attention_heads", "head_dim")},
                **{k: pt[k] for k in ("non_embedding_parameters", "tokens", "flops")},
                "learning_rate": runs[0]["learning_rate"],
                "losses": losses,
                "seeds": [r["seed"] for r in runs],
                "loss": mean_std(losses),
                "bits_per_character": mean_std(bpc) if bpc else None,
            }
        )
    for f in families.values():
        pts = f["points"]
        if len({pt["non_embedding_parameters"] for pt in pts}) < 2:
            continue
        for axis, key in (("parameters", "non_embedding_parameters"), ("flops", "flops")):
            xs = [pt[key] for pt in pts for _ in pt["losses"]]
            ys = [loss for pt in pts for loss in pt["losses"]]
            a, b = power_law(xs, ys)
            per_seed = []
            for seed in sorted({s for pt in pts for s in pt["seeds"]}):
                sx = [pt[key] for pt in pts if seed in pt["seeds"]]
                sy = [pt["losses"][pt["seeds"].index(seed)] for pt in pts if seed in pt["seeds"]]
                if len(set(sx)) >= 2:
                    per_seed.append(power_law(sx, sy))
            f[f"fit_{axis}"] = {"a": a, "b": b, "per_seed": [{"a": sa, "b": sb} for sa, sb in per_seed]}
    base = families.get("standard")
    for name, f in families.items():
        if name == "standard" or base is None:
            continue
        by_size = {pt["hidden_size"]: pt for pt in base["points"]}
        fit = base.get("fit_flops")
        for pt in f["points"]:
            ref = by_size.get(pt["hidden_size"])
            if ref is None:
                continue
            delta, p = welch(ref["losses"], pt["losses"])
            pt["versus_standard"] = {"delta_loss": delta, "fraction": delta / ref["loss"][0], "p": p}
            if fit and fit["b"] > 0:
                needed = (fit["a"] / pt["loss"][0]) ** (1 / fit["b"])
                pt["versus_standard"]["compute_multiplier"] = needed / pt["flops"]
        compared = [pt["versus_standard"] for pt in f["points"] if "versus_standard" in pt]
        for vs, adjusted in zip(compared, holm([vs["p"] for vs in compared]), strict=True):
            vs["p_holm"] = adjusted
            vs["significant"] = adjusted < ALPHA
    return families


# ------------------------------------------------------------------------------- rendering
def report_markdown(state: dict) -> str:
    meta, plan = state["meta"], state["meta"]["plan"]
    families = summarise(state)
    unigram = state["unigram_perplexity"]
    note = (
        f"Each point chose its learning rate on a validation split with seed {plan['seeds'][0]} (grid "
        f"{', '.join(f'{x:g}' for x in plan['learning_rates']) or 'none: the recipe rate'}; {plan['rate_rule']}); the "
        "other seeds train at that rate. Losses are held-out nats per token"
        + (f" (unigram reference {math.log(unigram):.3f})." if unigram else ".")
    )

    def versus(pt: dict) -> str:
        vs = pt.get("versus_standard")
        if not vs:
            return ""
        multiplier = f", ×{vs['compute_multiplier']:.2f} compute" if "compute_multiplier" in vs else ""
        return f"{vs['delta_loss']:+.4f} ({100 * vs['fraction']:+.2f}%), Holm p = {vs['p_holm']:.2g}{multiplier}"

    points = [
        ("family", "{family}"),
        *((h, f"{{{k}}}") for h, k in (("d", "hidden_size"), ("h", "num_attention_heads"), ("d_p", "head_dim"))),
        ("N (non-emb.)", "{non_embedding_parameters:,}"),
        ("tokens", "{tokens:,}"),
        ("FLOPs", "{flops:.2e}"),
        ("lr", "{learning_rate:g}"),
        ("loss", lambda pt: pm(*pt["loss"], 4)),
        ("bits/char", lambda pt: pm(*pt["bits_per_character"], 3) if pt["bits_per_character"] else ""),
        ("vs standard", versus),
    ]
    fits = []
    for name, f in families.items():
        for axis, x in (("parameters", "N"), ("flops", "C")):
            if fit := f.get(f"fit_{axis}"):
                bs = [s["b"] for s in fit["per_seed"]]
                fits.append([name, x, f"{fit['a']:.3g}", f"{fit['b']:.4f}", pm(*mean_std(bs), 4) if bs else ""])
    return render.markdown(
        render.Report(
            "Scaling: loss against size and compute, per head-size family",
            [
                f"{meta['description']}.",
                f"{note}\n![held-out loss against non-embedding parameters and training FLOPs]({PLOT_FILE})",
            ],
            [
                render.what_was_run(meta),
                render.Section(
                    "Points",
                    [
                        render.Table(points, [{"family": n, **pt} for n, f in families.items() for pt in f["points"]]),
                        VERSUS,
                    ],
                ),
                render.Section(
                    "Power laws L = a·X^(−b)", [render.Table(["family", "X", "a", "b (all seeds)", "b per seed"], fits)]
                ),
                rank_section(state),
            ],
        )
    )


VERSUS = "\n".join(
    [
        "\"vs standard\": the family's mean loss minus the standard family's at the same d (negative: lower), as a",
        "fraction of the standard loss, Welch's p Holm-corrected over the family's sizes (a difference counts at",
        f"p < {ALPHA}; Kaplan et al. 2020 find shape effects within ~2% of loss), and the compute multiplier:",
        "the training FLOPs the standard family's fitted curve needs to reach this loss, over this point's FLOPs",
        "(> 1: this family reaches the loss more cheaply).",
    ]
)


def rank_section(state: dict) -> render.Section | None:
    """The trained-rank table: per point, its logit rank against its ceiling and its patterns' rank."""
    ranks = state.get("ranks") or {}
    if not ranks:
        return None
    meta, points = state["meta"], state["meta"]["plan"]["points"]
    n, causal = meta["n"], meta["objective"] == "clm"
    need = causal_threshold(n) if causal else n
    first = next(iter(ranks.values()))
    rows = []
    for pt in points:
        r = ranks.get(pt["key"])
        if r is None:
            continue
        pattern = f"{r['pattern_rank']:.1f} ({r['pattern_rank_max']:.1f})" if r["pattern_rank"] is not None else ""
        logit, ceiling = f"{r['logit_rank']:.1f} ({r['logit_rank_max']:.1f})", f"{100 * r['at_ceiling']:.0f}%"
        rows.append([pt["family"], pt["hidden_size"], pt["head_dim"], r["heads"], logit, ceiling, pattern])
    header = ["family", "d", "d_p", "heads", "logit rank: mean (max)", "heads at ceiling", "pattern rank: mean (max)"]
    return render.Section(
        "Do the heads sit at their rank ceiling?",
        [
            render.Figure(RANK_PLOT_FILE, "mean logit rank and heads at their ceiling against N"),
            f"Each point's seed-{meta['plan']['seeds'][0]} run at its chosen rate, on {first['windows']} evenly spaced "
            f"held-out windows of n = {n} tokens (`fixedhead.diagnostics.analysis`). Rank counts singular values above "
            f"{first['rtol']:g} of the largest (at float32 resolution every head fills its structural rank). "
            "\"logit rank\": of each head's n × n logits, a mean over heads of each head's mean over windows, "
            'and the largest head mean; "at ceiling": heads whose mean is within 0.5 of min(d_p, n); "pattern '
            'rank": the rank of the per-query centred log-attention'
            + (" (lower triangle)" if causal else "")
            + ", the head size its patterns need. The paper's argument: an arbitrary "
            + ("causal " if causal else "")
            + f"pattern over n = {n} tokens needs d_p ≥ {need}.",
            render.Table(header, rows),
        ],
    )


def write_plots(state: dict, out: Path) -> None:
    """``scaling.png`` and, where ranks were read, ``ranks.png`` in ``out``."""
    plot(state, out / PLOT_FILE)
    if state.get("ranks"):
        plot_ranks(state, out / RANK_PLOT_FILE)


def plot_ranks(state: dict, path: Path) -> None:
    """Per family against N: the mean logit rank with each point's d_p (dashed), and the fraction
    of heads at their ceiling."""
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    by_family: dict[str, list] = {}
    for pt in state["meta"]["plan"]["points"]:
        if pt["key"] in state["ranks"]:
            by_family.setdefault(pt["family"], []).append((pt, state["ranks"][pt["key"]]))
    for name, pts in by_family.items():
        xs = [pt["non_embedding_parameters"] for pt, _ in pts]
        (line,) = axes[0].plot(xs, [r["logit_rank"] for _, r in pts], "o-", label=f"{name}: mean logit rank")
        axes[0].plot(xs, [pt["head_dim"] for pt, _ in pts], "--", color=line.get_color(), alpha=0.6)
        axes[1].plot(xs, [100 * r["at_ceiling"] for _, r in pts], "o-", color=line.get_color(), label=name)
    axes[0].set_ylabel("numerical logit rank (dashed: d_p)")
    axes[1].set_ylabel("heads at their rank ceiling (%)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("non-embedding parameters N")
        ax.legend(fontsize=8)
    fig.suptitle(state["meta"].get("description", "")[:120], fontsize=8)
    save_figure(fig, path)


def plot(state: dict, path: Path) -> None:
    """Held-out loss against N and against training FLOPs (log x): each family's seeds, mean, fitted power law
    and the band of its per-seed fits."""
    import numpy as np

    families = summarise(state)
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for ax, axis, key, label in (
        (axes[0], "parameters", "non_embedding_parameters", "non-embedding parameters N"),
        (axes[1], "flops", "flops", "training FLOPs C"),
    ):
        for name, f in families.items():
            xs = [pt[key] for pt in f["points"]]
            (line,) = ax.plot(xs, [pt["loss"][0] for pt in f["points"]], "o", label=name)
            for pt in f["points"]:
                ax.plot([pt[key]] * len(pt["losses"]), pt["losses"], ".", color=line.get_color(), alpha=0.4)
            fit = f.get(f"fit_{axis}")
            if fit:
                grid = np.geomspace(min(xs), max(xs), 50)
                ax.plot(grid, fit["a"] * grid ** (-fit["b"]), "-", color=line.get_color())
                if len(fit["per_seed"]) >= 2:
                    curves = np.array([s["a"] * grid ** (-s["b"]) for s in fit["per_seed"]])
                    ax.fill_between(grid, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.15)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out loss (nats/token)")
        ax.legend()
    fig.suptitle(state["meta"].get("description", "")[:120], fontsize=8)
    save_figure(fig, path)
