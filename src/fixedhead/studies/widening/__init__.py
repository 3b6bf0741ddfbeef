"""`fixedhead widen-experiment`: does widening the heads of a trained standard-head model help?

A model trained with standard heads (d_p = d/h, far below n) can be grown to larger heads exactly
(:func:`fixedhead.widen_heads`: same function, new weights that learn). Is that worth doing? One
standard-head causal LM (the *base*) is continued for the same number of extra steps in several *arms*:

* ``as-is``: the base model unchanged;
* ``wide-all``: every layer's heads widened to ``wide_head_dim`` (default: the causal threshold
  ⌈(n − 1)/2⌉ of :mod:`fixedhead.theory`);
* ``wide-early`` / ``wide-late``: only the first / last half of the layers widened;
* ``ffn-matched``: every feed-forward layer widened instead, exactly, to ``wide-all``'s parameter count:
  is it the head size or just the added parameters?

Seed s sets the continuation's data order (the same for every arm) and the widened models' new weights;
the base is one run, so the spread over seeds is the continuation's noise given that base. With
``learning_rates`` each arm's first seed chooses its rate. Arm B against arm A is judged by
:func:`fixedhead.studies.kit.stats.pooled_verdict`. The runs are ``base/``, ``start/ARM-sSEED/`` and
``continue/ARM-sSEED/``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ...checks import check_fields
from ...data import DataSettings
from ...data.lm import unigram_perplexity
from ...model.configuration import FixedHeadConfig
from ...model.sizes import count_parameters, training_flops
from ...runs import PRETRAIN_FILE, open_run
from ...theory import causal_threshold
from ...training.evaluate import load_run
from ...training.pretrain import lm_config, pretrain, train_or_reuse
from ...training.settings import TrainSettings
from ..kit import core
from ..kit.learning_rate import later_seed_needs, parse_rates, point_rate, selection_record, with_validation_split
from ..kit.recipes import RECIPES, get_recipe, with_steps
from ..kit.stats import RULE_STDS
from ..kit.study import Point, Study
from .arms import make_arms, max_logit_change, write_start
from .report import PLOT_FILE, report_markdown, summarise, write_plots


# ----------------------------------------------------------------------------------- design
@dataclass
class Widening:
    """What the experiment trains, resolved from its options: ``model`` (config fields of a standard-head
    model), ``base`` (its recipe from scratch), ``continuation`` (every arm's recipe, its ``seed`` replaced by
    each of ``seeds``) and the wide head size."""

    data: DataSettings
    model: dict
    base: TrainSettings
    continuation: TrainSettings
    seeds: tuple[int, ...]
    smoke: str = ""  # said first in the description of a study whose numbers mean nothing
    wide_head_dim: int | None = None
    options: WideningOptions | None = None

    @property
    def description(self) -> str:
        """The base model and the steps, written from the fields."""
        m, d, h = self.model, self.model["hidden_size"], self.model["num_attention_heads"]
        return (
            f"{self.smoke}a standard-head causal LM (d = {d}, h = {h}, d_p = {d // h}, {m['num_hidden_layers']} "
            f"layers, FFN {m['intermediate_size']}, n = {self.data.max_seq_length}, vocabulary "
            f"{self.data.vocab_size:,}, no dropout; {Path(self.data.corpus).name}), {self.base.max_steps} steps, "
            f"then {self.continuation.max_steps} more steps per arm"
        )


def base_and_continuation(base_steps: int, steps: int, batch: int, lr: float, logging: tuple[int, int]):
    """The base's and every continuation's causal-LM training settings: no Trainer evaluation (the
    held-out set is scored once, at the end) and no checkpoints (a run takes minutes)."""
    return tuple(
        with_steps(
            TrainSettings(batch_size=batch, learning_rate=lr, objective="clm", logging_steps=every, report_to=[]),
            n,
            evaluations=0,
            checkpoints=0,
        )
        for n, every in zip((base_steps, steps), logging, strict=True)
    )


# ------------------------------------------------------------------------------------ runner
def settings_record(p: Widening, wide_head_dim: int, selection: dict | None = None) -> dict:
    """The settings record stored runs are reused under: data, model, both recipes (seeds aside),
    wide size and, where arms choose their rates, the grid ``selection`` (through JSON, as
    results.json reads it back)."""

    def recipe(t):
        return {k: v for k, v in asdict(t).items() if k not in ("seed", "progress")}

    record = {
        "data": p.data.record(),
        "model": p.model,
        "base": {**recipe(p.base), "seed": p.base.seed},
        "continuation": recipe(p.continuation),
        "wide_head_dim": wide_head_dim,
        **({"learning_rate_selection": selection} if selection else {}),
    }
    return json.loads(json.dumps(record, default=str))


#: the names of :data:`PRESETS`
PRESET_NAMES = ("cpu", "tiny")


@dataclass(frozen=True)
class WideningOptions:
    """What ``fixedhead widen-experiment`` trains: a preset (:data:`PRESETS`: data, base model, recipes, seeds) and
    what a run changes of it; a field left None takes the preset's value."""

    preset: str = field(default="cpu", metadata={"choices": PRESET_NAMES})
    """the options to start from (cpu: the masked recipe's data and sizes at n = 32; tiny: a smoke test); the
    options given override it"""
    recipe: str | None = field(default=None, metadata={"choices": tuple(RECIPES)})
    """the data (and the FFN width) of the base model; every run trains as a causal LM"""
    hidden_size: int | None = field(default=None, metadata={"check": "positive"})
    """d of the base model"""
    num_attention_heads: int | None = field(default=None, metadata={"check": "positive"})
    """h of the base model (standard d_p = d/h)"""
    batch_size: int | None = field(default=None, metadata={"check": "positive"})
    """sequences per step of the base and every continuation"""
    learning_rate: float | None = field(default=None, metadata={"check": "positive_float"})
    """the peak rate of the base and (without a grid) every continuation"""
    logging_steps: tuple[int, ...] = field(default=None, metadata={"check": "positive"})
    """how often the base's and each continuation's training loss is logged (two values)"""
    seeds: tuple[int, ...] = field(default=None, metadata={"check": "non_negative", "distinct": True, "nonempty": True})
    """continuation seeds, in this order; the first chooses each arm's rate"""
    base_steps: int | None = field(default=None, metadata={"check": "positive"})
    """the base run's training steps"""
    steps: int | None = field(default=None, metadata={"check": "positive"})
    """each continuation's training steps"""
    head_dim: int | None = field(default=None, metadata={"check": "positive"})
    """the widened head size (None: the causal threshold ceil((n - 1)/2), 16 for n = 32)"""
    corpus: str | None = None
    """the recipe's corpus at another path (the same text, e.g. moved)"""
    learning_rates: tuple[float, ...] = ()
    """a grid each arm's continuation chooses its rate from on a validation split with the first seed
    (empty: --learning-rate for every arm)"""
    max_extensions: int = field(default=3, metadata={"check": "non_negative"})
    """how often the rate grid grows past an edge"""

    def __post_init__(self):
        check_fields(self)
        if self.preset not in PRESET_NAMES:
            raise ValueError(f"unknown widen-experiment preset {self.preset!r}; known: {', '.join(PRESET_NAMES)}")
        if self.logging_steps is not None and len(self.logging_steps) != 2:
            raise ValueError(f"logging_steps = {list(self.logging_steps)}: give two, the base's and a continuation's")
        if self.learning_rates:
            parse_rates(self.learning_rates)


#: the named options ``--preset NAME`` starts from (the options given override them)
PRESETS = {
    # the masked recipe's data and sizes at n = 32, as the committed run was made
    "cpu": WideningOptions(
        recipe="cpu-mlm",
        hidden_size=128,
        num_attention_heads=16,
        batch_size=128,
        learning_rate=1e-3,
        logging_steps=(25, 10),
        seeds=(1, 2, 3),
        base_steps=400,
        steps=100,
    ),
    "tiny": WideningOptions(
        preset="tiny",
        recipe="tiny",
        hidden_size=32,
        num_attention_heads=8,
        batch_size=16,
        learning_rate=2e-3,
        logging_steps=(5, 5),
        seeds=(1,),
        base_steps=20,
        steps=10,
    ),
}
#: the options a preset gives a value (None in a run's options: the preset's)
PRESET_FIELDS = (
    "recipe",
    "hidden_size",
    "num_attention_heads",
    "batch_size",
    "learning_rate",
    "logging_steps",
    "seeds",
    "base_steps",
    "steps",
)


def resolve(o: WideningOptions) -> WideningOptions:
    """``o`` with each field it leaves None of :data:`PRESET_FIELDS` at its preset's value, and the wide head size
    written out."""
    o = core.from_preset(PRESETS, o, PRESET_FIELDS, "widen-experiment")
    n = get_recipe(o.recipe).data.max_seq_length
    return replace(o, head_dim=o.head_dim if o.head_dim is not None else causal_threshold(n))


def spec(o: WideningOptions) -> Widening:
    """What ``o`` trains (its preset's values where it leaves them); ValueError for a base model that is not
    standard-head or a bad wide size."""
    o = resolve(o)
    r = get_recipe(o.recipe)
    data = replace(r.data, corpus=o.corpus) if o.corpus is not None else r.data
    model = r.model_fields(
        hidden_size=o.hidden_size, num_attention_heads=o.num_attention_heads, head_dim=None, num_hidden_layers=2
    )
    base, cont = base_and_continuation(o.base_steps, o.steps, o.batch_size, o.learning_rate, o.logging_steps)
    smoke = "a smoke test (numbers mean nothing): " if o.recipe == "tiny" else ""
    p = Widening(data, model, base, cont, o.seeds, smoke, o.head_dim, o)
    probe = FixedHeadConfig(**p.model, vocab_size=p.data.vocab_size)
    if probe.is_fixed_head:
        raise ValueError(f"the base model must have standard heads (head_dim=None), got {probe.head_dim!r}")
    make_arms(probe, o.head_dim, "head_dim")  # refuses a bad wide size, named as its option
    if o.learning_rates:
        p.data = with_validation_split(p.data)  # rates are chosen on text no run trains on
    return p


def _grid(o: WideningOptions, p: Widening) -> dict | None:
    if not o.learning_rates:
        return None
    rates = parse_rates(o.learning_rates)
    return {"grid": rates, "max_extensions": o.max_extensions, "validation_fraction": p.data.validation_fraction}


def state_of(p: Widening, results, meta: dict | None = None) -> dict:
    """What the summary, report and plots read: ``meta``, ``unigram_perplexity``, ``base``, ``runs`` (``{run
    key: run}``) and, with a rate grid, ``tuning`` (per arm)."""
    o, wide = p.options, p.wide_head_dim
    results = list(results)
    base = next((r for r in results if "base" in r), None)
    n, grid = p.data.max_seq_length, _grid(o, p)
    probe = FixedHeadConfig(**p.model, vocab_size=p.data.vocab_size)
    computed = {
        "settings": settings_record(p, wide, grid),
        "seeds": list(p.seeds),
        "n": n,
        "wide_head_dim": wide,
        "causal_threshold": causal_threshold(n),
        "arms": base["arms"] if base else [asdict(a) for a in make_arms(probe, wide)],
        "rule": {"stds": RULE_STDS},
        "continuation_tokens": p.continuation.max_steps * p.continuation.batch_size * n,
        "data_info": base["data_info"] if base else {},
        **({"learning_rate_selection": selection_record(**grid, seed=p.seeds[0])} if grid else {}),
    }
    state = {
        "meta": computed | (meta or {}),
        "unigram_perplexity": base["unigram_perplexity"] if base else None,
        "base": base["base"] if base else None,
        "runs": {k: v for r in results for k, v in r.get("runs", {}).items()},
    }
    if grid:
        state["tuning"] = {r["arm"]: r["tuning"] for r in results if "tuning" in r}
    return state


class WideningStudy(Study):
    """The study on the kit (:mod:`fixedhead.studies.kit.study`): the point ``base`` trains the base
    model, then one point per (arm, seed), seed-major, continues it. With a rate grid an arm's first
    seed trains every rate and keeps the best on the validation split; its other seeds train at that rate."""

    name = "widen-experiment"
    help = (
        "does widening help? a trained standard-head causal LM continued as is, widened (all, early, late "
        "layers) and with a parameter-matched wider FFN, with seeds; report and plot"
    )
    default_dir = "runs/{name}-{preset}"
    Options = WideningOptions
    quick = WideningOptions(preset="tiny")
    files = (PLOT_FILE, "learning_rates.png", "base", "start", "continue")
    points_only = ("seeds", "corpus")
    summarise = staticmethod(summarise)
    report = staticmethod(report_markdown)
    write_files = staticmethod(write_plots)

    def state(self, p, results, record=None):
        return state_of(p, results, record and record["meta"])

    def describe(self, p):
        return p.description

    def resolve(self, o):
        return spec(o)  # refuses a base model or wide size that cannot run

    def first_seed(self, p):
        return p.seeds[0] if p.options.learning_rates else None

    def plan(self, p):
        o, wide = p.options, p.wide_head_dim
        names = [a.name for a in make_arms(FixedHeadConfig(**p.model, vocab_size=p.data.vocab_size), wide)]
        first = p.seeds[0]  # every arm continues the base; with a rate grid, a later seed takes its first seed's rate

        def needs(a, s):
            return ("base", *later_seed_needs(o.learning_rates, s, first, core.run_key(a, seed=first)))

        arms = [Point(core.run_key(a, seed=s), (a, s), needs(a, s)) for a, s in core.seed_major(names, p.seeds)]
        return [Point("base", None), *arms]

    def plan_record(self, p):
        return {
            "pairing": "by seed: seed s is every arm's continuation data order (and the widened models' new weights)",
            "rule": {"stds": RULE_STDS},
        }

    def _data_and_config(self, p, progress):
        data = self.data(p.data, progress)
        return data, lm_config(FixedHeadConfig(**p.model, vocab_size=len(data.tokenizer)), data.tokenizer, "clm")

    def run(self, p, point, folder, done, progress):
        o, wide = p.options, p.wide_head_dim
        data, config = self._data_and_config(p, progress)
        n = p.data.max_seq_length
        base_dir = folder / "base"
        if point.key == "base":
            if progress:
                print(
                    f"\n[base] {base_dir}: d={config.hidden_size}, h={config.num_attention_heads}, "
                    f"d_p={config.head_size_label}, {count_parameters(config, pooler=False):,} parameters, "
                    f"{p.base.max_steps} steps",
                    flush=True,
                )
            base = train_or_reuse(config, data, base_dir, replace(p.base, progress=progress), self.overwriting)
            return {
                "base": {
                    **{k: v for k, v in base.items() if k != "eval_curve"},
                    "flops": training_flops(config, base["training_tokens"], n),
                },
                "unigram_perplexity": unigram_perplexity(data, p.base.eval_seed, "clm"),
                "arms": [asdict(a) for a in make_arms(config, wide)],
                "data_info": {k: v for k, v in data.info.items() if k != "prepare_seconds"},
                "train_seconds": base["train_seconds"],
            }
        name, seed = point.spec
        arm = next(a for a in make_arms(config, wide) if a.name == name)
        base_model = load_run(base_dir)[0].eval()
        runs: dict[str, dict] = {}

        def continue_arm(lr: float | None) -> dict:
            key = core.run_key(arm.name, lr, seed)
            run_dir = folder / "continue" / key
            if arm.head_dim is None and arm.intermediate_size is None:
                start, change = base_dir, 0.0
            else:
                start = folder / "start" / core.run_key(arm.name, seed=seed)  # the same start at every rate
                write_start(base_dir, arm, seed, start)
                change = max_logit_change(base_model, start, data.heldout[:16])
            train = replace(
                p.continuation,
                seed=seed,
                progress=progress,
                learning_rate=p.continuation.learning_rate if lr is None else lr,
            )
            resume = (run_dir / PRETRAIN_FILE).is_file() and not self.overwriting
            result = pretrain(None, data, run_dir, train, resume=resume, overwrite=self.overwriting, init_from=start)
            run_config = open_run(run_dir).config
            runs[key] = {
                **{k: v for k, v in result.items() if k not in ("eval_curve", "init_from")},
                # the start as a path inside the output folder (results.json stays true when the folder moves)
                "init_from": {
                    "path": start.relative_to(folder).as_posix(),
                    **{k: v for k, v in result["init_from"].items() if k != "path"},
                },
                "arm": arm.name,
                "seed": seed,
                "learning_rate": train.learning_rate,
                "layer_head_dims": run_config.layer_head_dims,
                "intermediate_size": run_config.intermediate_size,
                "flops": training_flops(run_config, result["training_tokens"], n),
                "start_max_logit_change": change,
            }
            if progress:
                print(
                    f"{key}: d_p {run_config.layer_head_dims}, FFN {run_config.intermediate_size}, "
                    f"{result['parameters']:,} parameters; held-out loss {result['heldout_loss']:.4f} "
                    f"(ppl {result['heldout_perplexity']:.1f}); start max |Δlogits| {change:.1e}; "
                    f"{result['train_seconds']:.0f} s",
                    flush=True,
                )
            return runs[key]

        out = {"arm": arm.name, "seed": seed}
        grid = parse_rates(o.learning_rates) if o.learning_rates else None
        first = done.get(core.run_key(arm.name, seed=p.seeds[0]))
        # without a grid the continuation's own rate, its runs keyed without one (ARM-sSEED)
        rate = point_rate(continue_arm, grid, seed, p.seeds[0], None, first, o.max_extensions)
        return (
            out
            | {k: v for k, v in rate.items() if v is not None}
            | {"runs": runs, "train_seconds": round(sum(r["train_seconds"] for r in runs.values()), 1)}
        )
