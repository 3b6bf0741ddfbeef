"""The rank intervention's known-answer check (``fixedhead known-rank``).

A farthest-point task of rank r needs attention logits of rank r (``docs/results/synthetic``: all 16 cells
follow d_p ≥ r), so a trained model whose logits :mod:`fixedhead.diagnostics.intervention` cuts to rank k must keep
solving it for every k ≥ r and fail below r, whatever its d_p: the answer is known in advance.

The check trains the farthest-point model at rank r for several d_p ≥ r and seeds and scores it on its
held-out sets with the logits cut to k = 1 .. min(d_p, N − 1). It passes when both readings of the needed
rank are r for every model: the smallest k from which the hit rate stays ≥
:data:`~fixedhead.studies.kit.stats.SUCCEEDS_AT`, and the smallest k from which MSE × d stays within the
seed spread of the full-rank value (:func:`fixedhead.diagnostics.intervention.needed_rank`, as ``fixedhead
rank-intervention`` reads text models).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from ...checks import check_fields, positive_int
from ...data.synthetic import FarthestPointTask
from ...diagnostics.intervention import attention_modules, needed_rank, truncated_logits
from ..kit import render
from ..kit.core import run_key
from ..kit.stats import SUCCEEDS_AT
from ..kit.study import Point, Study
from .set_attention import Cell, FarthestPointRecipe, evaluate, train_cell


@dataclass(frozen=True)
class KnownRankCheck:
    """What the check trains: the farthest-point task of rank ``rank`` (d = ``dim``, N = ``num_points``)
    and one model per (head size in ``head_dims``, seed) with ``num_heads`` heads and ``recipe``."""

    rank: int = field(default=8, metadata={"check": "positive"})
    """r, the rank the farthest-point task needs (every model must need it)"""
    head_dims: tuple[int, ...] = field(default=(8, 16, 32), metadata={"distinct": True})
    """the head sizes d_p trained (each >= r)"""
    num_heads: int = field(default=8, metadata={"check": "positive"})
    """h, heads per model"""
    dim: int = field(default=32, metadata={"check": "positive"})
    """d, the dimension of the points"""
    num_points: int = field(default=16, metadata={"check": "positive"})
    """N, points per set"""
    seeds: tuple[int, ...] = field(
        default=(0, 1, 2), metadata={"check": "non_negative", "nonempty": True, "distinct": True}
    )
    """seeds, one model per (d_p, seed)"""
    recipe: FarthestPointRecipe = field(default_factory=FarthestPointRecipe)
    """the training recipe (the farthest-point study's)"""

    def __post_init__(self):
        check_fields(self)
        if not self.head_dims or any(positive_int("head_dims", dp) < self.rank for dp in self.head_dims):
            raise ValueError(
                f"head_dims must be sizes >= rank = {self.rank} (the models must learn the task), got {self.head_dims}"
            )
        if self.rank > self.num_points - 1:
            raise ValueError(
                f"rank = {self.rank} needs num_points >= rank + 1 = {self.rank + 1} (logits are cut to k <= N - 1), "
                f"got num_points = {self.num_points}"
            )
        FarthestPointTask(self.dim, self.rank, self.num_points)  # refuses rank > dim, N < 2


QUICK = KnownRankCheck(
    rank=2,
    head_dims=(2, 4),
    num_heads=4,
    dim=8,
    num_points=8,
    seeds=(0,),
    recipe=FarthestPointRecipe(steps=40, batch_size=32, curve_points=4, curve_sets=64, eval_sets=256),
)


def rank_sweep(model, sets, ranks) -> dict[int, dict[str, float]]:
    """The farthest-point metrics (:func:`~fixedhead.studies.farthest_point.set_attention.evaluate`) of ``model`` on
    ``sets`` with its logits cut to each rank k in ``ranks``: ``{k: {"mse", "hit_rate", "nearest_rate"}}``.

    From k = min(d_p, N − 1) on the cut changes nothing (the row-centred N × N logits have no higher rank): those k
    read the model's own metrics, as :func:`~fixedhead.diagnostics.intervention.rank_curve` reads its oracle's, not
    the cut's float rounding of them, which a band of 0 (one seed) would read as outside."""
    modules = attention_modules(model, sets[0])
    exact = min(max(m.qk_head_dim for m in modules), sets[0].shape[1] - 1)
    own = evaluate(model, sets)
    out = {}
    for k in ranks:
        if k >= exact:
            out[k] = dict(own)
            continue
        with truncated_logits(model, k, modules=modules):
            out[k] = evaluate(model, sets)
    return out


class KnownRankStudy(Study):
    """The check on the kit (:mod:`fixedhead.studies.kit.study`): one point per (d_p, seed), a trained model
    scored with its logits cut to every k; the summary reads each model's needed rank both ways."""

    name = "known-rank"
    help = "the rank intervention's known-answer check: farthest-point models that need logit rank r, cut to rank k"
    Options = KnownRankCheck
    quick = QUICK
    files = ("known_rank.csv", "known_rank.png")
    points_only = ("head_dims", "seeds")

    def plan(self, check):
        return [Point(run_key(f"dp{dp}", seed=s), (dp, s)) for dp in check.head_dims for s in check.seeds]

    def plan_record(self, check):
        return {"expected": f"every model needs rank r = {check.rank} by both readings"}

    def run(self, check, point, folder, done, progress):
        dp, seed = point.spec
        task = FarthestPointTask(check.dim, check.rank, check.num_points, seed=seed)
        cell = Cell(check.rank, dp, check.num_heads)
        result, model = train_cell(task, cell, check.recipe, seed, progress=progress, return_model=True)
        sets = task.sample(check.recipe.eval_sets, torch.Generator().manual_seed(seed + 30_000), task.projection)
        with torch.no_grad():
            ranks = rank_sweep(model, sets, range(1, min(dp, check.num_points - 1) + 1))
        del result["curve"]
        return result | {"ranks": ranks}

    def summarise(self, state):
        """``{"models": each result with its ``band``, ``needed_by_mse`` and ``needed_by_hit_rate``,
        "passed": both readings equal r for every model}``."""
        check = state["options"]
        models = [m | {"ranks": {int(k): v for k, v in m["ranks"].items()}} for m in state["results"]]
        for m in models:
            fulls = [o["mse"] for o in models if o["head_dim"] == m["head_dim"]]
            mean = sum(fulls) / len(fulls)
            m["band"] = math.sqrt(sum((f - mean) ** 2 for f in fulls) / (len(fulls) - 1)) if len(fulls) > 1 else 0.0
            m["needed_by_mse"] = needed_rank({k: v["mse"] for k, v in m["ranks"].items()}, m["mse"], m["band"])
            m["needed_by_hit_rate"] = needed_rank({k: -v["hit_rate"] for k, v in m["ranks"].items()}, -SUCCEEDS_AT, 0.0)
        passed = bool(models) and all(m["needed_by_mse"] == check.rank == m["needed_by_hit_rate"] for m in models)
        return {"models": models, "passed": passed}

    def report(self, state):
        return report_markdown(state, state["options"])

    def write_files(self, state, folder):
        from ...runs import write_text_atomic

        lines = ["head_dim,seed,k,mse,hit_rate,nearest_rate"]
        for m in state["summary"]["models"]:
            lines += [
                f"{m['head_dim']},{m['seed']},{k},{v['mse']:.6f},{v['hit_rate']:.6f},{v['nearest_rate']:.6f}"
                for k, v in m["ranks"].items()
            ]
        write_text_atomic(folder / "known_rank.csv", "\n".join(lines) + "\n")
        plot_known_rank(state, state["options"], folder / "known_rank.png")


def report_markdown(record: dict, check: KnownRankCheck) -> str:
    """The check's report: one row per model, the two readings of its needed rank, and the verdict."""
    c, r, models = asdict(check), check.rank, record["summary"]["models"]

    def cells(m: dict, k: int) -> str:  # MSE × d / hit rate at rank k (full rank: k None)
        v = m if k is None else {int(j): x for j, x in m["ranks"].items()}.get(k)
        return f"{v['mse']:.3f} / {v['hit_rate']:.3f}" if v else "–"

    cuts = {r - 1: f"k = r − 1 = {r - 1}", r: f"k = r = {r}"} if r > 1 else {r: f"k = r = {r}"}
    cuts.setdefault(1, "k = 1")
    columns = [
        ("d_p", "{head_dim}"),
        ("seed", "{seed}"),
        ("full rank", lambda m: cells(m, None)),
        # the cuts just below r, at r, and to one dimension, each once (at r = 2, r − 1 is 1; at r = 1, r is)
        *((name, lambda m, k=k: cells(m, k)) for k, name in cuts.items()),
        (f"needed rank (hit rate ≥ {SUCCEEDS_AT})", lambda m: _or_dash(m["needed_by_hit_rate"])),
        (
            "needed rank (MSE × d within the seed band)",
            lambda m: f"{_or_dash(m['needed_by_mse'])} (band {m['band']:.4f})",
        ),
    ]
    counts = {what: sum(m[f"needed_by_{what}"] == r for m in models) for what in ("mse", "hit_rate")}
    verdict = "**passed**" if record["summary"]["passed"] else "**failed**"
    return render.markdown(
        render.Report(
            "The rank intervention's known-answer check (farthest-point models of rank r)",
            [
                f"Task: d = {c['dim']}, N = {c['num_points']} points, rank r = {r}; models with h = {c['num_heads']} "
                f"heads of size d_p ∈ {{{', '.join(map(str, c['head_dims']))}}}, seeds {list(c['seeds'])}, "
                f"{c['recipe']['steps']} steps (the farthest-point study's recipe). Each model's logits cut to rank "
                f"k (`fixedhead.diagnostics.intervention`) and scored on its {c['recipe']['eval_sets']} held-out "
                "sets. Expected: "
                f"every model needs rank r = {r}, whatever its d_p. Cells: MSE × d / hit rate.",
                f"Command: `{record['meta']['command']}`",
                render.Table(columns, models),
                f"Check {verdict}: the MSE × d reading is r = {r} for {counts['mse']} of {len(models)} models, the "
                f"hit-rate reading for {counts['hit_rate']} of {len(models)} (both must be r for every model).",
            ],
        )
    )


def _or_dash(value) -> str:
    return "–" if value is None else str(value)


def plot_known_rank(record: dict, check: KnownRankCheck, path) -> None:
    """MSE × d and hit rate against k, one line per model (colour: d_p), the task's rank r marked."""
    from ...plotting import pyplot, save_figure

    plt = pyplot()
    r, dps = check.rank, list(check.head_dims)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for m in record["summary"]["models"]:
        ks = sorted(int(k) for k in m["ranks"])
        colour = f"C{dps.index(m['head_dim'])}"
        label = f"d_p = {m['head_dim']}" if m["seed"] == check.seeds[0] else None
        for ax, what in zip(axes, ("mse", "hit_rate"), strict=True):
            values = [m["ranks"].get(k, m["ranks"].get(str(k)))[what] for k in ks]
            ax.plot(ks, values, marker=".", color=colour, alpha=0.7, label=label)
    for ax, what in zip(axes, ("MSE × d (held-out sets)", "hit rate"), strict=True):
        ax.axvline(r, color="grey", ls=":", label=f"task rank r = {r}")
        ax.set_xlabel("logit rank k")
        ax.set_ylabel(what)
    axes[1].axhline(SUCCEEDS_AT, color="grey", ls="--", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle("rank intervention on farthest-point models of known rank", fontsize=10)
    save_figure(fig, path, axes)
