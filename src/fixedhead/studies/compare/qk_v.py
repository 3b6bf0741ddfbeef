"""Logit rank or value width (``fixedhead qk-v``): what carries a larger head's lead?

Theorem 1 bounds the rank of a head's logits Q Kᵀ by the size of its queries and keys (``qk_head_dim``); a
larger head also carries wider values (``v_head_dim``), and the fixed-head design changes both. At n = 256
(``docs/results/seq-len-long``) d_p = 32 causal LMs lead d_p = 8 ones by 0.035–0.060 nats yet lose at most
0.002 nats when cut to rank 8. This study separates the two: a 2 × 2 of causal LMs, (qk, v) ∈ {small,
large}², each arm at its own learning rate, paired by seed. Per seed, the main effect of qk (mean over v of
loss(qk large) − loss(qk small)), of v, and the interaction (L,L) − (L,S) − (S,L) + (S,S); each with its paired
95% t-interval over seeds, Holm over the three at α = 0.01, against a smallest effect of interest
(``target``, nats). Negative: the larger size lowers the loss.

The defaults are the setting where the lead was measured: n = 256, d = 64, h = 8 (small = d/h = 8, large =
32), recipe ``cpu-clm``. The seeds are sized before any run from a pilot's paired sd (:data:`PILOT_SD`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ...checks import check_fields
from ..kit import core, render
from ..kit.learning_rate import chosen_rate, later_seed_needs
from ..kit.stats import difference_word, holm, mean_std, paired_difference, seeds_for
from ..kit.study import Point, Study
from .seq_len import SeqLenOptions, compare_preset

#: nats: the sd of the per-seed paired gap loss(d_p = 32) − loss(d_p = 8) of seq-len-long's fixedhead
#: models (5.7M tokens, d = 64, h = 8, seeds 0 and 1), pooled over n = 256, 128 and 64 (one degree of
#: freedom each: sds 0.0025, 0.0165, 0.0035; pooled √(mean of the variances) = 0.00986). Recomputed from
#: docs/results/seq-len-long/results.json by tests/studies/test_qk_v.py.
PILOT_SD = 0.0099
#: the level of the rule, after Holm's correction over the three effects
ALPHA = 0.01
#: the three effects the summary tests, in order
EFFECTS = ("qk", "v", "interaction")


@dataclass(frozen=True)
class QkVOptions:
    """The study's plan: what is trained, how long, and how it is compared."""

    n: int = field(default=256, metadata={"check": "positive"})
    """tokens per sequence (the learned positions)"""
    hidden_size: int = field(default=64, metadata={"check": "positive"})
    """d: seq-len-long's, where the lead was measured"""
    num_attention_heads: int = field(default=8, metadata={"check": "positive"})
    """h: seq-len-long's, where the lead was measured"""
    head_dims: list[int] = field(default_factory=lambda: [8, 32], metadata={"check": "positive"})
    """the small and the large size, for queries/keys and for values alike (the arms are their 2 × 2)"""
    tokens_per_step: int = field(default=2048, metadata={"check": "positive"})
    """batch size × n"""
    steps: int = field(default=2800, metadata={"check": "positive"})
    """training steps of every model"""
    seeds: list[int] = field(
        default_factory=lambda: list(range(8)), metadata={"check": "non_negative", "nonempty": True, "distinct": True}
    )
    """seeds, paired across the arms; 8: enough to see --target at α = 0.01 over three tests (Holm), from the
    pilot's paired sd"""
    learning_rates: list[float] = field(default_factory=lambda: [1e-3, 2e-3, 4e-3])
    """the grid each arm chooses its rate from with the first seed (empty: every arm at --shared-rate, a pilot)"""
    max_extensions: int = field(default=3, metadata={"check": "non_negative"})
    """how often an arm's grid grows past an edge"""
    shared_rate: float = field(default=2e-3, metadata={"check": "positive_float"})
    """the rate of every arm when --learning-rates is empty (seq-len-long's)"""
    target: float = 0.02
    """nats: the smallest effect the study must be able to see"""
    pilot_sd: float = PILOT_SD
    """nats: the pilot's sd of a paired gap between two models, which sizes the seeds"""
    recipe: str = "cpu-clm"
    """the data and training recipe (corpus, vocabulary, optimizer, schedule) the runs share"""

    def __post_init__(self):
        check_fields(self)
        if len(self.head_dims) != 2 or self.head_dims[0] >= self.head_dims[1]:
            raise ValueError(f"head_dims must be a small and a larger size, got {self.head_dims}")
        if not (self.pilot_sd >= 0 and math.isfinite(self.pilot_sd)):
            raise ValueError(f"pilot_sd must be a finite number of nats >= 0, got {self.pilot_sd}")
        seq_len_options(self)  # n, tokens per step, seeds, grid, target and recipe, checked as seq-len checks them


def seq_len_options(o: QkVOptions) -> SeqLenOptions:
    """The seq-len options of one fixedhead pair at ``o``'s n, size and budget: the data and training
    settings the arms share are seq-len's (:func:`~fixedhead.studies.compare.seq_len.compare_preset`)."""
    return SeqLenOptions(
        lengths=[o.n],
        hidden_size=o.hidden_size,
        num_attention_heads=o.num_attention_heads,
        head_dims=list(o.head_dims),
        architectures=["fixedhead"],
        tokens_per_step=o.tokens_per_step,
        steps=o.steps,
        seeds=list(o.seeds),
        learning_rates=list(o.learning_rates),
        shared_rate=o.shared_rate,
        target=o.target,
        recipe=o.recipe,
    )


QUICK = QkVOptions(
    n=16,
    hidden_size=16,
    num_attention_heads=4,
    head_dims=[4, 8],
    tokens_per_step=64,
    steps=3,
    seeds=[0, 1],
    learning_rates=[1e-3, 3e-3],
    max_extensions=0,
    recipe="tiny",
)


def arms(o: QkVOptions) -> list[tuple[int, int]]:
    """The (qk_head_dim, v_head_dim) of every arm: (S, S), (S, L), (L, S), (L, L)."""
    return [(qk, v) for qk in o.head_dims for v in o.head_dims]


def arm_name(qk: int, v: int) -> str:
    return f"qk{qk}-v{v}"


def arm_fields(o: QkVOptions, qk: int, v: int) -> dict:
    """An arm's head-size fields: one ``head_dim`` where queries, keys and values share a size (None for the
    standard d/h, so the diagonal arms are seq-len's models), else ``qk_head_dim`` and ``v_head_dim``."""
    if qk == v:
        return {"head_dim": None if qk * o.num_attention_heads == o.hidden_size else qk}
    return {"head_dim": None, "qk_head_dim": qk, "v_head_dim": v}


def arm_preset(o: QkVOptions, rates: dict[str, float] | None = None):
    """The :class:`~fixedhead.studies.compare.Comparison` of the four arms: seq-len's data and training
    settings at ``o.n``, its model fields with each arm's head sizes; ``rates``: each arm's chosen rate."""
    pair = compare_preset(seq_len_options(o), o.n, "fixedhead", rates)
    base = next(iter(pair.models.values()))
    models = {arm_name(qk, v): base | arm_fields(o, qk, v) for qk, v in arms(o)}
    small, large = o.head_dims
    description = (
        f"qk-v: fixedhead causal LMs, n = {o.n}, d = {o.hidden_size}, h = {o.num_attention_heads}, "
        f"(qk_head_dim, v_head_dim) ∈ {{{small}, {large}}}², {o.steps} steps of {o.tokens_per_step} tokens"
    )
    return replace(pair, models=models, description=description)


# --------------------------------------------------------------------------------- summarise
def effects(losses: dict[tuple[int, int, int], float], o: QkVOptions) -> dict:
    """The three effects over the seeds every arm finished. ``losses``: {(qk, v, seed): held-out loss, nats}.

    Per seed: qk = ((L,S) − (S,S) + (L,L) − (S,L)) / 2, v = ((S,L) − (S,S) + (L,L) − (L,S)) / 2, interaction =
    (L,L) − (L,S) − (S,L) + (S,S), each a paired difference of two per-seed values. Returns ``{"seeds",
    "per_seed": {effect: [...]}, "rows": [...]}``; with one seed no interval (``low`` None)."""
    small, large = o.head_dims
    seeds = [s for s in o.seeds if all((qk, v, s) in losses for qk, v in arms(o))]

    def arm(qk, v):
        return [losses[(qk, v, s)] for s in seeds]

    ss, sl, ls, ll = arm(small, small), arm(small, large), arm(large, small), arm(large, large)

    def mean(x, y, w):  # per seed: w · (x + y)
        return [w * (a + b) for a, b in zip(x, y, strict=True)]

    sides = {  # (a, b): the effect per seed is b − a
        "qk": (mean(ss, sl, 0.5), mean(ls, ll, 0.5)),
        "v": (mean(ss, ls, 0.5), mean(sl, ll, 0.5)),
        "interaction": (mean(ls, sl, 1.0), mean(ll, ss, 1.0)),
    }
    rows, per_seed = [], {}
    for name, (a, b) in sides.items():
        diffs = [y - x for x, y in zip(a, b, strict=True)]
        per_seed[name] = diffs
        row = {"effect": name, "estimate": sum(diffs) / len(diffs) if diffs else math.nan}
        row |= {"low": None, "high": None, "p": None, "sd": None, "seeds_for_target": None}
        if len(seeds) >= 2:
            d = paired_difference(a, b)
            sd = mean_std(diffs)[1]
            row |= {"low": d["low"], "high": d["high"], "p": d["p"], "sd": sd}
            row["seeds_for_target"] = _seeds_for(sd, o.target)
        rows.append(row)
    tested = [r for r in rows if r["p"] is not None]
    for r, p in zip(tested, holm([r["p"] for r in tested]), strict=True):
        r["p_holm"] = p
    for r in rows:
        r.setdefault("p_holm", None)
        if not seeds:
            r["word"] = "no seed has finished every arm"
        elif r["low"] is None:
            r["word"] = "cannot tell (one seed)"
        else:
            r["word"] = difference_word(r["estimate"], r["low"], r["high"], r["p_holm"], ALPHA, o.target)
    return {"seeds": seeds, "per_seed": per_seed, "rows": rows}


def _seeds_for(sd: float, target: float) -> int | None:
    """:func:`seeds_for` at α / 3 (Holm's worst case over the three effects); None beyond its 100,000 seeds."""
    try:
        return seeds_for(sd, target, ALPHA / len(EFFECTS))
    except ValueError:
        return None


def summarise(results: list[dict], o: QkVOptions) -> dict:
    """Each arm's mean held-out loss, sd and rate, and :func:`effects`."""
    losses = {(r["qk_head_dim"], r["v_head_dim"], r["seed"]): r["heldout_loss"] for r in results}
    table = []
    for qk, v in arms(o):
        mine = [r for r in results if (r["qk_head_dim"], r["v_head_dim"]) == (qk, v)]
        m, s = mean_std([r["heldout_loss"] for r in mine])
        rates = sorted({r["learning_rate"] for r in mine})
        table.append({"qk_head_dim": qk, "v_head_dim": v, "seeds": len(mine), "loss": m, "sd": s, "rates": rates})
    return {"arms": table} | effects(losses, o)


# --------------------------------------------------------------------------------- plan
def sizing(o: QkVOptions) -> dict:
    """The seeds each effect needs at the pilot's sd (80% power, paired t-test at α / 3), under independent
    noise per model: a main effect's per-seed sd is the pilot gap's / √2 (four models at weight ½), the
    interaction's √2 times it; ``gap``: the pilot's own two-model contrast."""
    level = ALPHA / len(EFFECTS)
    sds = {"gap": o.pilot_sd, "main": o.pilot_sd / math.sqrt(2), "interaction": o.pilot_sd * math.sqrt(2)}
    return {
        "pilot_sd": o.pilot_sd,
        "pilot": "seq-len-long's fixedhead paired gaps loss(d_p = 32) − loss(d_p = 8), seeds 0 and 1, sd pooled "
        "over n = 256, 128 and 64",
        "target_nats": o.target,
        "alpha": level,
        "power": 0.8,
        "sd": sds,
        "seeds_for": {k: seeds_for(sd, o.target, level) for k, sd in sds.items()},
        "seeds_planned": len(o.seeds),
        "sized_on": "gap: enough for either main effect even if its two halves move together",
    }


def plan_record(o: QkVOptions) -> dict:
    small, large = o.head_dims
    return {
        "arms": [{"name": arm_name(qk, v), "qk_head_dim": qk, "v_head_dim": v} for qk, v in arms(o)],
        "pairing": "by seed: the four arms of one seed train on the same batches in the same order and are "
        "scored on the same held-out tokens; every effect is a per-seed contrast of the four losses",
        "effects": {
            "qk": f"((qk{large},v{small}) − (qk{small},v{small}) + (qk{large},v{large}) − (qk{small},v{large})) / 2",
            "v": f"((qk{small},v{large}) − (qk{small},v{small}) + (qk{large},v{large}) − (qk{large},v{small})) / 2",
            "interaction": f"(qk{large},v{large}) − (qk{large},v{small}) − (qk{small},v{large}) + (qk{small},v{small})",
        },
        "interval": "95% t-interval of the mean per-seed effect",
        "rule": {
            "test": "paired t-test over seeds",
            "alpha": ALPHA,
            "correction": "Holm over the three effects",
            "words": "fixedhead.studies.kit.stats.difference_word: decided (interval excludes 0 and Holm p < alpha), "
            "equivalent (interval inside ±target) or cannot tell (underpowered)",
        },
        "target_nats": o.target,
        "sizing": sizing(o),
        "learning_rates": (
            {"grid": o.learning_rates, "max_extensions": o.max_extensions, "chosen_with_seed": o.seeds[0]}
            | {"on": "a validation split", "later_seeds": "train at the rate their arm chose (needs)"}
            if o.learning_rates
            else {"shared": o.shared_rate, "note": "a pilot: one shared rate for every arm"}
        ),
    }


class QkVStudy(Study):
    """One point per (arm, seed): a causal LM in ``FOLDER/qkQK-vV-sSEED``; the first seed chooses each arm's
    rate, a later seed trains at it."""

    name = "qk-v"
    help = "what carries a larger head's lead: the rank of its logits (qk_head_dim) or its values' width (v_head_dim)?"
    Options = QkVOptions
    quick = QUICK
    files = ("qk_v.csv", "qk*-v*-s*")
    points_only = ("seeds", "target", "pilot_sd")
    states_plan = True

    def first_seed(self, o):
        return o.seeds[0] if o.learning_rates else None

    def describe(self, o):
        return arm_preset(o).description

    def check(self, o):
        from ...model.architectures import build_config

        for fields in arm_preset(o).models.values():  # every arm buildable before any slow work
            build_config({**fields, "vocab_size": 100})

    def plan(self, o):
        first = o.seeds[0]

        def needs(qk, v, s):
            return later_seed_needs(o.learning_rates, s, first, core.run_key(arm_name(qk, v), seed=first))

        return [
            Point(core.run_key(arm_name(qk, v), seed=s), (qk, v, s), needs(qk, v, s))
            for (qk, v), s in core.seed_major(arms(o), o.seeds)
        ]

    def plan_record(self, o):
        return plan_record(o)

    def run(self, o, point, folder, done, progress):
        from . import CompareOptions, spec, train_model

        qk, v, seed = point.spec
        name = arm_name(qk, v)
        grid = o.learning_rates if (o.learning_rates and seed == o.seeds[0]) else None
        chosen = None
        if o.learning_rates and not grid:
            chosen = {name: chosen_rate(done[core.run_key(name, seed=o.seeds[0])])}
        options = CompareOptions(seed=seed, learning_rates=tuple(grid or ()), max_extensions=o.max_extensions)
        s = spec(options, arm_preset(o, chosen))
        data = self.data(s.data, progress)
        r = train_model(s, name, data, folder / point.key, o.max_extensions, self.overwriting, progress)
        return {
            "qk_head_dim": qk,
            "v_head_dim": v,
            "seed": seed,
            "learning_rate": r.get("learning_rate", o.shared_rate),
            "heldout_loss": r["heldout_loss"],
            "validation_loss": r.get("validation_loss"),
            "parameters": r.get("parameters"),
            "run": f"{point.key}/{r['run']}",
            "train_seconds": r.get("train_seconds", 0),
            **({"tuning": r["tuning"]} if "tuning" in r else {}),
        }

    def summarise(self, state):
        return summarise(state["results"], state["options"])

    def report(self, state):
        return report_markdown(state, state["options"])

    def write_files(self, state, folder):
        columns = ["qk_head_dim", "v_head_dim", "seed", "learning_rate", "heldout_loss", "validation_loss"]
        render.write_csv(folder / "qk_v.csv", columns + ["parameters"], state["results"])


# ------------------------------------------------------------------------------------ report
LABELS = {"qk": "qk_head_dim (logit rank)", "v": "v_head_dim (value width)", "interaction": "interaction"}


def _interval(r: dict) -> str:
    return "" if r["low"] is None else f" [{r['low']:+.4f}, {r['high']:+.4f}]"


def _number(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.4f}"


def _estimate(r: dict) -> str:
    return "–" if math.isnan(r["estimate"]) else f"{r['estimate']:+.4f}{_interval(r)}"


def words(summary: dict, o: QkVOptions) -> list[str]:
    """One sentence per effect: its estimate, interval and :func:`difference_word`."""
    small, large = o.head_dims
    out = []
    for r in summary["rows"]:
        what = (
            f"Raising {LABELS[r['effect']]} from {small} to {large}"
            if r["effect"] != "interaction"
            else "How much raising one size changes the other's effect"
        )
        nats = "" if math.isnan(r["estimate"]) else f" {r['estimate']:+.4f} nats{_interval(r)},"
        out.append(f"- {what}:{nats} **{r['word']}**.")
    return out


def report_markdown(record: dict, o: QkVOptions) -> str:
    summary = record["summary"]
    small, large = o.head_dims
    rate = (
        f"each arm's rate chosen from {o.learning_rates} on a validation split with seed {o.seeds[0]}"
        if o.learning_rates
        else f"**every arm at one shared rate {o.shared_rate:g} (a pilot)**"
    )
    history = record.get("plan_history") or []
    finished = summary["seeds"]
    partial = (
        [
            f"**Partial: {len(finished)} of the planned {len(o.seeds)} seeds have finished every arm"
            + (f" (seeds {finished})" if finished else "")
            + f"; the effects and intervals are over those seeds alone, and the rule was sized for {len(o.seeds)}.**"
        ]
        if len(finished) < len(o.seeds)
        else []
    )
    opening = [
        f"Fixedhead causal LMs, n = {o.n}, d = {o.hidden_size}, h = {o.num_attention_heads}, queries/keys of size "
        f"qk ∈ {{{small}, {large}}} crossed with values of size v ∈ {{{small}, {large}}}, {o.steps} steps of "
        f"{o.tokens_per_step} tokens, seeds {o.seeds} (paired), recipe {o.recipe}; {rate}.",
        f"Plan `plan.json`, sha256 `{record['plan_sha256']}`, written before the first run"
        + (f"; **the study grew after results existed** ({len(history)} earlier plan(s))." if history else "."),
        f"Effects in nats of held-out loss (negative: the larger size lowers it), per seed then averaged, with the "
        f"paired 95% interval; paired t-test, Holm over the three, α = {ALPHA:g}; smallest effect of interest "
        f"{o.target:g} nats (*seeds to see ±{o.target:g}*: what 80% power at α / 3 needs at this spread; before any "
        f"run, the pilot's sd {o.pilot_sd:g} asked for {sizing(o)['seeds_for']['gap']} seeds, plan.json's `sizing`).",
        *partial,
    ]
    arms = [
        *((h, f"{{{h}}}") for h in ("qk_head_dim", "v_head_dim", "seeds")),
        ("held-out loss", lambda a: _number(a["loss"])),
        ("sd", lambda a: _number(a["sd"])),
        ("rate", lambda a: ", ".join(f"{x:g}" for x in a["rates"])),
    ]
    effects = [
        ("effect", lambda r: LABELS[r["effect"]]),
        ("estimate [95% interval]", _estimate),
        ("Holm p", lambda r: "–" if r["p_holm"] is None else f"{r['p_holm']:.2g}"),
        ("word", "{word}"),
        (f"seeds to see ±{o.target:g}", lambda r: r["seeds_for_target"] or "–"),
    ]
    return render.markdown(
        render.Report(
            "Logit rank or value width (`fixedhead qk-v`)",
            [
                "\n".join(opening),
                f"Command: `{record['meta']['command']}`",
                render.Table(arms, summary["arms"]),
                render.Table(effects, summary["rows"]),
                words(summary, o),
            ],
        )
    )
