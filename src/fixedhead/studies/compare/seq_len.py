"""The sequence-length axis (``fixedhead seq-len``): does head size start to matter as n / d_p grows?

Theorem 1 ties the bottleneck to d_p *against the sequence length n*: a head can express an arbitrary
attention over n tokens only if d_p ≥ n (causal: ⌈(n − 1)/2⌉). The other text studies hold n and move d, h or
d_p; this one moves n. At fixed d and h, causal LMs with the standard d_p = d/h and a fixed d_p, fixedhead and
Llama-style, train at n ∈ ``lengths`` on the same tokens per step, each arm at its own rate, paired by seed.
Every model then goes through the rank intervention (:mod:`fixedhead.diagnostics.intervention`): the rank it needs per
layer and its *attention gain* (the loss it loses when attention is made uniform; a model that gains little
from attention cannot show a head-size effect through rank). The plot: against n / d_p of the small head, the
head-size gap (95% interval), the rank each arm needs and the attention gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...checks import check_fields, positive_int
from ...data import DataSettings
from ...training.settings import TrainSettings
from ..kit import core, render
from ..kit.learning_rate import chosen_rate, later_seed_needs, with_validation_split
from ..kit.recipes import get_recipe, with_steps
from ..kit.stats import difference_word, holm, mean_std, paired_difference, seeds_for
from ..kit.study import Point, Study


@dataclass(frozen=True)
class SeqLenOptions:
    """The study's plan: what is trained, how long, and how it is compared."""

    lengths: list[int] = field(default_factory=lambda: [32, 64, 128, 256], metadata={"distinct": True})
    """sequence lengths n (each trained at the same number of tokens per step)"""
    hidden_size: int = field(default=64, metadata={"check": "positive"})
    """d, the same for every model"""
    num_attention_heads: int = field(default=8, metadata={"check": "positive"})
    """h, the same for every model"""
    head_dims: list[int] = field(default_factory=lambda: [8, 32], metadata={"check": "positive", "distinct": True})
    """the head sizes compared: the first is the small one (the standard d/h), the last the large one"""
    architectures: list[str] = field(default_factory=lambda: ["fixedhead", "llama"], metadata={"distinct": True})
    """model families: fixedhead (learned positions, post-LN) and/or llama (rotary, pre-norm)"""
    tokens_per_step: int = field(default=2048, metadata={"check": "positive"})
    """batch size × n, the same at every n"""
    steps: int = field(default=700, metadata={"check": "positive"})
    """training steps of every run"""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"check": "non_negative", "distinct": True})
    """seeds, paired across arms (one seed: the same batches for every arm of one n)"""
    learning_rates: list[float] = field(default_factory=lambda: [1e-3, 2e-3, 4e-3])
    """the grid each arm chooses its rate from with the first seed (empty: every arm at shared_rate)"""
    shared_rate: float = field(default=2e-3, metadata={"check": "positive_float"})
    """the rate of every arm when --learning-rates is empty (a pilot), as make run's models chose at n = 64"""
    target: float = 0.02
    """nats: the smallest head-size gap the study must be able to see (the plan's power target)"""
    max_eval_tokens: int = field(default=32768, metadata={"check": "positive"})
    """held-out tokens the rank intervention scores per model"""
    ranks: list[int] = field(default_factory=list, metadata={"check": "positive", "distinct": True})
    """the ranks k the intervention tries (empty: every k up to min(d_p, n - 1) where that is at most 64, else 1-16
    and a geometric grid up to it)"""
    per_layer: bool = True
    """the intervention also cuts each layer alone (--no-per-layer: all layers together only)"""
    recipe: str = "cpu-clm"
    """the data and training recipe (corpus, vocabulary, optimizer, schedule) the runs share"""

    def __post_init__(self):
        check_fields(self)
        if not self.lengths or not self.seeds or len(self.head_dims) < 2:
            raise ValueError(
                f"give lengths, seeds and at least two head_dims, got lengths={self.lengths}, "
                f"seeds={self.seeds}, head_dims={self.head_dims}"
            )
        for n in self.lengths:
            if positive_int("lengths", n) < 3:  # a causal window needs a token to predict past its first two
                raise ValueError(f"lengths must be >= 3, got {n}")
            if n > self.tokens_per_step or self.tokens_per_step % n:
                raise ValueError(f"tokens_per_step = {self.tokens_per_step} is not a multiple of n = {n}")
        get_recipe(self.recipe)  # an unknown recipe is refused by name
        bad = [a for a in self.architectures if a not in ("fixedhead", "llama")]
        if bad or not self.architectures:
            raise ValueError(f"architectures must be fixedhead and/or llama, got {self.architectures}")
        if len(self.learning_rates) == 1 or any(not (r > 0 and math.isfinite(r)) for r in self.learning_rates):
            raise ValueError(
                f"learning_rates must be a grid of >= 2 positive rates or empty, got {self.learning_rates}"
            )
        if not (self.target > 0 and math.isfinite(self.target)):
            raise ValueError(f"target must be a positive number of nats, got {self.target}")


QUICK = SeqLenOptions(
    lengths=[32, 64],
    hidden_size=16,
    num_attention_heads=4,
    head_dims=[4, 8],
    architectures=["fixedhead", "llama"],
    tokens_per_step=128,
    steps=4,
    seeds=[0, 1],
    learning_rates=[],
    max_eval_tokens=256,
    recipe="tiny",
)


# -------------------------------------------------------------------------------------- plan
def arm_name(head_dim: int) -> str:
    return f"dp{head_dim}"


def plan_record(o: SeqLenOptions) -> dict:
    """What the plan states besides its options and points: arms, pairing, rule and the power target."""
    return {
        "arms": [
            {"n": n, "architecture": a, "head_dim": dp, "ratio": n / o.head_dims[0]}
            for n in o.lengths
            for a in o.architectures
            for dp in o.head_dims
        ],
        "pairing": "by seed: the arms of one (n, seed) train on the same batches in the same order; "
        "the gap is the large head's held-out loss minus the small head's, per seed",
        "target_nats": o.target,
        "interval": "95% t-interval of the mean paired gap over seeds",
        "rule": {
            "test": "paired t-test over seeds",
            "alpha": ALPHA,
            "correction": "Holm over the (n, architecture) gaps",
            "words": "fixedhead.studies.kit.stats.difference_word: decided (interval excludes 0 and Holm p < alpha), "
            "equivalent (interval inside ±target) or cannot tell (underpowered)",
        },
        "learning_rates": (
            {"grid": o.learning_rates, "chosen_with_seed": o.seeds[0], "on": "a validation split"}
            if o.learning_rates
            else {"shared": o.shared_rate, "note": "a pilot: one shared rate for every arm"}
        ),
    }


# ---------------------------------------------------------------------------------------- run
def compare_preset(o: SeqLenOptions, n: int, architecture: str, rates: dict[str, float] | None = None):
    """The :class:`~fixedhead.studies.compare.Comparison` of one (n, architecture): one model per head size."""
    from . import Comparison

    r = get_recipe(o.recipe)
    # always without the validation documents: a pilot and a tuned study train on the same text
    data: DataSettings = with_validation_split(replace(r.data, max_seq_length=n))
    train: TrainSettings = with_steps(
        replace(r.train, batch_size=o.tokens_per_step // n, learning_rate=o.shared_rate, objective="clm"),
        o.steps,
        evaluations=4,
        checkpoints=2,
    )
    fields = dict(num_hidden_layers=r.layers, max_position_embeddings=n, **r.shared_model)
    fields |= dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    extra = {} if architecture == "fixedhead" else {"architecture": architecture}
    models = {
        arm_name(dp): fields
        | dict(hidden_size=o.hidden_size, num_attention_heads=o.num_attention_heads)
        | {"head_dim": None if dp * o.num_attention_heads == o.hidden_size else dp}
        | extra
        for dp in o.head_dims
    }
    return Comparison(
        description=f"seq-len: n = {n}, d = {o.hidden_size}, h = {o.num_attention_heads}, d_p ∈ {o.head_dims}, "
        f"{architecture}, {o.steps} steps of {o.tokens_per_step} tokens",
        data=data,
        train=train,
        models=models,
        learning_rates=dict(rates or {}),
    )


class SeqLenStudy(Study):
    """One point per (n, architecture, seed): a ``fixedhead compare`` run of every head size in
    ``FOLDER/n{n}-{architecture}-s{seed}``, then the rank intervention on each model. The first seed chooses
    each arm's rate; the other seeds train at it."""

    name = "seq-len"
    help = "does head size matter more as n / d_p grows? causal LMs at several n, small vs large d_p, rank-cut"
    Options = SeqLenOptions
    quick = QUICK
    files = ("seq_len.png", "seq_len.csv", "n*-*")
    points_only = ("lengths", "seeds", "architectures", "target")
    states_plan = True

    def first_seed(self, o):
        return o.seeds[0] if o.learning_rates else None

    def plan(self, o):
        pairs = core.seed_major([(n, a) for n in o.lengths for a in o.architectures], o.seeds)
        first = o.seeds[0]  # a later seed trains at the rates its first seed chose

        def needs(n, a, s):
            return later_seed_needs(o.learning_rates, s, first, core.run_key(f"n{n}-{a}", seed=first))

        return [Point(core.run_key(f"n{n}-{a}", seed=s), (n, a, s), needs(n, a, s)) for (n, a), s in pairs]

    def plan_record(self, o):
        return plan_record(o)

    def run(self, o, point, folder, done, progress):
        from ...diagnostics.intervention import run_rank_curve
        from . import CompareOptions, spec, train_model

        n, arch, seed = point.spec
        first = seed == o.seeds[0]
        grid = o.learning_rates if (o.learning_rates and first) else None
        first_key = core.run_key(f"n{n}-{arch}", seed=o.seeds[0])
        chosen = None  # a later seed: each arm at the rate its first seed chose
        if o.learning_rates and not first:
            chosen = {arm_name(m["head_dim"]): chosen_rate(m) for m in done[first_key]["models"]}
        s = spec(CompareOptions(seed=seed, learning_rates=tuple(grid or ())), compare_preset(o, n, arch, chosen))
        data = self.data(s.data, progress)
        results = [train_model(s, name, data, folder / point.key, 3, self.overwriting, progress) for name in s.configs]
        models = []
        for r in results:
            run_dir = folder / point.key / r["run"]
            curve = run_rank_curve(
                run_dir, o.max_eval_tokens, o.ranks or None, progress=progress, per_layer=o.per_layer
            )
            curve["name"] = f"n{n}-{arch}-{r['name']}"
            models.append(
                {
                    "n": n,
                    "architecture": arch,
                    "head_dim": int(r["head_dim"]),
                    "seed": seed,
                    "learning_rate": r.get("learning_rate", o.shared_rate),
                    "heldout_loss": r["heldout_loss"],
                    "validation_loss": r.get("validation_loss"),
                    "run": str(run_dir),
                    "curve": curve,
                    **({"tuning": r["tuning"]} if "tuning" in r else {}),
                }
            )
        return {"models": models, "train_seconds": sum(r.get("train_seconds", 0) for r in results)}

    def summarise(self, state):
        return summarise(models(state["results"]), state["options"])

    def report(self, state):
        return report_markdown(state, state["options"])

    def write_files(self, state, folder):
        rows = state["summary"]
        if rows:
            render.write_csv(folder / "seq_len.csv", list(rows[0]), rows)
        plot(rows, state["options"], folder / "seq_len.png")


def models(results: list[dict]) -> list[dict]:
    """Every trained model of the points' ``results``, each with its rank curve's band and needed ranks
    (:func:`fixedhead.diagnostics.intervention.summarise`: the band is the seed spread over models of one name)."""
    from ...diagnostics.intervention import summarise as summarise_curves

    rows = [m for r in results for m in r["models"]]
    return [m | {"curve": c} for m, c in zip(rows, summarise_curves([m["curve"] for m in rows]), strict=True)]


# -------------------------------------------------------------------------------- summarise
ALPHA = 0.01  # the level of the study's rule, after Holm's correction over its gaps


def gap_row(large: list[float], small: list[float]) -> dict:
    """The paired gap large − small (nats, one value per seed on each side, same seed order):
    :func:`~fixedhead.studies.kit.stats.paired_difference`, or the bare difference with one seed."""
    if len(large) < 2:
        return {"gap": large[0] - small[0], "low": None, "high": None, "p": None, "sd": None, "seeds": len(large)}
    d = paired_difference(small, large)
    sd = mean_std([b - a for a, b in zip(small, large, strict=True)])[1]
    return {"gap": d["difference"], "low": d["low"], "high": d["high"], "p": d["p"], "sd": sd, "seeds": d["n"]}


def gap_word(row: dict, target: float) -> str:
    """:func:`~fixedhead.studies.kit.stats.difference_word` of a row with its Holm-adjusted p (``p_holm``)."""
    if row["low"] is None:
        return "cannot tell (one seed)"
    return difference_word(row["gap"], row["low"], row["high"], row["p_holm"], ALPHA, target)


def summarise(runs: list[dict], o: SeqLenOptions) -> list[dict]:
    """One row per (n, architecture): each arm's mean loss, needed rank (all layers) and attention gain;
    the paired gap large − small with its interval and word."""
    small, large = o.head_dims[0], o.head_dims[-1]
    rows = []
    for n in o.lengths:
        for arch in o.architectures:
            by = {
                dp: {r["seed"]: r for r in runs if (r["n"], r["architecture"], r["head_dim"]) == (n, arch, dp)}
                for dp in o.head_dims
            }
            seeds = sorted(set(by[small]) & set(by[large]))
            if not seeds:
                continue
            losses = {dp: [by[dp][s]["heldout_loss"] for s in seeds] for dp in (small, large)}
            row = {"n": n, "architecture": arch, "ratio": n / small, **gap_row(losses[large], losses[small])}
            for dp in o.head_dims:
                arm = list(by[dp].values())
                row[f"loss_dp{dp}"] = _mean([r["heldout_loss"] for r in arm])
                row[f"needed_dp{dp}"] = _mean([_nan(r["curve"]["needed"]["all"]) for r in arm])
                row[f"attention_gain_dp{dp}"] = _mean([r["curve"]["attention_gain"] for r in arm])
                row[f"rate_dp{dp}"] = arm[0]["learning_rate"]
            rows.append(row)
    tested = [r for r in rows if r["p"] is not None]
    for r, p in zip(tested, holm([r["p"] for r in tested]), strict=True):
        r["p_holm"] = p
    for r in rows:
        r.setdefault("p_holm", None)
        r["word"] = gap_word(r, o.target)
        # seeds that would see the target at this spread (Holm's worst case: alpha / number of gaps)
        r["seeds_for_target"] = None if r["sd"] is None else seeds_for(r["sd"], o.target, ALPHA / max(1, len(tested)))
    return rows


def _p(p):
    return "–" if p is None else f"{p:.2g}"


def _nan(value):
    return math.nan if value is None else value


def _mean(values):
    return sum(values) / len(values) if values else float("nan")


# ------------------------------------------------------------------------------------ outputs
def report_markdown(record: dict, o: SeqLenOptions) -> str:
    small, large = o.head_dims[0], o.head_dims[-1]
    rate = (
        f"each arm's rate chosen from {o.learning_rates} on a validation split with seed {o.seeds[0]}."
        if o.learning_rates
        else f"**every arm at one shared rate {o.shared_rate:g} (a pilot: no verdict)**."
    )
    grew = record["plan_history"]
    columns = [
        ("n", "{n}"),
        (f"n / {small}", "{ratio:g}"),
        ("architecture", "{architecture}"),
        *((f"loss d_p={dp}", f"{{loss_dp{dp}:.4f}}") for dp in (small, large)),
        ("gap [95% interval]", lambda r: f"{r['gap']:+.4f}" + _interval(r)),
        ("Holm p", lambda r: _p(r["p_holm"])),
        ("word", "{word}"),
        (f"seeds to see ±{o.target:g}", lambda r: r["seeds_for_target"] or "–"),
        (f"needed rank d_p={small} / {large}", f"{{needed_dp{small}:.1f}} / {{needed_dp{large}:.1f}}"),
        (
            f"attention gain d_p={small} / {large}",
            f"{{attention_gain_dp{small}:.3f}} / {{attention_gain_dp{large}:.3f}}",
        ),
        ("rates", f"{{rate_dp{small}:g}} / {{rate_dp{large}:g}}"),
    ]
    opening = [
        f"Causal LMs, d = {o.hidden_size}, h = {o.num_attention_heads}, head sizes d_p = {small} (small) and "
        f"{large} (large), n ∈ {o.lengths}, {o.steps} steps of {o.tokens_per_step} tokens, seeds {o.seeds} "
        f"(paired), recipe {o.recipe}; {rate}",
        f"Plan `plan.json`, sha256 `{record['plan_sha256']}`, written before the first run"
        + (f"; **the study grew after results existed** ({len(grew)} earlier plan(s))." if grew else "."),
        f"Gap = loss(d_p = {large}) − loss(d_p = {small}), nats, mean of the per-seed differences with its "
        f"95% interval; paired t-test, Holm over the rows, α = {ALPHA:g}; target: {o.target:g} nats (*seeds to "
        f"see ±{o.target:g}*: the seeds a paired test at α / rows needs for 80% power at this spread). Needed "
        "rank: the smallest k (all layers cut) within the band of the full-rank loss (`fixedhead "
        "rank-intervention`). Attention gain: the loss with uniform attention minus the full-rank loss.",
    ]
    table = render.Table(columns, record["summary"])
    return render.markdown(
        render.Report(
            "Sequence length against head size (`fixedhead seq-len`)",
            ["\n".join(opening), f"Command: `{record['meta']['command']}`", table],
        )
    )


def _interval(r: dict) -> str:
    return "" if r["low"] is None else f" [{r['low']:+.4f}, {r['high']:+.4f}]"


def plot(rows: list[dict], o: SeqLenOptions, path: Path) -> None:
    """Three panels against n / d_p(small): the paired gap with its interval, the needed rank per arm
    (the head sizes dotted), the attention gain per arm; one line per architecture."""
    from ...plotting import pyplot, save_figure

    plt = pyplot()
    small = o.head_dims[0]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for j, arch in enumerate(o.architectures):
        rs = sorted((r for r in rows if r["architecture"] == arch), key=lambda r: r["ratio"])  # lines left to right
        if not rs:
            continue
        x = [r["ratio"] for r in rs]
        low = [r["gap"] - (r["low"] if r["low"] is not None else r["gap"]) for r in rs]
        high = [(r["high"] if r["high"] is not None else r["gap"]) - r["gap"] for r in rs]
        axes[0].errorbar(x, [r["gap"] for r in rs], yerr=[low, high], marker="o", capsize=3, label=arch, color=f"C{j}")
        for i, dp in enumerate(o.head_dims):
            style = dict(color=f"C{j}", ls="-" if i == 0 else "--", marker="o")
            axes[1].plot(x, [r[f"needed_dp{dp}"] for r in rs], label=f"{arch} d_p={dp}", **style)
            axes[2].plot(x, [r[f"attention_gain_dp{dp}"] for r in rs], label=f"{arch} d_p={dp}", **style)
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[0].axhspan(-o.target, o.target, color="grey", alpha=0.15, label=f"±{o.target:g} nats")
    for dp in o.head_dims:
        axes[1].axhline(dp, color="grey", ls=":", lw=0.8)
    titles = (
        f"gap: loss(d_p={o.head_dims[-1]}) − loss(d_p={small}), nats",
        "rank needed (all layers)",
        "attention gain (uniform − full), nats",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"n / d_p (d_p = {small})")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, path, axes)
