"""`fixedhead farthest-point`: the low-rank bottleneck in *trained* models, on a CPU in minutes.

The task (:mod:`fixedhead.data.synthetic`): sets of N points on the unit sphere in R^d; the target
of point i is the point x_j with the smallest ⟨U x_i, U x_j⟩ for a fixed U ∈ R^{r×d} with
orthonormal rows, so the logit a head needs, −x_iᵀ UᵀU x_j, has rank r. A head's logit rank is at
most its size d_p (paper Section 3) and more small heads do not help (Theorem 2): a one-layer model
should learn the task iff d_p ≥ r, whatever the number of heads h.

The grid trains the set model (:mod:`~fixedhead.studies.farthest_point.set_attention`) over (r, d_p) at
d = 32, h = 8 (d_p = 4 is the standard d/h), plus a "more heads" row: d_p = 4 with h = 8..64 at r = 16;
each seed is its own task instance (U), initialisation and data stream. Besides ``report.md`` it writes
``results.csv``, ``heatmap.png``, ``more_heads.png`` and ``learning_curves.png``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ...checks import check_fields
from ...data.synthetic import FarthestPointTask
from ...plotting import pyplot, save_figure
from ..kit import core, render
from ..kit.learning_rate import (
    later_seed_needs,
    parse_rates,
    plot_learning_rates,
    point_rate,
    rule,
    selection_markdown,
    selection_record,
)
from ..kit.stats import FAILS_BELOW, SUCCEEDS_AT, mean_std, pm_of, threshold_verdict
from ..kit.study import Point, Study
from .set_attention import Cell, FarthestPointRecipe, SetAttentionModel, attention_free_reference, train_cell


@dataclass(frozen=True)
class FarthestPointOptions:
    """The grid over (rank, head_dim) at ``grid_heads`` heads, plus a row of more heads of size
    ``more_heads_head_dim`` at ``more_heads_rank``; dimension d, set size N, seeds, the rate grid and the
    recipe (the defaults: the committed grid)."""

    dim: int = field(default=32, metadata={"check": "positive"})
    """d, the dimension of the points"""
    num_points: int = field(default=16, metadata={"check": "positive"})
    """N, the points per set"""
    ranks: tuple[int, ...] = field(
        default=(4, 8, 16, 32), metadata={"check": "positive", "nonempty": True, "distinct": True}
    )
    """the grid's ranks r of the needed logit"""
    head_dims: tuple[int, ...] = field(
        default=(4, 8, 16, 32), metadata={"check": "positive", "nonempty": True, "distinct": True}
    )
    """the grid's head sizes d_p"""
    grid_heads: int = field(default=8, metadata={"check": "positive"})
    """h, the heads of every grid cell"""
    more_heads_rank: int = field(default=16, metadata={"check": "positive"})
    """the rank r of the more-heads row"""
    more_heads_head_dim: int = field(default=4, metadata={"check": "positive"})
    """the head size d_p of the more-heads row"""
    more_heads: tuple[int, ...] = field(
        default=(8, 16, 32, 64), metadata={"check": "positive", "nonempty": True, "distinct": True}
    )
    """the head counts h of the more-heads row"""
    seeds: tuple[int, ...] = field(
        default=(0, 1, 2), metadata={"check": "non_negative", "nonempty": True, "distinct": True}
    )
    """seeds (each a task instance U, an initialisation and a data stream), in this order"""
    learning_rates: tuple[float, ...] = ()
    """a grid each cell chooses its rate from with the first seed, on the learning-curve sets (empty: every
    cell at the recipe's rate)"""
    max_extensions: int = field(default=3, metadata={"check": "non_negative"})
    """how often the rate grid grows past an edge"""
    recipe: FarthestPointRecipe = field(default_factory=FarthestPointRecipe)
    """the training recipe every cell gets"""

    def __post_init__(self):
        check_fields(self)
        if self.learning_rates:
            parse_rates(self.learning_rates)  # a grid of >= 2 positive rates, named when not
        if self.recipe.curve_points > self.recipe.steps:
            raise ValueError(
                f"curve_points = {self.recipe.curve_points} is more than steps = {self.recipe.steps}: pass "
                "--curve-points N with N <= --steps"
            )

    @property
    def description(self) -> str:
        """What the grid is, written from the fields."""
        d, h = self.dim, self.grid_heads
        return (
            f"d = {d}, N = {self.num_points} points per set; grid r ∈ {_set(self.ranks)} × d_p ∈ "
            f"{_set(self.head_dims)} at h = {h} (d_p = {d // h} = d/h is the standard head); more heads: d_p = "
            f"{self.more_heads_head_dim} with h = {', '.join(map(str, self.more_heads))} at r = "
            f"{self.more_heads_rank}; {self.recipe.steps} steps"
        )

    def cells(self) -> list[Cell]:
        """Grid cells, then the more-heads cells not already in the grid (no cell twice)."""
        grid = [Cell(r, dp, self.grid_heads) for r in self.ranks for dp in self.head_dims]
        more = [Cell(self.more_heads_rank, self.more_heads_head_dim, h) for h in self.more_heads]
        return list(dict.fromkeys(grid + more))


def _set(values) -> str:
    return "{" + ", ".join(map(str, values)) + "}"


QUICK = FarthestPointOptions(
    dim=8,
    num_points=8,
    ranks=(2, 4),
    head_dims=(2, 4),
    grid_heads=4,
    more_heads_rank=4,
    more_heads_head_dim=2,
    more_heads=(4, 8),
    seeds=(0,),
    recipe=FarthestPointRecipe(steps=40, batch_size=32, curve_points=4, curve_sets=64, eval_sets=256),
)


# ------------------------------------------------------------------------------------ runner
def settings_record(o: FarthestPointOptions) -> dict:
    """The task sizes and recipe (through JSON: tuples become lists), as the report and results read them."""
    return json.loads(json.dumps({"dim": o.dim, "num_points": o.num_points, "recipe": asdict(o.recipe)}))


def rate_selection(o: FarthestPointOptions) -> dict:
    """The learning-rate record the report states (:func:`~fixedhead.studies.kit.learning_rate.selection_record`)."""
    return selection_record(
        parse_rates(o.learning_rates),
        o.max_extensions,
        seed=o.seeds[0],
        rule_text=rule("cell", "validation MSE × d"),
        validation=f"the final MSE × d on the {o.recipe.curve_sets} learning-curve sets, held-out sets "
        f"apart from the {o.recipe.eval_sets} the results are scored on",
        unit="MSE × d on the validation sets",
    )


OUTPUT_FILES = ("results.csv", "heatmap.png", "more_heads.png", "learning_curves.png", "learning_rates.png")


def state_of(o: FarthestPointOptions, results, meta: dict | None = None) -> dict:
    """What the report and plots read: ``meta``, ``references`` (per rank), ``runs`` (``{run key: run}``)
    and, with a rate grid, ``tuning`` (per cell) and ``lr_grid``."""
    results = list(results)
    runs = {core.run_key(r["run"]["key"], seed=r["run"]["seed"]): r["run"] for r in results}
    references = {}
    for r in results:
        if "reference" in r:
            references[str(r["run"]["rank"])] = r["reference"]
    meta = {
        **(meta or {}),
        "settings": settings_record(o),
        "seeds": list(o.seeds),
        "cells": [asdict(c) for c in o.cells()],
        "grid": {"ranks": list(o.ranks), "head_dims": list(o.head_dims), "heads": o.grid_heads},
        "more_heads": {"rank": o.more_heads_rank, "head_dim": o.more_heads_head_dim, "heads": list(o.more_heads)},
        "rule": {"succeeds_at": SUCCEEDS_AT, "fails_below": FAILS_BELOW},
        "accelerator": None,  # the grid trains on the CPU even where a GPU is present
    }
    state = {"meta": meta, "references": dict(sorted(references.items(), key=lambda kv: int(kv[0]))), "runs": runs}
    if o.learning_rates:
        meta["learning_rate_selection"] = rate_selection(o)
        state["tuning"] = {r["run"]["key"]: r["tuning"] for r in results if "tuning" in r}
        state["lr_grid"] = {k: v for r in results for k, v in r.get("lr_grid", {}).items()}
    return state


# ----------------------------------------------------------------------------------- outputs
def _runs_of(state: dict, rank: int, head_dim: int, num_heads: int) -> list[dict]:
    key = Cell(rank, head_dim, num_heads).key
    return sorted(
        (r for r in state["runs"].values() if r["key"] == key and r["seed"] in state["meta"]["seeds"]),
        key=lambda r: r["seed"],
    )


def _grid_runs(state: dict) -> dict[tuple[int, int], list[dict]]:
    g = state["meta"]["grid"]
    return {(r, dp): _runs_of(state, r, dp, g["heads"]) for r in g["ranks"] for dp in g["head_dims"]}


def _more_heads_runs(state: dict) -> dict[int, list[dict]]:
    mh = state["meta"]["more_heads"]
    return {h: _runs_of(state, mh["rank"], mh["head_dim"], h) for h in mh["heads"]}


def verdicts(state: dict) -> dict:
    """Each grid cell's and each more-heads cell's verdict (the study's summary)."""
    grid, g = _grid_runs(state), state["meta"]["grid"]
    return {
        "grid": [
            {"rank": r, "head_dim": dp, "verdict": _cell_summary(grid[(r, dp)])[2]}
            for r in g["ranks"]
            for dp in g["head_dims"]
        ],
        "more_heads": [{"num_heads": h, "verdict": _cell_summary(rs)[2]} for h, rs in _more_heads_runs(state).items()],
    }


def _cell_summary(runs: list[dict]) -> tuple[str, str, str]:
    """A cell's hit rate and MSE × d (mean ± std over seeds) and its verdict."""
    hits = [x["hit_rate"] for x in runs]
    return pm_of(hits, 3), pm_of([x["mse"] for x in runs], 3), threshold_verdict(hits)


def write_outputs(state: dict, out: Path) -> None:
    """``results.csv`` (one row per run) and the plots in ``out`` (the kit writes ``report.md``)."""
    keys = ["key", "rank", "head_dim", "num_heads", "seed", "dim", "num_points", "parameters"]
    keys += ["learning_rate"] if state.get("tuning") else []
    keys += ["mse", "hit_rate", "nearest_rate", "train_seconds"]
    render.write_csv(out / "results.csv", keys, [state["runs"][k] for k in sorted(state["runs"])])
    plot_heatmap(state, out / "heatmap.png")
    plot_more_heads(state, out / "more_heads.png")
    plot_learning_curves(state, out / "learning_curves.png")
    if state.get("tuning"):
        plot_learning_rates(
            {"models": state["tuning"]},
            out / "learning_rates.png",
            ylabel="validation MSE × d",
            title="each cell's rate, chosen on the learning-curve sets",
        )


def plot_heatmap(state: dict, path: Path) -> None:
    """Hit rate and MSE × d (means over seeds) over (r, d_p), with the line d_p = r drawn."""
    plt = pyplot()
    g = state["meta"]["grid"]
    runs = _grid_runs(state)
    ranks, dps = g["ranks"], g["head_dims"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    titles = {"hit_rate": "hit rate (↑; output is x_j*)", "mse": "MSE × d (↓; 0 perfect, 1 = predict 0)"}
    for ax, what, cmap in ((axes[0], "hit_rate", "viridis"), (axes[1], "mse", "magma_r")):
        stats = [[mean_std([x[what] for x in runs[(r, dp)]]) for dp in dps] for r in ranks]
        means = [[m for m, _ in row] for row in stats]
        im = ax.imshow(means, origin="lower", cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        for i, row in enumerate(stats):
            for j, (m, s) in enumerate(row):
                if math.isfinite(m):
                    txt = f"{m:.2f}" + (f"\n±{s:.2f}" if math.isfinite(s) else "")
                    dark = (m > 0.55) if what == "hit_rate" else (m < 0.45)
                    ax.text(j, i, txt, ha="center", va="center", fontsize=8, color="black" if dark else "white")
        # the predicted boundary: cells right of this staircase have d_p >= r
        xs, ys = [], []
        for i, r in enumerate(ranks):
            j = next((j for j, dp in enumerate(dps) if dp >= r), len(dps))
            xs += [j - 0.5, j - 0.5]
            ys += [i - 0.5, i + 0.5]
        ax.plot(xs, ys, color="red", linewidth=2.5, label="predicted boundary (d_p ≥ r to its right)")
        diag = [(j, i) for i, r in enumerate(ranks) for j, dp in enumerate(dps) if dp == r]
        if diag:
            ax.plot(*zip(*diag, strict=True), color="red", linestyle=":", linewidth=1.5, label="d_p = r")
        ax.set_xticks(range(len(dps)), [str(x) for x in dps])
        ax.set_yticks(range(len(ranks)), [str(x) for x in ranks])
        ax.set_xlabel("head size d_p")
        ax.set_ylabel("rank r of the needed logit")
        ax.set_title(titles[what], fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046)
    n = len(state["meta"]["seeds"])
    fig.suptitle(
        f"one trained layer, d = {state['meta']['settings']['dim']}, h = {g['heads']}, mean (± std) of "
        f"{n} seed{'s' if n > 1 else ''}; prediction: succeeds iff d_p ≥ r",
        fontsize=10,
    )
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_more_heads(state: dict, path: Path) -> None:
    """Hit rate and MSE × d against the number of heads of the more-heads row (mean ± std)."""
    plt = pyplot()
    mh = state["meta"]["more_heads"]
    fig, ax = plt.subplots(figsize=(6, 4))
    runs = {h: rs for h, rs in _more_heads_runs(state).items() if rs}
    hs = list(runs)
    for what, marker, label in (("hit_rate", "o", "hit rate"), ("mse", "s", "MSE × d")):
        stats = [mean_std([x[what] for x in rs]) for rs in runs.values()]
        std = [s if math.isfinite(s) else 0.0 for _, s in stats]
        ax.errorbar(hs, [m for m, _ in stats], yerr=std, marker=marker, capsize=3, label=label)
    if ref := state["references"].get(str(mh["rank"])):
        ax.axhline(ref["mse"], color="gray", ls="--", lw=1, label=f"MSE × d without attention ({ref['mse']:.2f})")
    ax.set_xscale("log", base=2)
    render.plain_ticks(ax, hs)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("number of heads h")
    ax.set_title(f"more heads of size d_p = {mh['head_dim']} at r = {mh['rank']}", fontsize=10)
    save_figure(fig, path, [ax])


def plot_learning_curves(state: dict, path: Path) -> None:
    """Held-out MSE × d against step (mean over seeds), one panel per rank, one line per d_p, plus
    the more-heads row."""
    plt = pyplot()
    g, mh, grid = state["meta"]["grid"], state["meta"]["more_heads"], _grid_runs(state)
    panels = [  # (title, rank, {line label: runs})
        (
            f"r = {r}, h = {g['heads']}",
            r,
            {f"d_p = {dp}{' (≥ r)' if dp >= r else ''}": grid[(r, dp)] for dp in g["head_dims"]},
        )
        for r in g["ranks"]
    ]
    more = {f"h = {h}": rs for h, rs in _more_heads_runs(state).items()}
    panels.append((f"r = {mh['rank']}, d_p = {mh['head_dim']}", mh["rank"], more))
    cols = 3 if len(panels) > 4 else len(panels)
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), sharey=True, squeeze=False)
    flat = [a for row in axes for a in row]
    for ax, (title, r, lines) in zip(flat, panels, strict=False):  # more axes than panels: the rest are hidden
        for label, rs in lines.items():
            if not rs:
                continue
            steps = [c[0] for c in rs[0]["curve"]]
            mean = [sum(run["curve"][k][1] for run in rs) / len(rs) for k in range(len(steps))]
            ax.plot(steps, mean, label=label)
        if ref := state["references"].get(str(r)):
            ax.axhline(ref["mse"], color="gray", linestyle="--", linewidth=1, label="no attention")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.1)
        ax.legend(fontsize=7)
    for ax in flat[len(panels) :]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("held-out MSE × d")
    save_figure(fig, path, flat[: len(panels)], legend=False)


def report_markdown(state: dict) -> str:
    """The markdown report: what was run, the rule, the grid with verdicts, the more-heads row."""
    meta, refs, settings = state["meta"], state["references"], state["meta"]["settings"]
    g, mh, rec = meta["grid"], meta["more_heads"], settings["recipe"]
    tuned, runs = bool(state.get("tuning")), _grid_runs(state)
    grid = []
    for r in g["ranks"]:
        for dp in g["head_dims"]:
            hit, mse, v = _cell_summary(runs[(r, dp)])
            ok = "–" if v == "not run" else ("yes" if v == ("succeeds" if dp >= r else "fails") else "no")
            grid.append([r, dp, "yes" if dp >= r else "no", hit, mse, f"**{v}**", ok])
    agree, judged = sum(row[-1] == "yes" for row in grid), sum(row[-1] != "–" for row in grid)
    more = [[h, h * mh["head_dim"], *_cell_summary(rs)] for h, rs in _more_heads_runs(state).items()]
    for row in more:
        row[-1] = f"**{row[-1]}**"
    every = [{**x, "point": k} for k, x in state["runs"].items()]
    every.sort(key=lambda x: (x["rank"], x["head_dim"], x["num_heads"], x["seed"]))
    rate = "each cell's own (below)" if tuned else rec["learning_rate"]
    setup = [
        f"- task: N = {settings['num_points']} points uniform on the unit sphere in R^{settings['dim']}; target of "
        "x_i is x_j with j = argmin_j ⟨U x_i, U x_j⟩, U ∈ R^(r×d) with orthonormal rows (UᵀU projects onto a random "
        "r-dimensional subspace); fresh sets every step",
        f"- model: one post-LN encoder block (this project's MultiHeadAttention, h heads of size d_p, no positions; "
        f"GELU feed-forward {rec['intermediate_size'] or '4d'}), linear read-out; logits q·k/√d_p × "
        f"{rec['logit_scale']}; points fed × {rec['input_scale']}",
        f"- recipe, the same for every cell{' but its rate' if tuned else ''}: {rec['steps']} steps × "
        f"{rec['batch_size']} sets, AdamW lr {rate} (betas {tuple(rec['betas'])}, weight decay "
        f"{rec['weight_decay']}), warm-up {rec['warmup_ratio']:.0%} then cosine decay to 0; loss MSE × d",
        f"- seeds {meta['seeds']}: seed s is the task instance (U), the initialisation and the data stream; final "
        f"metrics on {rec['eval_sets']} held-out sets ({rec['eval_sets'] * settings['num_points']:,} points) per run",
    ]
    metrics = (
        "**Metrics.** MSE × d = ‖output − x_j*‖² per point (predicting 0 scores 1). Hit rate = fraction of points "
        "whose output is within half the gap around x_j*: ‖output − x_j*‖ < ½ min_(k≠j*) ‖x_k − x_j*‖, so it is "
        'nearer to x_j* than to any other point, with a margin. (The plain "nearest point is x_j*" rate is in '
        "`results.csv` but is not used: the attention-free map x_i ↦ −UᵀU x_i scores 1 on it.)"
    )
    rule = (
        f"**Verdict rule** (fixed before the run): a cell *succeeds* if every seed's hit rate is ≥ {SUCCEEDS_AT}, "
        f"*fails* if every seed's is < {FAILS_BELOW}, and is *in between* otherwise."
    )
    reference = "**Reference without attention** (least-squares affine map of x_i alone, seed-0 task): " + "; ".join(
        f"r = {r}: MSE × d {v['mse']:.3f}, hit rate {v['hit_rate']:.3f}, nearest-point rate {v['nearest_rate']:.3f}"
        for r, v in refs.items()
    )
    every_run = [
        ("run", "`{point}`"),
        ("parameters", "{parameters:,}"),
        *([("lr", "{learning_rate:g}")] if tuned else []),
        *((h, f"{{{k}:.3f}}") for h, k in (("hit rate", "hit_rate"), ("MSE × d", "mse"))),
        ("nearest-point rate", "{nearest_rate:.3f}"),
        ("train s", "{train_seconds:.0f}"),
    ]
    Section, Table, Figure = render.Section, render.Table, render.Figure
    return render.markdown(
        render.Report(
            "Farthest point under a rank-r projection: does head size matter when a model learns?",
            [f"{meta['description']}.", Figure("heatmap.png", "hit rate and MSE over (r, d_p)")],
            [
                render.what_was_run(meta, setup, metrics, rule, reference + "."),
                tuned and selection_markdown(meta["learning_rate_selection"], state["tuning"], "cell"),
                Section(
                    f"The grid: h = {g['heads']}, d = {settings['dim']} (mean ± std over seeds)",
                    [
                        Table(["r", "d_p", "d_p ≥ r", "hit rate", "MSE × d", "verdict", "agrees with d_p ≥ r?"], grid),
                        f"{agree} of {judged} grid cells have the verdict the prediction (succeeds iff d_p ≥ r) names.",
                    ],
                ),
                Section(
                    f"More heads of a too-small size: d_p = {mh['head_dim']}, r = {mh['rank']}",
                    [
                        Figure("more_heads.png", "more heads"),
                        Table(["h", "h·d_p", "hit rate", "MSE × d", "verdict"], more),
                    ],
                ),
                Section("Learning curves", [Figure("learning_curves.png", "learning curves")]),
                Section("Every run", [Table(every_run, every)]),
            ],
        )
    )


class FarthestPointStudy(Study):
    """One point per (cell, seed), seed-major. With a rate grid a cell's first seed keeps the best rate on
    the learning-curve sets; its other seeds train at that rate."""

    name = "farthest-point"
    help = (
        "the bottleneck in trained models: a synthetic task whose needed rank r is a knob, trained over (r, "
        "d_p) and heads, with seeds (minutes on a CPU)"
    )
    removed = {"--preset": "--quick for the seconds-sized grid (the full grid needs no option)"}
    Options = FarthestPointOptions
    quick = QUICK
    files = OUTPUT_FILES
    # the grid's axes only choose which cells exist: each cell's key holds its rank, head size and heads
    points_only = ("seeds", "ranks", "head_dims", "grid_heads", "more_heads_rank", "more_heads_head_dim", "more_heads")
    summarise = staticmethod(verdicts)
    report = staticmethod(report_markdown)
    write_files = staticmethod(write_outputs)

    def state(self, o, results, record=None):
        return state_of(o, results, record and record["meta"])

    def describe(self, o):
        return o.description

    def check(self, o):
        for c in o.cells():  # sizes the task or model refuse, before anything is written
            FarthestPointTask(o.dim, c.rank, o.num_points)
            SetAttentionModel(
                o.dim, c.num_heads, c.head_dim, o.recipe.intermediate_size, o.recipe.logit_scale, o.recipe.input_scale
            )

    def first_seed(self, o):
        return o.seeds[0] if o.learning_rates else None

    def plan(self, o):
        first = o.seeds[0]  # with a rate grid, a later seed trains at the rate its first seed chose

        def needs(c, s):
            return later_seed_needs(o.learning_rates, s, first, core.run_key(c.key, seed=first))

        return [Point(core.run_key(c.key, seed=s), (c, s), needs(c, s)) for c, s in core.seed_major(o.cells(), o.seeds)]

    def plan_record(self, o):
        return {
            "pairing": "none: seed s is the task instance, the initialisation and the data stream of every cell",
            "rule": {"succeeds_at": SUCCEEDS_AT, "fails_below": FAILS_BELOW},
        }

    def run(self, o, point, folder, done, progress):
        cell, seed = point.spec

        def train(lr: float) -> dict:
            recipe = replace(o.recipe, learning_rate=lr)
            task = FarthestPointTask(o.dim, cell.rank, o.num_points, seed=seed)
            return {**train_cell(task, cell, recipe, seed, progress), "learning_rate": lr}

        first = seed == o.seeds[0]
        # the rank's attention-free reference (seed-0 task), with each cell's first seed
        task0 = FarthestPointTask(o.dim, cell.rank, o.num_points, seed=0)
        reference = {"reference": attention_free_reference(task0)} if first else {}
        runs = {}

        def train_at(lr: float) -> dict:
            run = runs[lr] = train(lr)
            if progress and o.learning_rates and first:
                print(f"{cell.key} lr {lr:g}: validation mse×d {run['curve'][-1][1]:.3f}", flush=True)
            return run

        previous = done.get(core.run_key(cell.key, seed=o.seeds[0]))
        grid = parse_rates(o.learning_rates) if o.learning_rates else None
        # a cell's validation score: its final MSE × d on the learning-curve sets
        rate = point_rate(
            train_at,
            grid,
            seed,
            o.seeds[0],
            o.recipe.learning_rate,
            previous,
            o.max_extensions,
            score=lambda run: run["curve"][-1][1],
        )
        run = runs[rate["learning_rate"]]
        if "tuning" not in rate:
            return {"run": run, **reference, "train_seconds": run["train_seconds"]}
        return {
            "run": run,
            "tuning": rate["tuning"],
            "lr_grid": {core.run_key(cell.key, lr): r for lr, r in runs.items()},
            **reference,
            "train_seconds": round(sum(r["train_seconds"] for r in runs.values()), 1),
        }
