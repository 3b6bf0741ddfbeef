"""The one-layer set model of ``fixedhead farthest-point``, its metrics and its training loop: one
run of the study (one cell, one seed); the task is :mod:`fixedhead.data.synthetic`.

Metrics, on fresh held-out sets:

* ``mse``: ‖output − x_{j*}‖² averaged over points (= MSE × d, Amsel et al.'s scaling): predicting 0
  scores exactly 1.
* ``hit_rate``: the fraction of points with ‖output − x_{j*}‖ < ½ min_{k≠j*} ‖x_k − x_{j*}‖: the output
  can be read as x_{j*} and as nothing else.
* ``nearest_rate``: the fraction whose *nearest* point is x_{j*}. Not used for verdicts: the
  attention-free map x_i ↦ −UᵀU x_i has inner product −⟨Ux_i, Ux_j⟩ with every x_j, so its nearest
  point is exactly j*(i) without looking at the set.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ...checks import in_range, positive_float, positive_int
from ...data.synthetic import FarthestPointTask
from ...model.attention import MultiHeadAttention


# ------------------------------------------------------------------------------------ model
class SetAttentionModel(nn.Module):
    """One post-LN encoder block on a set of points, then a linear read-out; no positions.

    points x ∈ R^{N×d} → h0 = s_in·x → z = LN(h0 + MultiHead(h0)) → y = LN(z + FFN(z))
    → output = y W_rᵀ + b_r ∈ R^{N×d}.
    The block is BERT's (paper Section 2, post-LN, GELU feed-forward of width ``intermediate_size``);
    MultiHead is :class:`fixedhead.model.attention.MultiHeadAttention` with h heads of size d_p (any d_p:
    the paper's fixed head size, Section 4), whose logits q·k/√d_p are multiplied by ``logit_scale``
    (an inverse temperature, the same for every head size).

    ``hidden_size`` is d, ``intermediate_size`` defaults to 4d, ``input_scale`` is s_in (1 feeds the unit
    vectors as they are, as Amsel et al. do).

    Raises:
        ValueError: a size that is not a positive int, h·d_p < d (the values could not carry a
            d-dimensional point), or a scale that is not a positive finite number.
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
        d = positive_int("hidden_size", hidden_size)
        h = positive_int("num_attention_heads", num_attention_heads)
        dp = positive_int("head_dim", head_dim)
        if h * dp < d:
            raise ValueError(
                f"num_attention_heads × head_dim = {h} × {dp} = {h * dp} < hidden_size = {d}: "
                f"the values cannot carry a {d}-dimensional point"
            )
        ffn = 4 * d if intermediate_size is None else positive_int("intermediate_size", intermediate_size)
        positive_float("logit_scale", logit_scale)
        positive_float("input_scale", input_scale)
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
    """``mse``, ``hit_rate`` and ``nearest_rate`` (module docstring), each a mean over batch × N points.
    ``points``, ``targets`` (= points[index]) and ``outputs``: [batch, N, d]; ``index``: [batch, N]."""
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
    """What a layer that ignores the other points can reach: the least-squares affine map x_i ↦ W x_i + b
    fitted to x_{j*(i)} on ``num_sets`` sets, scored on as many fresh ones. Below its ``mse`` a model must be
    using attention."""
    u = task.projection
    fit_x, fit_t, _ = task.sample(num_sets, torch.Generator().manual_seed(seed + 50_000), u)
    a = torch.cat([fit_x.reshape(-1, task.dim), torch.ones(fit_x.numel() // task.dim, 1)], 1).double()
    w = torch.linalg.lstsq(a, fit_t.reshape(-1, task.dim).double()).solution.float()  # [d + 1, d]
    x, t, idx = task.sample(num_sets, torch.Generator().manual_seed(seed + 60_000), u)
    return prediction_metrics(x, t, idx, x @ w[:-1] + w[-1])


# ----------------------------------------------------------------------------------- recipe
@dataclass(frozen=True)
class FarthestPointRecipe:
    """The one training recipe every cell gets: AdamW (betas 0.9/0.95, as Amsel et al.), linear warm-up then
    cosine decay to 0, loss = MSE × d on a fresh batch of sets every step."""

    steps: int = 3000
    """training steps (one fresh batch of sets each)"""
    batch_size: int = 64
    """sets per step"""
    learning_rate: float = 1e-2
    """AdamW's peak rate"""
    warmup_ratio: float = 0.05
    """fraction of the steps of linear warm-up (then cosine decay to 0)"""
    weight_decay: float = 0.0
    """AdamW's weight decay"""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's betas"""
    logit_scale: float = 16.0
    """the attention logits' scale (the softmax temperature is its inverse)"""
    input_scale: float = 1.0
    """the scale of the input points"""
    intermediate_size: int | None = None
    """the feed-forward width (None: 4 d)"""
    curve_points: int = 20
    """points of the learning curve"""
    curve_sets: int = 256
    """held-out sets the learning curve is measured on"""
    eval_sets: int = 4096
    """other held-out sets the final metrics are scored on"""

    def __post_init__(self):
        for name in ("steps", "batch_size", "curve_points", "curve_sets", "eval_sets"):
            positive_int(name, getattr(self, name))
        positive_float("learning_rate", self.learning_rate)
        in_range("warmup_ratio", self.warmup_ratio, 0.0, 1.0)
        in_range("weight_decay", self.weight_decay, 0.0, math.inf)
        positive_float("logit_scale", self.logit_scale)
        positive_float("input_scale", self.input_scale)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.intermediate_size is not None:
            positive_int("intermediate_size", self.intermediate_size)


@dataclass(frozen=True)
class Cell:
    """One model of the grid: the task's rank r, the head size d_p and the number of heads h."""

    rank: int
    head_dim: int
    num_heads: int

    @property
    def key(self) -> str:
        return f"r{self.rank}-dp{self.head_dim}-h{self.num_heads}"


# --------------------------------------------------------------------------------- training
def _warmup_cosine(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def train_cell(
    task: FarthestPointTask,
    cell: Cell,
    recipe: FarthestPointRecipe,
    seed: int,
    progress: bool = True,
    return_model: bool = False,
) -> dict | tuple[dict, SetAttentionModel]:
    """Train one :class:`SetAttentionModel` on ``task`` with ``recipe``; return its metrics and curve.

    ``seed`` sets the initialisation and the training sets; the held-out sets are the same for every cell of
    a (task, seed). Returns the cell's fields, ``seed``, ``parameters``, the final metrics, ``train_seconds``
    and ``curve`` ([step, mse, hit_rate] from step 0); with ``return_model``, (that dict, the model in eval
    mode). ValueError for a cell whose rank differs from the task's.
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
    warmup = int(recipe.warmup_ratio * recipe.steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: _warmup_cosine(step, warmup, recipe.steps))
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
    result = {
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
    return (result, model.eval()) if return_model else result
