"""`fixedhead finetune-sweep SWEEP_DIR`: the paper's fine-tuning claims (Tables 1, 2A, 2B, Fig. 2)
with enough fine-tuning seeds to decide them.

Every pretrained checkpoint of a masked sweep (``SWEEP_DIR/runs/NAME``) is fine-tuned on one GLUE
task. Its fine-tuning rate is chosen from a grid with the first fine-tuning seed, on the highest
validation score (the split carved out of GLUE train for early stopping; never GLUE dev, the
reported test set), with :func:`fixedhead.studies.kit.learning_rate.choose_rate` (the grid grows past
an edge); then every fine-tuning seed trains at that rate. A checkpoint's score is the mean GLUE dev
score over its fine-tuning seeds, so a claim compares pretraining seeds with less fine-tuning noise.
The claims are judged by :func:`fixedhead.studies.sweep.claims.claims` under the rule this study records
before training (:data:`~fixedhead.studies.kit.stats.CLAIMS_RULE`; Holm counts the sweep's pretraining
claims too), and whether fine-tuning tracks pretraining is Spearman's ρ over checkpoints with a
bootstrap 95% interval.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

from ...checks import non_negative_int
from ...data.glue import GLUE_DEV_EXAMPLES, MAIN_METRIC, get_glue_task, glue_path
from ...runs import load_json_file, write_text_atomic
from ...training.evaluate import DivergedError
from ...training.finetune import FinetuneSettings, finetune
from ..kit import core, render
from ..kit.learning_rate import DIVERGED, choose_rate, losses_record, parse_rates, plot_learning_rates
from ..kit.stats import CLAIMS_RULE, mean_std, pm, rule_text, spearman
from . import load_sweep
from .claims import claims, verdict_rule
from .presets import get_sweep_preset

RESULTS_FILE = "finetune.json"
OWNED = ("runs", "report.md", ".report.md.*", "*.png")
#: the grid each checkpoint chooses its rate from by default (the masked sweep fine-tunes at 1e-3)
DEFAULT_RATES = (3e-4, 1e-3, 3e-3)
#: the fine-tuning seeds of every checkpoint when none are given (the command line's and Python's)
DEFAULT_SEEDS = (0, 1, 2)


def run_finetune_seeds(
    sweep_dir: str | Path,
    task: str = "sst2",
    output_dir: str | Path | None = None,
    seeds: list[int] | tuple[int, ...] | None = None,
    learning_rates: str | list[float] = DEFAULT_RATES,
    max_extensions: int = 1,
    settings: FinetuneSettings | None = None,
    max_steps: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> dict:
    """Fine-tune every checkpoint of the sweep in ``sweep_dir`` on GLUE ``task`` with ``seeds``
    (default :data:`DEFAULT_SEEDS`, as on the command line), each checkpoint at its own rate;
    return the state written to ``OUTPUT_DIR/finetune.json`` (default ``SWEEP_DIR/finetune-TASK``).

    ``settings``: the fine-tuning budget (default: the sweep's recorded fine-tuning settings, else
    the masked sweep's (``cpu-mlm``); ``max_steps`` replaces its steps); its rate and seed are this
    study's. Finished fine-tuning runs are reused (:func:`fixedhead.training.finetune.finetune`),
    so a rerun resumes; ``overwrite`` starts the study afresh and trains every run again. Past an
    edge of the grid the next rate is one grid step further (the smallest ratio between
    neighbouring rates: ×3 for the default grid). A run whose loss becomes non-finite counts as the
    worst rate.

    Raises:
        FileNotFoundError: ``sweep_dir`` has no ``sweep.json``, or the GLUE files are missing.
        ValueError: an unknown task, no seeds, a grid of fewer than 2 rates, a negative
            ``max_extensions``, a causal sweep, a sweep without a finished checkpoint.
        FileExistsError: the output folder holds another study's files, or this study's with
            other seeds, grid, settings or sweep (without ``overwrite``).
    """
    get_glue_task(task)  # an unknown task fails before any work
    sweep = load_sweep(sweep_dir)
    seeds = core.seeds_override(seeds, DEFAULT_SEEDS)
    rates = parse_rates(learning_rates)
    non_negative_int("max_extensions", max_extensions)
    if (objective := sweep["meta"].get("objective", "mlm")) != "mlm":
        raise ValueError(f"{sweep_dir} is a {objective!r} sweep; only masked LMs are fine-tuned on GLUE")
    for split in ("train", "dev"):
        if not glue_path(task, split).is_file():
            raise FileNotFoundError(f"GLUE {task} {split} data not found at {glue_path(task, split)}")
    checkpoints = {name: Path(sweep_dir) / "runs" / name for name in sorted(sweep["runs"])}
    checkpoints = {n: d for n, d in checkpoints.items() if (d / "model.safetensors").is_file()}
    if not checkpoints:
        raise ValueError(f"{sweep_dir}: no finished checkpoint (runs/NAME/model.safetensors) to fine-tune")
    recorded = sweep["meta"].get("finetune") or asdict(get_sweep_preset("cpu-mlm").finetune)
    base = settings or FinetuneSettings(
        **{k: v for k, v in recorded.items() if k in FinetuneSettings.__dataclass_fields__}
    )
    base = replace(base, progress=False, save_model=False)
    if max_steps is not None:
        base = replace(base, max_steps=core.steps_override("max_steps", max_steps, base.max_steps))
    out = core.claim(Path(output_dir or Path(sweep_dir) / f"finetune-{task}"), RESULTS_FILE, OWNED, "finetune-sweep")
    plan = {
        "task": task,
        "seeds": list(seeds),
        "grid": rates,
        "max_extensions": max_extensions,
        # which sweep (its start time names it wherever the folder moves): its checkpoints' results only
        "sweep_started": sweep["meta"].get("first_started"),
        "finetune": {k: v for k, v in asdict(base).items() if k not in ("seed", "learning_rate", "progress")},
    }
    previous, meta = core.resume(
        out / RESULTS_FILE,
        "custom",
        f"Every checkpoint of {Path(sweep_dir).name} fine-tuned on GLUE {task} with seeds {list(seeds)}, each "
        "checkpoint at its own rate",
        command,
        plan,
        "fine-tuning plan or sweep",
        overwrite=overwrite,
        study="finetune-sweep",
        sweep=str(sweep_dir),
        checkpoints=list(checkpoints),
    )
    rule = previous.get("meta", {}).get("verdict") or dict(CLAIMS_RULE)  # fixed when the study began
    meta |= {"verdict": rule, "verdict_rule": rule_text(rule)}
    # a checkpoint the sweep no longer has (a run deleted there) leaves the study
    tuning = {n: t for n, t in previous.get("tuning", {}).items() if n in checkpoints}
    runs = {k: r for k, r in previous.get("runs", {}).items() if r["checkpoint"] in checkpoints}
    state = {"meta": meta, "tuning": tuning, "runs": runs}
    core.claim(out, RESULTS_FILE, OWNED, "finetune-sweep", create=True)
    core.save_state(out / RESULTS_FILE, state, [])
    t0 = time.time()

    def run(name: str, lr: float, seed: int) -> dict:
        key = core.run_key(name, lr, seed)
        if progress:
            print(f"{key} ({time.time() - t0:.0f} s)", flush=True)
        ft = replace(base, learning_rate=lr, seed=seed)
        result = finetune(checkpoints[name], task, out / "runs" / key, ft, overwrite=overwrite)
        state["runs"][key] = {
            "checkpoint": name,
            "learning_rate": lr,
            "seed": seed,
            "metric": result["metric"],
            "score": result["score"],
            "validation_score": result["validation"][result["metric"]],
            "train_seconds": result["train_seconds"],
        }
        core.save_state(out / RESULTS_FILE, state, state["runs"].values())
        return result

    def validation_cost(name: str, lr: float) -> float:
        # the best validation score is the lowest loss choose_rate looks for
        try:
            return -run(name, lr, seeds[0])["validation"][MAIN_METRIC[task]]
        except DivergedError:
            return DIVERGED

    step = min(b / a for a, b in zip(rates, rates[1:], strict=False))
    for name in checkpoints:
        best, scores, bracketed = choose_rate(partial(validation_cost, name), rates, max_extensions, step)
        state["tuning"][name] = {
            "chosen": best,
            "bracketed": bracketed,
            "validation_score": {lr: -v if v is not None else None for lr, v in losses_record(scores).items()},
        }
        for seed in seeds[1:]:
            run(name, best, seed)
    core.save_state(out / RESULTS_FILE, state, state["runs"].values())
    return state


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
    """Spearman's ρ between each checkpoint's held-out perplexity and its mean fine-tuning score,
    with a paired percentile-bootstrap 95% interval over checkpoints (seed 0; resamples whose ρ is
    undefined, all values equal on a side, are dropped).

    Returns ``{"rho", "p", "low", "high", "checkpoints"}`` (NaN where fewer than 4 checkpoints)."""
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
    task, scores = plan["task"], checkpoint_scores(state)
    ft = plan["finetune"]
    done = sum(len(v) for v in scores.values())
    n_checkpoints = len(meta["checkpoints"])  # the sweep's runs that had saved weights
    L = render.head(
        f"Fine-tuning with seeds: {task} on the checkpoints of {Path(meta['sweep']).name}",
        meta,
        render.incomplete(done, n_checkpoints * len(plan["seeds"]), "fine-tuning runs at the chosen rates"),
        work="fine-tuning",
    )
    L += [
        f"- checkpoints: the {n_checkpoints} saved pretraining runs of `{meta['sweep']}`; GLUE {task}, "
        f"{ft['max_train_examples'] or 'all'} training examples, "
        f"{ft['validation_size']} carved out of GLUE train to stop early and choose the rate, ≤ {ft['max_steps']} "
        f"steps × batch {ft['batch_size']}; score = GLUE dev {MAIN_METRIC[task]} (the test set here)",
        f"- rate per checkpoint from {', '.join(f'{lr:g}' for lr in plan['grid'])} (up to {plan['max_extensions']} "
        f"grid steps past an edge) with seed {plan['seeds'][0]}, highest validation score; then seeds {plan['seeds']} "
        "at that rate; a checkpoint's score is the mean over its fine-tuning seeds",
        "",
        "![validation score against fine-tuning rate](learning_rates.png)",
        "",
    ]
    rows = []
    for name, s in scores.items():
        t = state["tuning"][name]
        ppl = f"{sweep['runs'][name]['heldout_perplexity']:.2f}"
        rate = f"{t['chosen']:g}" + ("" if t["bracketed"] else " (edge)")
        rows.append([f"`{name}`", ppl, rate, len(s), pm(*mean_std(s), 4)])
    L += render.table(["checkpoint", "held-out ppl", "fine-tuning lr", "seeds", f"{task} dev"], rows) + [""]
    merged = as_sweep_state(sweep, state)
    rho = rank_correlation(sweep, state)
    L += [
        "## Paper claim → our measurement",
        "",
        f"Verdict rule, recorded before fine-tuning: {rule_text(verdict_rule(merged))}, over pretraining seeds, each "
        "checkpoint scored by its fine-tuning seeds' mean; Holm counts the sweep's pretraining claims too.",
        "",
        *render.table(
            ["paper claim", "our measurement", "verdict"],
            [[c, m, f"**{v}**"] for c, m, v in claims(merged) if "fine-tun" in c],
        ),
        "",
        f"Spearman ρ(held-out perplexity, mean {task} dev) over {rho['checkpoints']} checkpoints: "
        + (
            f"{rho['rho']:+.2f}, bootstrap 95% interval [{rho['low']:+.2f}, {rho['high']:+.2f}], p = {rho['p']:.2g} "
            "(the paper's direction is negative: lower perplexity, better fine-tuning)."
            if math.isfinite(rho["rho"])
            else "fewer than 4 checkpoints with scores."
            if rho["checkpoints"] < 4
            else f"undefined: every checkpoint has the same mean {task} dev score (e.g. all at the majority class)."
        ),
    ]
    return "\n".join(L) + "\n"


def write_report(sweep_dir: str | Path, output_dir: str | Path) -> Path:
    """Write ``report.md`` and ``learning_rates.png`` for the study in ``output_dir``; return the report path."""
    out = Path(output_dir)
    state, sweep = load_json_file(out / RESULTS_FILE), load_sweep(sweep_dir)
    plot_learning_rates(
        {"models": {n: {**t, "validation_loss": t["validation_score"]} for n, t in state["tuning"].items()}},
        out / "learning_rates.png",
        ylabel=f"validation {MAIN_METRIC[state['meta']['settings']['task']]} (higher is better)",
        title="each checkpoint's fine-tuning rate, chosen on the split carved out of GLUE train",
    )
    write_text_atomic(out / "report.md", report_markdown(sweep, state))
    return out / "report.md"
