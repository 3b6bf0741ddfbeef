"""Coordinate check: do a parametrization's activations move by the same amount at every head size?

The test μP is built on (Yang et al. 2022, "Tensor Programs V", Section 7 and Fig. 5): train models that
differ only in width for a few Adam steps at one learning rate and follow the mean absolute value of each
activation. Where one rate is fair to every width, the curves are flat in width.

The width is the head size d_p (d and h fixed) or the number of heads h (d and d_p fixed); the activations
are query and key [batch, h, n, d_p], the logits [batch, h, n, n], the heads' concatenated output
("context", [batch, n, h·d_p]), the attention sublayer's output and the block's output ([batch, n, d]). For
each, mean |x_t| and mean |x_t − x_0| on one fixed batch after t steps, averaged over layers; "flat" is the
slope of log mean |x_t − x_0| against log width at the last step (0 = flat). Models are causal LMs without
dropout on fixed seeded batches.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..checks import check_fields, positive_float, positive_int
from ..plotting import pyplot, save_figure
from .kit import render
from .kit.study import Point, Study

QUANTITIES = ("query", "key", "logits", "context", "attention_output", "block_output")
AXES = ("head_dim", "num_heads")


def parametrization_overrides(name: str, base_head_dim: int, base_num_heads: int, head_dim: int) -> dict:
    """Config fields of the variant ``name`` for a model of head size ``head_dim``.

    * ``standard``: BERT's 1/√d_p, one learning rate, N(0, 0.02) everywhere;
    * ``logits-1/d_p``: the standard model with μP's logit scale √base_d_p / d_p only;
    * ``output-projection``: μP's W_o (initial std and learning rate × base width / width) only;
    * ``mup``: both (``parametrization="mup"``);
    * ``mup-zero-query``: μP with W_q initialised at zero.

    Raises:
        ValueError: an unknown name.
    """
    base = {"mup_base_head_dim": base_head_dim, "mup_base_num_attention_heads": base_num_heads}
    variants = {
        "standard": {},
        "logits-1/d_p": {"attention_scale": (1.0 / math.sqrt(base_head_dim)) * (base_head_dim / head_dim)},
        "output-projection": {**base, "parametrization": "mup", "attention_scale": 1.0 / math.sqrt(head_dim)},
        "mup": {**base, "parametrization": "mup"},
        "mup-zero-query": {**base, "parametrization": "mup", "query_init": "zero"},
    }
    if name not in variants:
        raise ValueError(f"unknown parametrization variant {name!r}; known: {sorted(variants)}")
    return variants[name]


PARAMETRIZATIONS = ("standard", "logits-1/d_p", "output-projection", "mup", "mup-zero-query")


@dataclass(frozen=True)
class CoordCheckSettings:
    """What ``fixedhead coordcheck`` trains (the defaults: a 2-layer d = 64 model, 30 Adam steps)."""

    hidden_size: int = 64
    """d"""
    num_attention_heads: int = 4
    """h on the head-size axis"""
    head_dims: tuple[int, ...] = field(
        default=(4, 8, 16, 32, 64, 128), metadata={"check": "positive", "distinct": True}
    )
    """the head-size axis (d_p at fixed h)"""
    fixed_head_dim: int = 16
    """d_p on the head-count axis"""
    num_heads: tuple[int, ...] = field(default=(1, 2, 4, 8, 16, 32), metadata={"check": "positive", "distinct": True})
    """the head-count axis (h at fixed d_p)"""
    base_head_dim: int = 16
    """μP's base d_p (where every variant is the standard model)"""
    base_num_attention_heads: int = 4
    """μP's base h"""
    num_hidden_layers: int = 2
    """layers"""
    intermediate_size: int = 256
    """feed-forward width"""
    vocab_size: int = 512
    """vocabulary of the uniform random tokens"""
    seq_len: int = 32
    """n"""
    batch_size: int = 16
    """sequences per step"""
    steps: int = 30
    """AdamW steps"""
    learning_rate: float = 1e-3
    """AdamW's rate for every model"""
    seeds: tuple[int, ...] = field(
        default=(0, 1, 2), metadata={"check": "non_negative", "nonempty": True, "distinct": True}
    )
    """seeds of the models (the batches are the same)"""
    parametrizations: tuple[str, ...] = field(
        default=PARAMETRIZATIONS, metadata={"choices": PARAMETRIZATIONS, "distinct": True}
    )
    """the variants compared"""
    axes: tuple[str, ...] = field(default=AXES, metadata={"choices": AXES, "distinct": True})
    """widths to vary: head_dim (d_p at fixed h), num_heads (h at fixed d_p)"""

    def __post_init__(self):
        check_fields(self)
        for name in ("hidden_size", "num_attention_heads", "fixed_head_dim", "base_head_dim"):
            positive_int(name, getattr(self, name))
        for name in ("base_num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"):
            positive_int(name, getattr(self, name))
        positive_int("seq_len", self.seq_len, minimum=2)
        positive_int("batch_size", self.batch_size)
        positive_int("steps", self.steps)
        positive_float("learning_rate", self.learning_rate)
        for name in ("head_dims", "num_heads"):
            values = getattr(self, name)
            if len(values) < 2:
                raise ValueError(f"{name} needs at least two widths to compare, got {values!r}")
        positive_int("vocab_size", self.vocab_size, minimum=2)
        if not self.parametrizations or not self.axes:
            raise ValueError(
                f"give at least one parametrization and one axis, got {self.parametrizations} and {self.axes}"
            )
        for name in self.parametrizations:
            parametrization_overrides(name, 1, 1, 1)
        for axis in self.axes:
            if axis not in AXES:
                raise ValueError(f"unknown axis {axis!r}; known: {AXES}")

    def model_configs(self, axis: str, parametrization: str) -> dict[int, object]:
        """``{width: FixedHeadConfig}`` along ``axis`` under ``parametrization``."""
        from ..model.configuration import FixedHeadConfig

        out = {}
        widths = self.head_dims if axis == "head_dim" else self.num_heads
        for width in widths:
            h, dp = (self.num_attention_heads, width) if axis == "head_dim" else (width, self.fixed_head_dim)
            out[width] = FixedHeadConfig(
                vocab_size=self.vocab_size,
                hidden_size=self.hidden_size,
                num_hidden_layers=self.num_hidden_layers,
                num_attention_heads=h,
                head_dim=dp,
                intermediate_size=self.intermediate_size,
                max_position_embeddings=self.seq_len,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                is_decoder=True,
                pad_token_id=None,
                **parametrization_overrides(parametrization, self.base_head_dim, self.base_num_attention_heads, dp),
            )
        return out


def _activations(model, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every quantity of :data:`QUANTITIES` per layer, from one forward pass: ``{"query/0": tensor, ...}``."""
    from ..model.attention import MultiHeadAttention
    from ..model.modeling import FixedHeadLayer

    out: dict[str, torch.Tensor] = {}
    hooks = []
    for i, attn in enumerate(m for m in model.modules() if isinstance(m, MultiHeadAttention)):

        def on_qkv(_m, _inp, qkv, i=i, attn=attn):
            b, s, _ = qkv.shape  # [batch, n, 3·h·d_p] -> 3 × [batch, h, n, d_p]
            q, k, _v = qkv.view(b, s, 3, attn.num_attention_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
            out[f"query/{i}"], out[f"key/{i}"] = q, k
            out[f"logits/{i}"] = torch.matmul(q, k.transpose(-1, -2)) * attn.scale

        def on_out_proj(_m, inp, o, i=i):  # its input: the heads' context; its output: the attention sublayer's
            out[f"context/{i}"], out[f"attention_output/{i}"] = inp[0], o

        hooks += [attn.qkv.register_forward_hook(on_qkv), attn.out_proj.register_forward_hook(on_out_proj)]
    for i, layer in enumerate(m for m in model.modules() if isinstance(m, FixedHeadLayer)):

        def on_block(_m, _inp, o, i=i):
            out[f"block_output/{i}"] = o[0] if isinstance(o, tuple) else o

        hooks.append(layer.register_forward_hook(on_block))
    try:
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        for h in hooks:
            h.remove()
    return {k: v.detach().double().clone() for k, v in out.items()}


def measure(config, batches: torch.Tensor, eval_ids: torch.Tensor, learning_rate: float, seed: int) -> list[dict]:
    """Train a causal LM of ``config`` on ``batches`` [steps, batch, n] with AdamW and record, before and after
    each step, mean |x| and mean |x − x_0| of every quantity on ``eval_ids`` [batch, n], averaged over layers:
    one row ``{"step", "quantity", "mean_abs", "mean_abs_change"}`` per (step, quantity)."""
    from ..model.modeling import FixedHeadForCausalLM
    from ..training.checkpoints import apply_learning_rate_multipliers

    torch.manual_seed(seed)
    model = FixedHeadForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    apply_learning_rate_multipliers(optimizer, model)
    first = _activations(model, eval_ids)
    rows = []
    for step in range(batches.shape[0] + 1):
        if step:
            ids = batches[step - 1]
            loss = model(input_ids=ids, labels=ids).loss
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss became {loss.item()} at step {step} (lr {learning_rate:g}); lower it")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        now = _activations(model, eval_ids) if step else first
        for quantity in QUANTITIES:
            keys = [k for k in now if k.split("/")[0] == quantity]
            size = float(np.mean([now[k].abs().mean().item() for k in keys]))
            change = float(np.mean([(now[k] - first[k]).abs().mean().item() for k in keys]))
            rows.append({"step": step, "quantity": quantity, "mean_abs": size, "mean_abs_change": change})
    return rows


def random_batches(settings: CoordCheckSettings, seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded uniform token ids: ``(batches [steps, batch, n], eval_ids [batch, n])``."""
    g = torch.Generator().manual_seed(seed)
    shape = (settings.steps + 1, settings.batch_size, settings.seq_len)
    ids = torch.randint(0, settings.vocab_size, shape, generator=g)
    return ids[1:], ids[0]


@dataclass
class CoordCheckResult:
    """All rows of a coordinate check and the slopes that summarise them."""

    settings: dict
    rows: list[dict] = field(default_factory=list)  # axis, parametrization, width, seed, step, quantity, ...
    data: str = "uniform random tokens"
    meta: dict = field(default_factory=dict)  # the command and the software that made it

    def curve(self, axis: str, parametrization: str, quantity: str, step: int, what: str = "mean_abs_change"):
        """(widths, values averaged over seeds) for one line of the plot."""
        line = [r for r in self.rows if r["axis"] == axis and r["parametrization"] == parametrization]
        widths = sorted({r["width"] for r in line})
        at = [r for r in line if r["quantity"] == quantity and r["step"] == step]
        return widths, [float(np.mean([r[what] for r in at if r["width"] == w])) for w in widths]

    def slope(self, axis: str, parametrization: str, quantity: str, step: int | None = None) -> float:
        """Least-squares slope of log mean |x_t − x_0| against log width at ``step`` (default: the
        last); 0 is flat, 1 means the change grows in proportion to the width."""
        step = self.settings["steps"] if step is None else step
        widths, values = self.curve(axis, parametrization, quantity, step)
        return float(np.polyfit(np.log(widths), np.log(values), 1)[0])

    def slopes(self) -> list[dict]:
        """One row per (axis, parametrization): the slope of every quantity at the last step."""
        return [
            {"axis": axis, "parametrization": name, **{q: self.slope(axis, name, q) for q in QUANTITIES}}
            for axis in self.settings["axes"]
            for name in self.settings["parametrizations"]
        ]


#: ``--quick``: a one-layer d = 32 model, 5 steps, one seed, standard against μP (seconds; the tests' size)
QUICK = CoordCheckSettings(
    hidden_size=32,
    num_attention_heads=2,
    head_dims=(4, 16, 64),
    fixed_head_dim=8,
    num_heads=(1, 4, 16),
    base_head_dim=8,
    base_num_attention_heads=2,
    num_hidden_layers=1,
    intermediate_size=64,
    vocab_size=128,
    seq_len=16,
    batch_size=8,
    steps=5,
    seeds=(0,),
    parametrizations=("standard", "mup"),
)


class CoordCheckStudy(Study):
    """The check on the kit (:mod:`fixedhead.studies.kit.study`): one point per (axis, parametrization,
    width, seed), its measurements stored compactly (:func:`point_curves`); the summary is the slopes."""

    name = "coordcheck"
    help = "coordinate check: how far one learning rate moves the attention's activations at each head size"
    Options = CoordCheckSettings
    quick = QUICK
    files = ("coordcheck_*.png",)
    points_only = ("seeds", "parametrizations", "axes", "head_dims", "num_heads")

    def plan(self, s):
        return [
            Point(f"{axis}-{name.replace('/', '_')}-w{width}-s{seed}", (axis, name, width, seed))
            for axis in s.axes
            for name in s.parametrizations
            for width in (s.head_dims if axis == "head_dim" else s.num_heads)
            for seed in s.seeds
        ]

    def run(self, s, point, folder, done, progress):
        axis, name, width, seed = point.spec
        batches, eval_ids = random_batches(s)
        rows = measure(s.model_configs(axis, name)[width], batches, eval_ids, s.learning_rate, seed)
        return {"axis": axis, "parametrization": name, "width": width, "seed": seed, "curves": point_curves(rows)}

    def summarise(self, state):
        return result_of(state["options"], state["results"]).slopes()

    def report(self, state):
        return report_markdown(result_of(state["options"], state["runs"].values(), state["meta"]))

    def write_files(self, state, folder):
        result = result_of(state["options"], state["runs"].values())
        for axis in state["options"].axes:
            plot(result, axis, folder / f"coordcheck_{axis}.png")


def point_curves(rows: list[dict]) -> dict:
    """One point's rows (:func:`measure`) compactly: ``{quantity: {"mean_abs_change": [one per step 0..T],
    "mean_abs": [...]}}`` (5 significant digits), from which every slope and plot is recomputed."""
    out: dict = {}
    for r in rows:
        leaf = out.setdefault(r["quantity"], {"mean_abs_change": [], "mean_abs": []})
        leaf["mean_abs_change"].append(float(f"{r['mean_abs_change']:.5g}"))
        leaf["mean_abs"].append(float(f"{r['mean_abs']:.5g}"))
    return out


def result_of(s: CoordCheckSettings, results, meta: dict | None = None) -> CoordCheckResult:
    """The :class:`CoordCheckResult` of the points' ``results`` (their rows rebuilt from the curves)."""
    rows = [
        {
            "axis": r["axis"],
            "parametrization": r["parametrization"],
            "width": int(r["width"]),
            "seed": int(r["seed"]),
            "step": step,
            "quantity": quantity,
            "mean_abs_change": change,
            "mean_abs": size,
        }
        for r in results
        for quantity, leaf in r["curves"].items()
        for step, (change, size) in enumerate(zip(leaf["mean_abs_change"], leaf["mean_abs"], strict=True))
    ]
    return CoordCheckResult(settings=json.loads(json.dumps(asdict(s))), rows=rows, meta=meta or {})


def coord_check(settings: CoordCheckSettings, progress: bool = True) -> CoordCheckResult:
    """Every (axis, parametrization, width, seed) of ``settings`` on seeded random tokens, in memory
    (no files; ``fixedhead coordcheck`` is :class:`CoordCheckStudy`)."""
    from tqdm.auto import tqdm

    study = CoordCheckStudy()
    results = [study.run(settings, p, None, {}, False) for p in tqdm(study.plan(settings), disable=not progress)]
    return result_of(settings, results)


# ------------------------------------------------------------------------------- outputs
def format_slopes(result: CoordCheckResult) -> str:
    """A markdown table: for each axis and parametrization, the slope of every quantity."""
    rows = [[r["axis"], r["parametrization"], *(f"{r[q]:+.2f}" for q in QUANTITIES)] for r in result.slopes()]
    return "\n".join(render.table(["width axis", "parametrization", *QUANTITIES], rows))


def plot(result: CoordCheckResult, axis: str, path) -> Path:
    """Rows = quantities, columns = parametrizations; mean |x_t − x_0| against width, one line per
    step t (1, 2, 5, 10, 20, ... and the last)."""
    plt = pyplot()
    names = result.settings["parametrizations"]
    steps = result.settings["steps"]
    fig, axes = plt.subplots(
        len(QUANTITIES), len(names), figsize=(3 * len(names), 2.2 * len(QUANTITIES)), squeeze=False
    )
    colors = plt.get_cmap("viridis")
    for i, quantity in enumerate(QUANTITIES):
        for j, name in enumerate(names):
            ax = axes[i][j]
            for t in sorted({1, 2, 5, 10, 20, 50, 100, steps} & set(range(1, steps + 1))):
                widths, values = result.curve(axis, name, quantity, t)
                ax.plot(widths, values, marker=".", color=colors(t / steps), label=f"t={t}" if j == 0 else None)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name}: {quantity} (slope {result.slope(axis, name, quantity):+.2f})", fontsize=8)
            if i == len(QUANTITIES) - 1:
                ax.set_xlabel("head size d_p" if axis == "head_dim" else "heads h")
            if j == 0:
                ax.set_ylabel("mean |x_t − x_0|", fontsize=8)
    fig.suptitle(
        f"coordinate check along {axis} (d = {result.settings['hidden_size']}, lr {result.settings['learning_rate']:g},"
        f" {len(result.settings['seeds'])} seeds): flat lines = one learning rate fits every width",
        fontsize=10,
    )
    return save_figure(fig, path, axes=[a for row in axes for a in row], dpi=70)


def report_markdown(result: CoordCheckResult) -> str:
    s, meta = result.settings, result.meta
    run = render.Section("What was run", [[render.commands_line(meta), render.software_line(meta)]]) if meta else None
    return render.markdown(
        render.Report(
            "Coordinate check",
            [
                f"Causal LMs, d = {s['hidden_size']}, {s['num_hidden_layers']} layers, n = {s['seq_len']}, "
                f"batch {s['batch_size']}, {s['steps']} AdamW steps at lr {s['learning_rate']:g}, no dropout, "
                f"{result.data}, seeds {s['seeds']}. Head-size axis: h = {s['num_attention_heads']}, "
                f"d_p ∈ {s['head_dims']}; head-count axis: d_p = {s['fixed_head_dim']}, h ∈ {s['num_heads']}; "
                f"μP base d_p = {s['base_head_dim']}, h = {s['base_num_attention_heads']}.",
                "Slope of log mean |x_t − x_0| against log width at the last step (0 = flat: one learning rate "
                "moves every width alike):",
                format_slopes(result),
            ],
            [run],
        )
    )
