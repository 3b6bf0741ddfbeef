"""`fixedhead farthest-point`: the low-rank bottleneck in *trained* models, on a CPU in minutes.

The task (:mod:`fixedhead.data.synthetic`): sets of N points on the unit sphere in R^d; the target
of point i is the point x_j with the smallest ⟨U x_i, U x_j⟩ for a fixed U ∈ R^{r×d} with
orthonormal rows. The logit a head needs, −x_iᵀ UᵀU x_j, has rank r. Bhojanapalli et al. (ICML
2020, Section 3) bound a head's logit rank by its size d_p; their Theorem 2 says heads of a small
size are not rescued by having more of them. The prediction this experiment tests: a one-layer
model learns the task iff d_p ≥ r, whatever the number of heads h.

The model (:class:`SetAttentionModel`) is one post-LN encoder block around this project's
:class:`fixedhead.model.attention.MultiHeadAttention`, with no positions (the task is a set task), and a
linear read-out. The grid trains it over (r, d_p) at d = 32, h = 8 (d_p = 4 is the standard d/h;
larger d_p are the paper's fixed head size at the same d and h), plus a "more heads" row: d_p = 4
with h = 8..64 at r = 16. Every cell is trained with the same recipe (:class:`SyntheticRecipe`)
and several seeds; each seed is its own task instance (U), initialisation and data stream.

Metrics, on fresh held-out sets:

* ``mse``: squared distance ‖output − x_{j*}‖² averaged over points (= MSE × d, Amsel et al.'s
  scaling): predicting 0 scores exactly 1.
* ``hit_rate``: the fraction of points whose output lies within half the gap around the right
  point, ‖output − x_{j*}‖ < ½ min_{k≠j*} ‖x_k − x_{j*}‖ — so the output is nearer to x_{j*} than
  to any other point, by a margin: it can be read as x_{j*} and as nothing else.
* ``nearest_rate``: the fraction whose *nearest* point is x_{j*}, with no margin. Reported but not
  used for verdicts: it is fooled by a layer that ignores attention — the linear map
  x_i ↦ −UᵀU x_i has inner product −⟨Ux_i, Ux_j⟩ with every x_j, so its nearest point on the sphere
  is exactly j*(i), on every point, without looking at the set.

Outputs in the output folder: ``results.json`` (every run, with its learning curve; written
atomically after every run, so an interrupted grid resumes and reuses finished runs),
``results.csv``, ``heatmap.png``, ``more_heads.png``, ``learning_curves.png`` and ``report.md``
(verdict per cell, stated rule).
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from ..data.synthetic import FarthestPointTask
from ..model.attention import MultiHeadAttention
from ..runs import invocation_commands, load_json_file, write_json_atomic
from .stats import FAILS_BELOW, SUCCEEDS_AT, mean_std, pm_of, threshold_verdict

RESULTS_FILE = "results.json"
_OWN_FILES = {RESULTS_FILE, "results.csv", "heatmap.png", "more_heads.png", "learning_curves.png", "report.md"}


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


# ------------------------------------------------------------------------------------ model
class SetAttentionModel(nn.Module):
    """One post-LN encoder block on a set of points, then a linear read-out; no positions.

    points x ∈ R^{N×d} → h0 = s_in·x → z = LN(h0 + MultiHead(h0)) → y = LN(z + FFN(z))
    → output = y W_rᵀ + b_r ∈ R^{N×d}.
    The block is BERT's (paper Section 2, post-LN, GELU feed-forward of width ``intermediate_size``);
    MultiHead is :class:`fixedhead.model.attention.MultiHeadAttention` with h heads of size d_p (any d_p:
    the paper's fixed head size, Section 4), whose logits q·k/√d_p are multiplied by ``logit_scale``
    (an inverse temperature, the same for every head size).

    Args:
        hidden_size: d, the dimension of the points.
        num_attention_heads: h.
        head_dim: d_p.
        intermediate_size: feed-forward width (None: 4d).
        logit_scale: multiplies the attention logits (> 0).
        input_scale: s_in, multiplies the points before the block (> 0; 1 feeds the unit vectors
            as they are, as Amsel et al. do).

    Raises:
        ValueError: a size that is not a positive int, h·d_p < d (the values could not carry a
            d-dimensional point), or a logit_scale / input_scale that is not a positive finite number.
    """

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        head_dim: int,
        intermediate_size: int | None = None,
        logit_scale: float = 1.0,
        input_scale: float = 1.0,
    ):
        super().__init__()
        d = _positive_int("hidden_size", hidden_size)
        h = _positive_int("num_attention_heads", num_attention_heads)
        dp = _positive_int("head_dim", head_dim)
        if h * dp < d:
            raise ValueError(
                f"num_attention_heads × head_dim = {h} × {dp} = {h * dp} < hidden_size = {d}: "
                f"the values cannot carry a {d}-dimensional point"
            )
        ffn = 4 * d if intermediate_size is None else _positive_int("intermediate_size", intermediate_size)
        for name, v in (("logit_scale", logit_scale), ("input_scale", input_scale)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        self.hidden_size, self.logit_scale, self.input_scale = d, float(logit_scale), float(input_scale)
        self.attention = MultiHeadAttention(d, h, head_dim=dp)
        self.attention.scale = self.logit_scale / math.sqrt(dp)  # the layer's 1/√d_p, times the inverse temperature
        self.norm1 = nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))
        self.norm2 = nn.LayerNorm(d)
        self.readout = nn.Linear(d, d)

    def forward(self, points: torch.Tensor, output_attentions: bool = False):
        """points [batch, N, d] → outputs [batch, N, d] (and, with ``output_attentions``, the
        probabilities [batch, h, query, key], rows summing to 1)."""
        h0 = points * self.input_scale
        a, probs = self.attention(h0, output_attentions=output_attentions)
        z = self.norm1(h0 + a)
        y = self.norm2(z + self.ffn(z))
        out = self.readout(y)
        return (out, probs) if output_attentions else out


# ---------------------------------------------------------------------------------- metrics
def prediction_metrics(
    points: torch.Tensor, targets: torch.Tensor, index: torch.Tensor, outputs: torch.Tensor
) -> dict[str, float]:
    """``mse`` (‖o − x_{j*}‖² per point, i.e. MSE × d), ``hit_rate`` and ``nearest_rate`` (module docstring).

    Args:
        points: [batch, N, d]; targets: [batch, N, d] (= points[index]); index: [batch, N];
            outputs: [batch, N, d].

    Returns:
        A dict of three floats, each a mean over batch × N points.
    """
    err = ((outputs - targets) ** 2).sum(-1)  # [batch, N]
    gaps = torch.cdist(targets, points)  # [batch, N(query), N(point)]
    gaps = gaps.masked_fill(nn.functional.one_hot(index, points.shape[1]).bool(), float("inf"))
    hit = err.sqrt() < 0.5 * gaps.min(-1).values
    nearest = torch.cdist(outputs, points).argmin(-1) == index
    return {
        "mse": err.mean().item(),
        "hit_rate": hit.float().mean().item(),
        "nearest_rate": nearest.float().mean().item(),
    }


@torch.no_grad()
def evaluate(
    model: nn.Module, sets: tuple[torch.Tensor, torch.Tensor, torch.Tensor], chunk: int = 1024
) -> dict[str, float]:
    """:func:`prediction_metrics` of ``model`` on (points, targets, index), in chunks of sets."""
    was_training = model.training
    model.eval()
    x, t, idx = sets
    outs = torch.cat([model(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)])
    model.train(was_training)
    return prediction_metrics(x, t, idx, outs)


def attention_free_reference(task: FarthestPointTask, num_sets: int = 4096, seed: int = 0) -> dict[str, float]:
    """What a layer that ignores the other points can reach: the least-squares affine map
    x_i ↦ W x_i + b fitted to x_{j*(i)} on ``num_sets`` sets, scored on as many fresh ones.

    It is the reference line of the report: below its ``mse`` a model must be using attention.
    Its ``nearest_rate`` is 1 (see the module docstring), its ``hit_rate`` near 0.
    """
    u = task.projection
    fit_x, fit_t, _ = task.sample(num_sets, torch.Generator().manual_seed(seed + 50_000), u)
    a = torch.cat([fit_x.reshape(-1, task.dim), torch.ones(fit_x.numel() // task.dim, 1)], 1).double()
    w = torch.linalg.lstsq(a, fit_t.reshape(-1, task.dim).double()).solution.float()  # [d + 1, d]
    x, t, idx = task.sample(num_sets, torch.Generator().manual_seed(seed + 60_000), u)
    return prediction_metrics(x, t, idx, x @ w[:-1] + w[-1])


# ----------------------------------------------------------------------------------- recipe
@dataclass(frozen=True)
class SyntheticRecipe:
    """The one training recipe every cell gets.

    AdamW (betas 0.9/0.95, as Amsel et al.), linear warm-up for ``warmup_ratio`` of the steps then
    cosine decay to 0; loss = MSE × d on a fresh batch of sets every step; the learning curve is
    measured on ``curve_sets`` fixed held-out sets every ``steps // curve_points`` steps and the
    final metrics on ``eval_sets`` other held-out sets.
    """

    steps: int = 3000
    batch_size: int = 64
    learning_rate: float = 1e-2
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    logit_scale: float = 16.0
    input_scale: float = 1.0
    intermediate_size: int | None = None
    curve_points: int = 20
    curve_sets: int = 256
    eval_sets: int = 4096

    def __post_init__(self):
        for name in ("steps", "batch_size", "curve_points", "curve_sets", "eval_sets"):
            _positive_int(name, getattr(self, name))
        if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        for name in ("logit_scale", "input_scale"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")


@dataclass(frozen=True)
class SyntheticCell:
    """One model of the grid: the task's rank r, the head size d_p and the number of heads h."""

    rank: int
    head_dim: int
    num_heads: int

    @property
    def key(self) -> str:
        return f"r{self.rank}-dp{self.head_dim}-h{self.num_heads}"


@dataclass(frozen=True)
class SyntheticPreset:
    """The grid over (rank, head_dim) at ``grid_heads`` heads, plus a row of more heads of size
    ``more_heads_head_dim`` at ``more_heads_rank``; dimension d, set size N, seeds and recipe."""

    description: str
    dim: int
    num_points: int
    ranks: tuple[int, ...]
    head_dims: tuple[int, ...]
    grid_heads: int
    more_heads_rank: int
    more_heads_head_dim: int
    more_heads: tuple[int, ...]
    seeds: tuple[int, ...]
    recipe: SyntheticRecipe = field(default_factory=SyntheticRecipe)

    def grid_cells(self) -> list[SyntheticCell]:
        return [SyntheticCell(r, dp, self.grid_heads) for r in self.ranks for dp in self.head_dims]

    def more_heads_cells(self) -> list[SyntheticCell]:
        return [SyntheticCell(self.more_heads_rank, self.more_heads_head_dim, h) for h in self.more_heads]

    def cells(self) -> list[SyntheticCell]:
        """Grid cells, then the more-heads cells not already in the grid (no cell twice)."""
        return list(dict.fromkeys(self.grid_cells() + self.more_heads_cells()))


def _default_preset() -> SyntheticPreset:
    return SyntheticPreset(
        description="d = 32, N = 16 points per set; grid r ∈ {4, 8, 16, 32} × d_p ∈ {4, 8, 16, 32} at h = 8 "
        "(d_p = 4 = d/h is the standard head); more heads: d_p = 4 with h = 8, 16, 32, 64 at r = 16",
        dim=32,
        num_points=16,
        ranks=(4, 8, 16, 32),
        head_dims=(4, 8, 16, 32),
        grid_heads=8,
        more_heads_rank=16,
        more_heads_head_dim=4,
        more_heads=(8, 16, 32, 64),
        seeds=(0, 1, 2),
        recipe=SyntheticRecipe(),
    )


def _quick_preset() -> SyntheticPreset:
    return SyntheticPreset(
        description="--quick (seconds; numbers mean nothing): d = 8, N = 8, r ∈ {2, 4} × d_p ∈ {2, 4} at h = 4; "
        "more heads: d_p = 2 with h = 4, 8 at r = 4; 40 steps",
        dim=8,
        num_points=8,
        ranks=(2, 4),
        head_dims=(2, 4),
        grid_heads=4,
        more_heads_rank=4,
        more_heads_head_dim=2,
        more_heads=(4, 8),
        seeds=(0,),
        recipe=SyntheticRecipe(steps=40, batch_size=32, curve_points=4, curve_sets=64, eval_sets=256),
    )


SYNTHETIC_PRESETS = {"default": _default_preset, "quick": _quick_preset}


def get_synthetic_preset(name: str) -> SyntheticPreset:
    """Raises ValueError listing the known presets."""
    from ..model.paper_presets import lookup

    return lookup(SYNTHETIC_PRESETS, name, "farthest-point")()


# --------------------------------------------------------------------------------- training
def _lr_lambda(warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    return f


def train_cell(
    task: FarthestPointTask, cell: SyntheticCell, recipe: SyntheticRecipe, seed: int, progress: bool = True
) -> dict:
    """Train one :class:`SetAttentionModel` on ``task`` with ``recipe``; return its metrics and curve.

    ``seed`` sets the initialisation (``torch.manual_seed``) and the stream of training sets; the
    held-out sets come from their own fixed seeds, the same for every cell of a (task, seed).

    Returns:
        A dict: the cell's fields, ``seed``, ``parameters``, the final ``mse``/``hit_rate``/
        ``nearest_rate`` on ``recipe.eval_sets`` held-out sets, ``train_seconds`` and ``curve``
        (a list of [step, mse, hit_rate] on the curve sets, step 0 included).

    Raises:
        ValueError: a cell whose rank differs from the task's, or a model size that
            :class:`SetAttentionModel` refuses.
    """
    from tqdm.auto import tqdm

    if cell.rank != task.rank:
        raise ValueError(f"cell rank {cell.rank} differs from the task's rank {task.rank}")
    torch.manual_seed(seed)
    model = SetAttentionModel(
        task.dim, cell.num_heads, cell.head_dim, recipe.intermediate_size, recipe.logit_scale, recipe.input_scale
    )
    u = task.projection
    curve_sets = task.sample(recipe.curve_sets, torch.Generator().manual_seed(seed + 20_000), u)
    eval_sets = task.sample(recipe.eval_sets, torch.Generator().manual_seed(seed + 30_000), u)
    data = torch.Generator().manual_seed(seed + 10_000)
    opt = torch.optim.AdamW(
        model.parameters(), lr=recipe.learning_rate, betas=recipe.betas, weight_decay=recipe.weight_decay
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(int(recipe.warmup_ratio * recipe.steps), recipe.steps))
    every = max(1, recipe.steps // recipe.curve_points)
    m0 = evaluate(model, curve_sets)
    curve = [[0, m0["mse"], m0["hit_rate"]]]
    t0 = time.time()
    bar = tqdm(
        range(1, recipe.steps + 1), desc=cell.key + f" s{seed}", disable=not progress, leave=False, mininterval=1.0
    )
    for step in bar:
        x, t, _ = task.sample(recipe.batch_size, data, u)
        loss = ((model(x) - t) ** 2).sum(-1).mean()  # MSE × d
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % every == 0 or step == recipe.steps:
            m = evaluate(model, curve_sets)
            curve.append([step, m["mse"], m["hit_rate"]])
            bar.set_postfix(mse=f"{m['mse']:.3f}", hit=f"{m['hit_rate']:.2f}")
    seconds = time.time() - t0
    final = evaluate(model, eval_sets)
    return {
        **asdict(cell),
        "key": cell.key,
        "seed": seed,
        "dim": task.dim,
        "num_points": task.num_points,
        "parameters": sum(p.numel() for p in model.parameters()),
        **final,
        "train_seconds": round(seconds, 2),
        "curve": curve,
    }


# ------------------------------------------------------------------------------------ runner
def _settings_fingerprint(p: SyntheticPreset) -> dict:
    """What must match for a stored run to be reused: the task sizes and the recipe."""
    import json

    # through JSON, so that it compares equal to what results.json read back (tuples become lists)
    return json.loads(json.dumps({"dim": p.dim, "num_points": p.num_points, "recipe": asdict(p.recipe)}))


def _check_output_dir(out: Path) -> None:
    """A new or empty folder, or an earlier run of this experiment (see :func:`fixedhead.runs.claim_output_dir`)."""
    from ..runs import claim_output_dir

    claim_output_dir(out, (RESULTS_FILE,), tuple(_OWN_FILES) + (f".{RESULTS_FILE}.*",), "farthest-point", create=False)


def run_synthetic(
    preset: str | SyntheticPreset = "default",
    output_dir: str | Path = "runs/farthest-point",
    seeds: list[int] | None = None,
    steps: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> dict:
    """Train (or reuse) every (cell, seed) of a preset; write results, plots and the report.

    A run is reused when ``results.json`` holds it with the same task sizes and recipe; after
    every new run ``results.json`` is rewritten atomically, so an interrupted grid loses at most
    the run in progress (runs take seconds to a minute; they are not checkpointed).

    Args:
        preset: a name from :data:`SYNTHETIC_PRESETS` or a :class:`SyntheticPreset`.
        output_dir: the folder; created, or one that holds only this experiment's files.
        seeds: override the preset's seeds (each is a task instance U, an init and a data stream).
        steps: override the recipe's training steps.
        overwrite: discard the stored runs and train everything again.

    Returns:
        The content of ``results.json``: ``meta``, ``references`` and ``runs``.

    Raises:
        ValueError: an unknown preset, bad seeds or steps, or a preset whose sizes the task or
            model refuse.
        FileExistsError: the folder holds other files, or results of other task sizes / recipe
            (without ``overwrite``).
    """
    from ..runs import environment_info

    p = get_synthetic_preset(preset) if isinstance(preset, str) else preset
    name = preset if isinstance(preset, str) else "custom"
    if seeds is not None:
        if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
            raise ValueError(f"seeds must be non-negative ints, got {seeds!r}")
        p = replace(p, seeds=tuple(dict.fromkeys(seeds)))
    if steps is not None:
        p = replace(
            p,
            recipe=replace(
                p.recipe, steps=_positive_int("steps", steps), curve_points=min(p.recipe.curve_points, steps)
            ),
        )
    cells = p.cells()
    for c in cells:  # refuse bad sizes before anything is written
        FarthestPointTask(p.dim, c.rank, p.num_points)
        SetAttentionModel(
            p.dim, c.num_heads, c.head_dim, p.recipe.intermediate_size, p.recipe.logit_scale, p.recipe.input_scale
        )

    out = Path(output_dir)
    _check_output_dir(out)
    state_file = out / RESULTS_FILE
    fingerprint = _settings_fingerprint(p)
    runs: dict[str, dict] = {}
    previous_meta: dict = {}
    if state_file.is_file() and not overwrite:
        previous = load_json_file(state_file, "farthest-point results")
        if previous.get("meta", {}).get("settings") != fingerprint:
            raise FileExistsError(
                f"{state_file} holds runs of other settings (task sizes or recipe); pass "
                f"--overwrite to replace them or choose another --output-dir"
            )
        runs, previous_meta = previous.get("runs", {}), previous["meta"]
    out.mkdir(parents=True, exist_ok=True)

    this_command, commands = invocation_commands(command, previous_meta)
    now = time.time()
    meta = {
        "preset": name,
        "description": p.description,
        "settings": fingerprint,
        "command": this_command,
        "commands": commands,
        "seeds": list(p.seeds),
        "cells": [asdict(c) for c in cells],
        "grid": {"ranks": list(p.ranks), "head_dims": list(p.head_dims), "heads": p.grid_heads},
        "more_heads": {"rank": p.more_heads_rank, "head_dim": p.more_heads_head_dim, "heads": list(p.more_heads)},
        "rule": {"succeeds_at": SUCCEEDS_AT, "fails_below": FAILS_BELOW},
        "first_started": previous_meta.get("first_started", now),
        "invocation_started": now,
        **environment_info(),
        "accelerator": None,  # the grid trains on the CPU even where a GPU is present
    }
    references = {
        str(r): attention_free_reference(FarthestPointTask(p.dim, r, p.num_points, seed=0))
        for r in sorted({c.rank for c in cells})
    }

    def save():
        meta["total_seconds"] = round(time.time() - meta["first_started"], 1)
        meta["compute_seconds"] = round(sum(r["train_seconds"] for r in runs.values()), 1)
        write_json_atomic(state_file, {"meta": meta, "references": references, "runs": dict(sorted(runs.items()))})

    plan = [(c, s) for s in p.seeds for c in cells]  # seed-major: an interrupted grid has every cell once first
    for i, (cell, seed) in enumerate(plan, 1):
        run_key = f"{cell.key}-s{seed}"
        if run_key in runs:
            continue
        task = FarthestPointTask(p.dim, cell.rank, p.num_points, seed=seed)
        result = train_cell(task, cell, p.recipe, seed, progress=progress)
        runs[run_key] = result
        if progress:
            print(
                f"[{i}/{len(plan)}] {run_key}: mse×d {result['mse']:.3f}, hit rate {result['hit_rate']:.3f} "
                f"({result['train_seconds']:.0f} s)",
                flush=True,
            )
        save()
    save()
    state = {"meta": meta, "references": references, "runs": runs}
    write_outputs(state, out)
    return state


# ----------------------------------------------------------------------------------- outputs
def _runs_of(state: dict, cell: dict) -> list[dict]:
    key = SyntheticCell(**cell).key
    return sorted(
        (r for r in state["runs"].values() if r["key"] == key and r["seed"] in state["meta"]["seeds"]),
        key=lambda r: r["seed"],
    )


def _grid_runs(state: dict) -> dict[tuple[int, int], list[dict]]:
    g = state["meta"]["grid"]
    return {
        (r, dp): _runs_of(state, dict(rank=r, head_dim=dp, num_heads=g["heads"]))
        for r in g["ranks"]
        for dp in g["head_dims"]
    }


def format_grid(state: dict, what: str = "hit_rate") -> str:
    """A plain-text table of ``what`` (mean ± std over seeds) over r (rows) and d_p (columns)."""
    g = state["meta"]["grid"]
    runs = _grid_runs(state)
    head = f"{what} (rows r, columns d_p; h = {g['heads']})"
    lines = [head, "r \\ d_p " + "".join(f"{dp:>18}" for dp in g["head_dims"])]
    for r in g["ranks"]:
        lines.append(f"{r:>8} " + "".join(f"{pm_of([x[what] for x in runs[(r, dp)]], 3):>18}" for dp in g["head_dims"]))
    return "\n".join(lines)


def write_outputs(state: dict, out: Path) -> None:
    """``results.csv`` (one row per run), the three PNGs and ``report.md`` in ``out``."""
    keys = [
        "key",
        "rank",
        "head_dim",
        "num_heads",
        "seed",
        "dim",
        "num_points",
        "parameters",
        "mse",
        "hit_rate",
        "nearest_rate",
        "train_seconds",
    ]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for k in sorted(state["runs"]):
            w.writerow([state["runs"][k][c] for c in keys])
    plot_heatmap(state, out / "heatmap.png")
    plot_more_heads(state, out / "more_heads.png")
    plot_learning_curves(state, out / "learning_curves.png")
    (out / "report.md").write_text(report_markdown(state))


def plot_heatmap(state: dict, path: Path) -> None:
    """Hit rate and MSE × d (means over seeds) over (r, d_p), with the line d_p = r drawn."""
    from ..plotting import pyplot as _plt

    plt = _plt()
    g = state["meta"]["grid"]
    runs = _grid_runs(state)
    ranks, dps = g["ranks"], g["head_dims"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, what, cmap, vmax in ((axes[0], "hit_rate", "viridis", 1.0), (axes[1], "mse", "magma_r", 1.0)):
        vals = [[mean_std([x[what] for x in runs[(r, dp)]])[0] for dp in dps] for r in ranks]
        im = ax.imshow(vals, origin="lower", cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
        for i, r in enumerate(ranks):
            for j, dp in enumerate(dps):
                m, s = mean_std([x[what] for x in runs[(r, dp)]])
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
            ax.plot(
                [a for a, _ in diag], [b for _, b in diag], color="red", linestyle=":", linewidth=1.5, label="d_p = r"
            )
        ax.set_xticks(range(len(dps)), [str(x) for x in dps])
        ax.set_yticks(range(len(ranks)), [str(x) for x in ranks])
        ax.set_xlabel("head size d_p")
        ax.set_ylabel("rank r of the needed logit")
        ax.set_title(
            {"hit_rate": "hit rate (↑; output is x_j*)", "mse": "MSE × d (↓; 0 perfect, 1 = predict 0)"}[what],
            fontsize=10,
        )
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
    from ..plotting import pyplot as _plt
    from ..plotting import save_figure as _save

    plt = _plt()
    mh = state["meta"]["more_heads"]
    fig, ax = plt.subplots(figsize=(6, 4))
    hs, hit, hit_s, mse, mse_s = [], [], [], [], []
    for h in mh["heads"]:
        rs = _runs_of(state, dict(rank=mh["rank"], head_dim=mh["head_dim"], num_heads=h))
        if rs:
            hs.append(h)
            for vals, ms, what in ((hit, hit_s, "hit_rate"), (mse, mse_s, "mse")):
                m, s = mean_std([x[what] for x in rs])
                vals.append(m)
                ms.append(s if math.isfinite(s) else 0.0)
    ax.errorbar(hs, hit, yerr=hit_s, marker="o", capsize=3, label="hit rate")
    ax.errorbar(hs, mse, yerr=mse_s, marker="s", capsize=3, label="MSE × d")
    ref = state["references"].get(str(mh["rank"]))
    if ref:
        ax.axhline(
            ref["mse"], color="gray", linestyle="--", linewidth=1, label=f"MSE × d without attention ({ref['mse']:.2f})"
        )
    ax.set_xscale("log", base=2)
    from .report import _plain_ticks

    _plain_ticks(ax, hs)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("number of heads h")
    ax.set_title(f"more heads of size d_p = {mh['head_dim']} at r = {mh['rank']}", fontsize=10)
    _save(fig, path, [ax])


def plot_learning_curves(state: dict, path: Path) -> None:
    """Held-out MSE × d against step (mean over seeds), one panel per rank, one line per d_p, plus
    the more-heads row."""
    from ..plotting import pyplot as _plt
    from ..plotting import save_figure as _save

    plt = _plt()
    g, mh = state["meta"]["grid"], state["meta"]["more_heads"]
    panels = [
        (
            f"r = {r}, h = {g['heads']}",
            [(f"d_p = {dp}", dict(rank=r, head_dim=dp, num_heads=g["heads"])) for dp in g["head_dims"]],
            r,
        )
        for r in g["ranks"]
    ]
    panels.append(
        (
            f"r = {mh['rank']}, d_p = {mh['head_dim']}",
            [(f"h = {h}", dict(rank=mh["rank"], head_dim=mh["head_dim"], num_heads=h)) for h in mh["heads"]],
            mh["rank"],
        )
    )
    cols = 3 if len(panels) > 4 else len(panels)
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), sharey=True, squeeze=False)
    flat = [a for row in axes for a in row]
    for ax, (title, lines, r) in zip(flat, panels, strict=False):  # more axes than panels: the rest are hidden
        for label, cell in lines:
            rs = _runs_of(state, cell)
            if not rs:
                continue
            steps = [c[0] for c in rs[0]["curve"]]
            mean = [sum(run["curve"][k][1] for run in rs) / len(rs) for k in range(len(steps))]
            ax.plot(steps, mean, label=label + (" (≥ r)" if "d_p" in label and cell["head_dim"] >= r else ""))
        ref = state["references"].get(str(r))
        if ref:
            ax.axhline(ref["mse"], color="gray", linestyle="--", linewidth=1, label="no attention")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.1)
    for ax in flat[len(panels) :]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("held-out MSE × d")
    for ax in flat[: len(panels)]:
        ax.legend(fontsize=7)
    _save(fig, path, flat[: len(panels)], legend=False)


def report_markdown(state: dict) -> str:
    """The markdown report: what was run, the rule, the grid with verdicts, the more-heads row."""
    meta, refs = state["meta"], state["references"]
    g, mh = meta["grid"], meta["more_heads"]
    rec = meta["settings"]["recipe"]
    runs = _grid_runs(state)
    n_done = sum(1 for c in meta["cells"] for _ in _runs_of(state, c))
    n_plan = len(meta["cells"]) * len(meta["seeds"])
    L = [
        "# Farthest point under a rank-r projection: does head size matter when a model learns?",
        "",
        f"{meta['description']}.",
        "",
    ]
    if n_done < n_plan:
        L += [f"**Incomplete: {n_done} of {n_plan} runs finished.** Rerun the same command to finish.", ""]
    L += [
        "![hit rate and MSE over (r, d_p)](heatmap.png)",
        "",
        "## What was run",
        "",
        "- command" + ("s" if len(meta["commands"]) > 1 else "") + ": " + ", ".join(f"`{c}`" for c in meta["commands"]),
        f"- wall time: {meta['total_seconds'] / 60:.1f} min from the first start to the last result; the runs' "
        f"own training time sums to {meta['compute_seconds'] / 60:.1f} min; {meta.get('cpu_count')} CPU cores "
        f"({meta.get('platform', '')}), torch threads {meta.get('torch_threads')}",
        f"- software: Python {meta['python']}, torch {meta['torch']}, transformers {meta['transformers']}"
        + "".join(f", {k} {v}" for k, v in (meta.get("other_versions") or {}).items() if v),
        f"- task: N = {meta['settings']['num_points']} points uniform on the unit sphere in "
        f"R^{meta['settings']['dim']}; target of x_i is x_j with j = argmin_j ⟨U x_i, U x_j⟩, U ∈ R^(r×d) with "
        f"orthonormal rows (UᵀU projects onto a random r-dimensional subspace); fresh sets every step",
        f"- model: one post-LN encoder block (this project's MultiHeadAttention, h heads of size d_p, no "
        f"positions; GELU feed-forward {rec['intermediate_size'] or '4d'}), linear read-out; logits "
        f"q·k/√d_p × {rec['logit_scale']}; points fed × {rec['input_scale']}",
        f"- recipe, the same for every cell: {rec['steps']} steps × {rec['batch_size']} sets, AdamW lr "
        f"{rec['learning_rate']} (betas {tuple(rec['betas'])}, weight decay {rec['weight_decay']}), warm-up "
        f"{rec['warmup_ratio']:.0%} then cosine decay to 0; loss MSE × d",
        f"- seeds {meta['seeds']}: seed s is the task instance (U), the initialisation and the data stream; "
        f"final metrics on {rec['eval_sets']} held-out sets ({rec['eval_sets'] * meta['settings']['num_points']:,} "
        f"points) per run",
        "",
        "**Metrics.** MSE × d = ‖output − x_j*‖² per point (predicting 0 scores 1). Hit rate = fraction of "
        "points whose output is within half the gap around x_j*: ‖output − x_j*‖ < ½ min_(k≠j*) ‖x_k − x_j*‖, "
        'so it is nearer to x_j* than to any other point, with a margin. (The plain "nearest point is x_j*" '
        "rate is in `results.csv` but is not used: the attention-free map x_i ↦ −UᵀU x_i scores 1 on it.)",
        "",
        f"**Verdict rule** (fixed before the run): a cell *succeeds* if every seed's hit rate is ≥ {SUCCEEDS_AT}, "
        f"*fails* if every seed's is < {FAILS_BELOW}, and is *in between* otherwise.",
        "",
        "**Reference without attention** (least-squares affine map of x_i alone, seed-0 task): "
        + "; ".join(
            f"r = {r}: MSE × d {v['mse']:.3f}, hit rate {v['hit_rate']:.3f}, nearest-point rate {v['nearest_rate']:.3f}"
            for r, v in refs.items()
        )
        + ".",
        "",
        f"## The grid: h = {g['heads']}, d = {meta['settings']['dim']} (mean ± std over seeds)",
        "",
        "| r | d_p | d_p ≥ r | hit rate | MSE × d | verdict | agrees with d_p ≥ r? |",
        "|---|---|---|---|---|---|---|",
    ]
    agree, total = 0, 0
    for r in g["ranks"]:
        for dp in g["head_dims"]:
            rs = runs[(r, dp)]
            v = threshold_verdict([x["hit_rate"] for x in rs])
            predicted = "succeeds" if dp >= r else "fails"
            ok = "–" if v == "not run" else ("yes" if v == predicted else "no")
            agree += ok == "yes"
            total += ok != "–"
            L.append(
                f"| {r} | {dp} | {'yes' if dp >= r else 'no'} | {pm_of([x['hit_rate'] for x in rs], 3)} | "
                f"{pm_of([x['mse'] for x in rs], 3)} | **{v}** | {ok} |"
            )
    L += [
        "",
        f"{agree} of {total} grid cells have the verdict the prediction (succeeds iff d_p ≥ r) names.",
        "",
        f"## More heads of a too-small size: d_p = {mh['head_dim']}, r = {mh['rank']}",
        "",
        "![more heads](more_heads.png)",
        "",
        "| h | h·d_p | hit rate | MSE × d | verdict |",
        "|---|---|---|---|---|",
    ]
    for h in mh["heads"]:
        rs = _runs_of(state, dict(rank=mh["rank"], head_dim=mh["head_dim"], num_heads=h))
        L.append(
            f"| {h} | {h * mh['head_dim']} | {pm_of([x['hit_rate'] for x in rs], 3)} | "
            f"{pm_of([x['mse'] for x in rs], 3)} | **{threshold_verdict([x['hit_rate'] for x in rs])}** |"
        )
    L += [
        "",
        "## Learning curves",
        "",
        "![learning curves](learning_curves.png)",
        "",
        "## Every run",
        "",
        "| run | parameters | hit rate | MSE × d | nearest-point rate | train s |",
        "|---|---|---|---|---|---|",
    ]
    for k in sorted(
        state["runs"],
        key=lambda k: (
            state["runs"][k]["rank"],
            state["runs"][k]["head_dim"],
            state["runs"][k]["num_heads"],
            state["runs"][k]["seed"],
        ),
    ):
        x = state["runs"][k]
        L.append(
            f"| `{k}` | {x['parameters']:,} | {x['hit_rate']:.3f} | {x['mse']:.3f} | {x['nearest_rate']:.3f} | "
            f"{x['train_seconds']:.0f} |"
        )
    return "\n".join(L) + "\n"
