"""`fixedhead finetune-sweep SWEEP_DIR`: the paper's fine-tuning claims (Tables 1, 2A, 2B, Fig. 2)
with enough fine-tuning seeds to decide them.

Every pretrained checkpoint of a masked sweep (``SWEEP_DIR/runs/NAME``) is fine-tuned on one GLUE task,
at a rate its first fine-tuning seed chooses on the validation split carved out of GLUE train (never GLUE
dev, the reported test set); every fine-tuning seed then trains at it. A checkpoint's score is the mean GLUE
dev score over its fine-tuning seeds, so a claim compares pretraining seeds with less fine-tuning noise.
Claims are judged under :data:`~fixedhead.studies.kit.stats.CLAIMS_RULE` (Holm counts the sweep's
pretraining claims too); whether fine-tuning tracks pretraining is Spearman's ρ over checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ...checks import check_fields
from ...data.glue import GLUE_DEV_EXAMPLES, MAIN_METRIC, get_glue_task, glue_path
from ...runs import file_digest, model_fingerprint
from ...training.finetune import FINETUNE_FILE, FinetuneSettings, finetune
from ..kit import core, render
from ..kit.learning_rate import later_seed_needs, parse_rates, plot_learning_rates, point_rate
from ..kit.stats import CLAIMS_RULE, mean_std, pm, rule_text, spearman
from ..kit.study import Point, Study
from . import load_sweep
from .claims import claims, verdict_rule
from .presets import get_sweep_preset

#: the grid each checkpoint chooses its rate from by default (the masked sweep fine-tunes at 1e-3)
DEFAULT_RATES = (3e-4, 1e-3, 3e-3)
#: the fine-tuning seeds of every checkpoint when none are given (the command line's and Python's)
DEFAULT_SEEDS = (0, 1, 2)
PLOT_FILE = "learning_rates.png"


@dataclass(frozen=True)
class FinetuneSweepOptions:
    """What ``fixedhead finetune-sweep`` fine-tunes: the checkpoints of one masked sweep, on one GLUE task."""

    sweep_dir: str = field(default="", metadata={"positional": True})
    """a sweep folder with checkpoints (fixedhead sweep --preset cpu-mlm)"""
    task: str = field(default="sst2", metadata={"choices": tuple(MAIN_METRIC)})
    """the GLUE task"""
    seeds: tuple[int, ...] = field(
        default=DEFAULT_SEEDS, metadata={"check": "non_negative", "nonempty": True, "distinct": True}
    )
    """fine-tuning seeds of every checkpoint; the first chooses its rate"""
    learning_rates: tuple[float, ...] = DEFAULT_RATES
    """the grid each checkpoint chooses its fine-tuning rate from (highest validation score)"""
    max_extensions: int = field(default=1, metadata={"check": "non_negative"})
    """rates added past an edge of the grid (one grid step each)"""
    steps: int | None = field(default=None, metadata={"check": "positive"})
    """fine-tuning steps of every run (None: the sweep's fine-tuning settings)"""
    checkpoints: tuple[str, ...] = ()
    """fine-tune only these of the sweep's checkpoints, by run folder (empty: every saved one)"""

    def __post_init__(self):
        check_fields(self)
        parse_rates(self.learning_rates)  # a grid of >= 2 positive rates, named when not


def saved_checkpoints(sweep: dict, sweep_dir: Path) -> list[str]:
    """The sweep's run folders that hold a model (``runs/NAME/model.safetensors``), by name."""
    return [n for n in sorted(sweep["runs"]) if (sweep_dir / "runs" / n / "model.safetensors").is_file()]


def state_of(o: FinetuneSweepOptions, results, meta: dict | None = None) -> dict:
    """The study's state as its report reads it: ``meta`` (a stored one's values win, so an older study reads
    as it was), ``tuning`` (``{checkpoint: its rate's choice}``) and ``runs`` (every fine-tuning run)."""
    order = {(c, s): i for i, (c, s) in enumerate((c, s) for c in o.checkpoints for s in o.seeds)}
    results = sorted(results, key=lambda r: order.get((r["checkpoint"], r["seed"]), len(order)))  # by checkpoint
    first = next((r for r in results if "tuning" in r), {})
    settings = {
        "task": o.task,
        "seeds": list(o.seeds),
        "grid": parse_rates(o.learning_rates),
        "max_extensions": o.max_extensions,
        "finetune": first.get("finetune", {}),
    }
    computed = {
        "settings": settings,
        "sweep": o.sweep_dir,
        "checkpoints": list(o.checkpoints),
        "verdict": dict(CLAIMS_RULE),
        "verdict_rule": rule_text(CLAIMS_RULE),
    }
    return {
        "meta": {**computed, **(meta or {})},
        "tuning": {r["checkpoint"]: r["tuning"] for r in results if "tuning" in r},
        "runs": {k: v for r in results for k, v in r["runs"].items()},
    }


class FinetuneSweepStudy(Study):
    """The fine-tuning seeds on the kit (:mod:`fixedhead.studies.kit.study`): one point per (checkpoint,
    fine-tuning seed), seed-major; a checkpoint's first seed chooses its rate on the grid, the other seeds
    train at it. Its default folder is ``SWEEP_DIR/finetune-TASK``."""

    name = "finetune-sweep"
    help = (
        "fine-tuning claims with several fine-tuning seeds per checkpoint of a masked sweep, each checkpoint "
        "at its own rate (chosen with the first seed on the split carved out of GLUE train)"
    )
    default_dir = "{sweep_dir}/finetune-{task}"
    Options = FinetuneSweepOptions
    quick = FinetuneSweepOptions(seeds=(0,), learning_rates=(1e-3, 3e-3), max_extensions=0, steps=4)
    files = ("runs", PLOT_FILE, "finetune.json")  # finetune.json: the record before the kit (its runs are reused)
    points_only = ("seeds", "checkpoints")
    paths = ("sweep_dir",)  # a moved sweep is the same input: each point checks its checkpoint's fingerprint
    state_of = staticmethod(state_of)

    def describe(self, o):
        return (
            f"Every checkpoint of {Path(o.sweep_dir).name} fine-tuned on GLUE {o.task} with seeds {list(o.seeds)}, "
            "each checkpoint at its own rate"
        )

    def __init__(self, cache_dir=None):
        super().__init__(cache_dir)
        self._read: dict = {}  # sweeps and checkpoint fingerprints, read once

    def sweep(self, path) -> dict:
        """:func:`~fixedhead.studies.sweep.load_sweep` of ``path``, read once per study object (every point and
        the report read the same sweep)."""
        key = str(Path(path).resolve())
        if key not in self._read:
            self._read[key] = load_sweep(path)
        return self._read[key]

    def sweep_dir(self, o) -> Path:
        """The sweep: the folder this study's folder sits in where it is in its default place
        (``SWEEP_DIR/finetune-TASK``, so the two move together), else ``o.sweep_dir``."""
        parent = self.folder.parent if self.folder and self.folder.name.startswith("finetune-") else None
        if parent is not None and any((parent / f).is_file() for f in ("results.json", "sweep.json")):
            return parent
        return Path(o.sweep_dir)

    def resolve(self, o):
        if o.checkpoints or not o.sweep_dir:
            return o
        return replace(o, checkpoints=tuple(saved_checkpoints(self.sweep(o.sweep_dir), Path(o.sweep_dir))))

    def check(self, o):
        """The task, its GLUE files and the sweep (masked, with saved checkpoints), before any work."""
        get_glue_task(o.task)  # an unknown task fails before any work
        if not o.sweep_dir:
            raise ValueError("sweep_dir names no folder: pass the sweep to fine-tune (fixedhead sweep's output)")
        sweep = self.sweep(o.sweep_dir)
        if (objective := sweep["meta"].get("objective", "mlm")) != "mlm":
            raise ValueError(f"{o.sweep_dir} is a {objective!r} sweep; only masked LMs are fine-tuned on GLUE")
        for split in ("train", "dev"):
            if not glue_path(o.task, split).is_file():
                raise FileNotFoundError(f"GLUE {o.task} {split} data not found at {glue_path(o.task, split)}")
        saved = saved_checkpoints(sweep, Path(o.sweep_dir))
        if not o.checkpoints:
            raise ValueError(f"{o.sweep_dir}: no finished checkpoint (runs/NAME/model.safetensors) to fine-tune")
        if (bad := core.first_unknown(o.checkpoints, saved)) is not None:
            raise ValueError(f"checkpoint {bad!r} is not a saved run of {o.sweep_dir} (its checkpoints: {saved})")

    def first_seed(self, o):
        return o.seeds[0]

    def plan(self, o):
        first = o.seeds[0]  # a later seed fine-tunes at the rate the first seed chose for its checkpoint
        return [
            Point(
                core.run_key(f"{c}-ft", seed=s),
                (c, s),
                later_seed_needs(o.learning_rates, s, first, core.run_key(f"{c}-ft", seed=first)),
            )
            for c, s in core.seed_major(o.checkpoints, o.seeds)
        ]

    def plan_record(self, o):
        return {
            "rate_rule": "each checkpoint's highest validation score (the split carved out of GLUE train)",
            "rates_chosen_with_seed": o.seeds[0],
            "verdict_rule": rule_text(CLAIMS_RULE) + "; Holm counts the sweep's pretraining claims too",
        }

    def settings(self, o) -> FinetuneSettings:
        """The fine-tuning budget: the sweep's recorded settings (the masked sweep's where it recorded none),
        with ``o.steps``; each run's rate and seed are this study's."""
        recorded = self.sweep(self.sweep_dir(o))["meta"].get("finetune") or asdict(get_sweep_preset("cpu-mlm").finetune)
        base = FinetuneSettings(**{k: v for k, v in recorded.items() if k in FinetuneSettings.__dataclass_fields__})
        base = replace(base, progress=False, save_model=False)
        return base if o.steps is None else replace(base, max_steps=o.steps)

    def run(self, o, point, folder, done, progress):
        name, seed = point.spec
        base, checkpoint = self.settings(o), self.sweep_dir(o) / "runs" / name
        runs: dict[str, dict] = {}
        models: set[str] = set()  # the checkpoint's fingerprint as each fine-tuning run read it

        def run_at(lr: float, s: int) -> dict:
            key = core.run_key(name, lr, s)
            if progress:
                print(key, flush=True)
            ft = replace(base, learning_rate=lr, seed=s)
            result = finetune(checkpoint, o.task, folder / "runs" / key, ft, overwrite=self.overwriting)
            models.add(result["fingerprint"]["model"])
            runs[key] = {
                "checkpoint": name,
                "learning_rate": lr,
                "seed": s,
                "metric": result["metric"],
                "score": result["score"],
                "validation_score": result["validation"][result["metric"]],
                "train_seconds": result["train_seconds"],
            }
            return result

        def seconds() -> float:
            return round(sum(r["train_seconds"] for r in runs.values()), 1)

        def model() -> dict:
            if len(models) != 1:  # the checkpoint changed while its grid ran
                raise RuntimeError(f"{checkpoint} changed while {point.key} fine-tuned it; run it again")
            return {"model": models.pop()}

        out = {"checkpoint": name, "seed": seed}
        first = done.get(core.run_key(f"{name}-ft", seed=o.seeds[0]))
        if first is not None and first.get("model") not in (None, self.fingerprint(checkpoint)):
            raise FileExistsError(
                f"{checkpoint} was retrained after its rate was chosen; pass --overwrite to fine-tune it again"
            )
        rates = parse_rates(o.learning_rates)
        rate = point_rate(
            lambda lr: run_at(lr, seed),
            rates,
            seed,
            o.seeds[0],
            None,
            first,
            o.max_extensions,
            score=lambda result: result["validation"][MAIN_METRIC[o.task]],  # the highest validation score
            factor=min(b / a for a, b in zip(rates, rates[1:], strict=False)),
            maximise=True,
        )
        if seed != o.seeds[0]:
            return out | rate | {"runs": runs, "train_seconds": seconds(), **model()}
        finetune_record = {k: v for k, v in asdict(base).items() if k not in ("seed", "learning_rate", "progress")}
        return out | rate | {"finetune": finetune_record, "runs": runs, "train_seconds": seconds(), **model()}

    def run_files(self, o, point, folder, result):
        """The ``finetune_metrics.json`` of each fine-tuning run of the point (``runs/CHECKPOINT-lrRATE-sSEED``,
        named in its result), which a later run with the same settings reuses."""
        paths = [folder / "runs" / key / FINETUNE_FILE for key in result["runs"]]
        return {p.relative_to(folder).as_posix(): file_digest([p]) for p in paths if p.is_file()}

    def still_valid(self, o, point, result):
        """A point holds while its checkpoint is the model it fine-tuned (results from before the fingerprint was
        recorded hold)."""
        name, _ = point.spec
        return result.get("model") in (None, self.fingerprint(self.sweep_dir(o) / "runs" / name))

    def fingerprint(self, checkpoint: Path) -> str:
        """:func:`fixedhead.runs.model_fingerprint`, once per checkpoint and study object."""
        key = f"model:{checkpoint.resolve()}"
        if key not in self._read:
            self._read[key] = model_fingerprint(checkpoint)
        return self._read[key]

    def state(self, o, results, record=None):
        return state_of(o, results, record and record["meta"]) | {"options": o}

    def summarise(self, state):
        sweep = self.sweep(self.sweep_dir(state["options"]))
        return {
            "scores": checkpoint_scores(state),
            "rank_correlation": rank_correlation(sweep, state),
            "claims": [
                dict(claim=c, measurement=m, verdict=v)
                for c, m, v in claims(as_sweep_state(sweep, state))
                if "fine-tun" in c
            ],
        }

    def report(self, state):
        return report_markdown(self.sweep(self.sweep_dir(state["options"])), state)

    def write_files(self, state, folder):
        write_plot(state, folder / PLOT_FILE)


# ------------------------------------------------------------------------------------- summary
def checkpoint_scores(state: dict) -> dict[str, list[float]]:
    """{checkpoint: GLUE dev scores of its fine-tuning seeds at its chosen rate}."""
    chosen = {name: t["chosen"] for name, t in state["tuning"].items()}
    scores: dict[str, list[float]] = {}
    for r in state["runs"].values():
        if chosen.get(r["checkpoint"]) == r["learning_rate"]:
            scores.setdefault(r["checkpoint"], []).append(r["score"])
    return scores


def as_sweep_state(sweep: dict, state: dict) -> dict:
    """The sweep's state with each checkpoint's fine-tuning score replaced by its mean over
    fine-tuning seeds (checkpoints without one have none) and this study's verdict rule, for
    :func:`fixedhead.studies.sweep.claims.claims`."""
    scores, plan = checkpoint_scores(state), state["meta"]["settings"]
    task, cap = plan["task"], plan["finetune"].get("max_dev_examples")
    dev = min(GLUE_DEV_EXAMPLES[task], cap) if cap else GLUE_DEV_EXAMPLES[task]
    runs = {}
    for name, r in sweep["runs"].items():
        r = {k: v for k, v in r.items() if k != "finetune"}
        if name in scores:
            r["finetune"] = {"score": mean_std(scores[name])[0], "dev_examples": dev}
        runs[name] = r
    meta = {**sweep["meta"], "finetune_task": task, "verdict": state["meta"]["verdict"]}
    if task != (sweep["meta"].get("finetune_task") or "sst2"):  # the sweep's majority class is another task's
        meta.pop("majority_class_accuracy", None)
    return {**sweep, "meta": meta, "runs": runs}


def rank_correlation(sweep: dict, state: dict, resamples: int = 2000) -> dict:
    """Spearman's ρ between each checkpoint's held-out perplexity and its mean fine-tuning score, with a
    percentile-bootstrap 95% interval over checkpoints (resamples with undefined ρ dropped): ``{"rho", "p",
    "low", "high", "checkpoints"}``, NaN for fewer than 4 checkpoints."""
    import warnings

    import numpy as np
    from scipy.stats import ConstantInputWarning, spearmanr

    scores = checkpoint_scores(state)
    pairs = np.array([(sweep["runs"][n]["heldout_perplexity"], mean_std(v)[0]) for n, v in scores.items()])
    result = dict(rho=math.nan, p=math.nan, low=math.nan, high=math.nan, checkpoints=len(pairs))
    if len(pairs) < 4:
        return result
    with warnings.catch_warnings():  # constant resamples: their ρ is NaN and dropped
        warnings.simplefilter("ignore", ConstantInputWarning)
        rho, p = spearman(list(pairs[:, 0]), list(pairs[:, 1]))
        draws = np.random.default_rng(0).integers(0, len(pairs), size=(resamples, len(pairs)))
        boot = np.array([spearmanr(pairs[i, 0], pairs[i, 1])[0] for i in draws])
    boot = boot[np.isfinite(boot)]
    if len(boot):
        result |= dict(low=float(np.percentile(boot, 2.5)), high=float(np.percentile(boot, 97.5)))
    return result | dict(rho=float(rho), p=float(p))


def report_markdown(sweep: dict, state: dict) -> str:
    """The study's report: what was run, each checkpoint's rate and scores, the fine-tuning claims,
    the rank correlation with its interval."""
    meta, plan = state["meta"], state["meta"]["settings"]
    task, ft = plan["task"], plan["finetune"]
    setup = [
        f"- checkpoints: the {len(meta['checkpoints'])} saved pretraining runs of `{meta['sweep']}`; GLUE {task}, "
        f"{ft['max_train_examples'] or 'all'} training examples, "
        f"{ft['validation_size']} carved out of GLUE train to stop early and choose the rate, ≤ {ft['max_steps']} "
        f"steps × batch {ft['batch_size']}; score = GLUE dev {MAIN_METRIC[task]} (the test set here)",
        f"- rate per checkpoint from {', '.join(f'{lr:g}' for lr in plan['grid'])} (up to {plan['max_extensions']} "
        f"grid steps past an edge) with seed {plan['seeds'][0]}, highest validation score; then seeds {plan['seeds']} "
        "at that rate; a checkpoint's score is the mean over its fine-tuning seeds",
    ]
    checkpoints = [
        [f"`{name}`", f"{sweep['runs'][name]['heldout_perplexity']:.2f}"]
        + [f"{state['tuning'][name]['chosen']:g}" + ("" if state["tuning"][name]["bracketed"] else " (edge)")]
        + [len(s), pm(*mean_std(s), 4)]
        for name, s in checkpoint_scores(state).items()
    ]
    merged, rho = as_sweep_state(sweep, state), rank_correlation(sweep, state)
    rule = (
        f"Verdict rule, recorded before fine-tuning: {rule_text(verdict_rule(merged))}, over pretraining seeds, each "
        "checkpoint scored by its fine-tuning seeds' mean; Holm counts the sweep's pretraining claims too."
    )
    correlation = f"Spearman ρ(held-out perplexity, mean {task} dev) over {rho['checkpoints']} checkpoints: " + (
        f"{rho['rho']:+.2f}, bootstrap 95% interval [{rho['low']:+.2f}, {rho['high']:+.2f}], p = {rho['p']:.2g} "
        "(the paper's direction is negative: lower perplexity, better fine-tuning)."
        if math.isfinite(rho["rho"])
        else "fewer than 4 checkpoints with scores."
        if rho["checkpoints"] < 4
        else f"undefined: every checkpoint has the same mean {task} dev score (e.g. all at the majority class)."
    )
    claimed = [[c, m, f"**{v}**"] for c, m, v in claims(merged) if "fine-tun" in c]
    header = ["checkpoint", "held-out ppl", "fine-tuning lr", "seeds", f"{task} dev"]
    return render.markdown(
        render.Report(
            f"Fine-tuning with seeds: {task} on the checkpoints of {Path(meta['sweep']).name}",
            [f"{meta['description']}."],
            [
                render.what_was_run(
                    meta,
                    setup,
                    render.Figure("learning_rates.png", "validation score against fine-tuning rate"),
                    render.Table(header, checkpoints),
                    work="fine-tuning",
                ),
                render.Section(
                    "Paper claim → our measurement",
                    [rule, render.Table(["paper claim", "our measurement", "verdict"], claimed), correlation],
                ),
            ],
        )
    )


def write_plot(state: dict, path: Path) -> None:
    """Each checkpoint's validation score against its fine-tuning rate."""
    plot_learning_rates(
        {"models": {n: {**t, "validation_loss": t["validation_score"]} for n, t in state["tuning"].items()}},
        path,
        ylabel=f"validation {MAIN_METRIC[state['meta']['settings']['task']]} (higher is better)",
        title="each checkpoint's fine-tuning rate, chosen on the split carved out of GLUE train",
    )
