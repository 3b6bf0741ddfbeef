"""A learning rate per arm, chosen on a validation split: the grid, its extension, the choice.

A comparison of models is fair only when each trains at its own best rate (Kaplan et al. 2020, Section 3.2
and Fig. 5). Each arm trains at every rate of a factor-2 grid on the training split minus a validation split
and keeps the rate of lowest validation loss; while that rate sits at an edge, the grid grows by one factor-2
step past it, up to ``max_extensions``. A diverged run counts as infinitely bad. The held-out set reports the
chosen rate's runs only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...checks import non_negative_int, positive_float
from ...plotting import pyplot, save_figure
from ...training.evaluate import DivergedError
from . import render

#: a diverged run's validation loss: worse than any finite one, and JSON-safe as None
DIVERGED = math.inf
#: the fraction of training documents held back to choose rates on, when the data has no validation split
VALIDATION_FRACTION = 0.05


def rule(what: str = "model", score: str = "validation loss") -> str:
    """The selection rule in words, for a study's ``what`` (model, arm, cell) scored by ``score``."""
    return (
        f"each {what}'s lowest {score}; the grid grows by a factor 2 past an edge while the best rate "
        "sits there; a diverged run counts as the worst"
    )


RULE = rule()


def selection_record(
    grid: list[float],
    max_extensions: int,
    seed: int,
    validation_fraction: float | None = None,
    rule_text: str = RULE,
    **extra,
) -> dict:
    """The ``meta.learning_rate_selection`` record of a study's results, the study's ``extra`` fields last."""
    fraction = {} if validation_fraction is None else {"validation_fraction": validation_fraction}
    return {"grid": grid, "max_extensions": max_extensions, **fraction, "seed": seed, "rule": rule_text, **extra}


def with_validation_split(data_settings):
    """``data_settings`` with a validation split (:data:`VALIDATION_FRACTION`) unless it has one."""
    if data_settings.validation_fraction > 0:
        return data_settings
    return replace(data_settings, validation_fraction=VALIDATION_FRACTION)


def losses_record(losses: dict[float, float]) -> dict[str, float | None]:
    """``{rate as text: loss, None for a diverged run}``, ascending: a results file's record."""
    return {f"{lr:g}": (v if math.isfinite(v) else None) for lr, v in sorted(losses.items())}


def _round(lr: float) -> float:
    return float(f"{lr:.6g}")  # 1e-3 · 2^-1 = 0.0005, not 0.00050000000000001


def parse_rates(text: str | Iterable[float]) -> list[float]:
    """Rates from ``"5e-4,1e-3,2e-3,4e-3"`` (or any iterable of numbers), distinct and ascending; ValueError
    for fewer than 2 or one that is not a positive number."""
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    rates = []
    for p in parts:
        try:
            value = float(p)
        except (TypeError, ValueError):
            raise ValueError(f"learning_rates: {p!r} is not a number") from None
        rates.append(_round(positive_float("learning_rates", value)))  # rates that print alike are one rate
    rates = sorted(set(rates))
    if len(rates) < 2:  # named as the Options field every study holds its grid in
        raise ValueError(f"learning_rates needs at least 2 rates (a grid), got {rates}")
    return rates


def best_rate(losses: dict[float, float]) -> float:
    """The rate with the lowest validation loss (ties: the smaller); ValueError when every run diverged."""
    finite = {lr: loss for lr, loss in losses.items() if math.isfinite(loss)}
    if not finite:
        raise ValueError(f"every learning rate diverged: {sorted(losses)}; try smaller rates")
    return min(sorted(finite), key=lambda lr: finite[lr])


def next_rate(losses: dict[float, float], factor: float = 2.0) -> float | None:
    """The rate one ``factor`` step past the edge the best rate sits on; None when it is bracketed."""
    rates = sorted(losses)
    best = best_rate(losses)
    if best == rates[0]:
        return _round(rates[0] / factor)
    if best == rates[-1]:
        return _round(rates[-1] * factor)
    return None


def choose_rate(
    train: Callable[[float], float],
    grid: Iterable[float],
    max_extensions: int = 3,
    factor: float = 2.0,
) -> tuple[float, dict[float, float], bool]:
    """Train at every rate of ``grid`` (``train(lr)`` returns the validation loss, or :data:`DIVERGED`), extend
    past an edge while the best rate sits there, and return ``(best rate, {rate: loss}, bracketed)``;
    ``bracketed`` is False when ``max_extensions`` ran out with the best still at an edge. ValueError for a
    negative ``max_extensions`` or when every rate diverged."""
    non_negative_int("max_extensions", max_extensions)  # before any training: a negative one never stops
    losses = {}
    for lr in grid:
        if lr not in losses:
            losses[lr] = train(lr)
    extensions = 0
    while (lr := next_rate(losses, factor)) is not None:
        if extensions == max_extensions:
            return best_rate(losses), losses, False
        losses[lr] = train(lr)
        extensions += 1
    return best_rate(losses), losses, True


def choose_on_validation(
    run: Callable[[float], Any],
    grid: Iterable[float],
    max_extensions: int = 3,
    score: Callable[[Any], float] | None = None,
    factor: float = 2.0,
    maximise: bool = False,
) -> dict:
    """:func:`choose_rate` on ``score(run(lr))`` (default: its ``validation_loss``; ``DivergedError`` or a
    non-finite score counts as :data:`DIVERGED`). ``maximise``: a score to raise (GLUE), recorded as
    ``validation_score``. Returns ``{"chosen", "bracketed",
    "validation_loss" (or "validation_score")}``."""
    score = score or (lambda result: result["validation_loss"])
    sign = -1.0 if maximise else 1.0

    def loss(lr: float) -> float:
        try:
            value = sign * score(run(lr))
        except DivergedError:
            return DIVERGED
        return value if math.isfinite(value) else DIVERGED

    best, losses, bracketed = choose_rate(loss, grid, max_extensions, factor)
    if maximise:
        scores = {lr: (None if v is None else -v) for lr, v in losses_record(losses).items()}
        return {"chosen": best, "bracketed": bracketed, "validation_score": scores}
    return {"chosen": best, "bracketed": bracketed, "validation_loss": losses_record(losses)}


def later_seed_needs(grid, seed: int, first_seed: int, first_key: str) -> tuple[str, ...]:
    """A point's ``needs`` under :func:`point_rate`: with a grid, a later seed needs its first seed's point."""
    return (first_key,) if grid and seed != first_seed else ()


def chosen_rate(first: dict) -> float:
    """The rate a first seed's result chose: ``tuning.chosen``, else ``learning_rate``, else an older result's
    ``chosen``; ValueError when it holds none."""
    if isinstance(first.get("tuning"), dict) and "chosen" in first["tuning"]:
        return first["tuning"]["chosen"]
    for key in ("learning_rate", "chosen"):
        if isinstance(first.get(key), int | float):
            return first[key]
    raise ValueError(
        f"the first seed's result records no chosen rate (no 'tuning.chosen', 'learning_rate' or 'chosen'; it has "
        f"{', '.join(sorted(first)) or 'nothing'}); pass --overwrite to choose the rates again"
    )


def point_rate(
    run: Callable[[float], Any],
    grid,
    seed: int,
    first_seed: int,
    default: float | None,
    first: dict | None = None,
    max_extensions: int = 3,
    **choice,
) -> dict:
    """The rate protocol of one point, trained by ``run(lr)``: without a ``grid``, the ``default`` rate; with
    one, the first seed chooses (:func:`choose_on_validation` with ``choice``) and a later seed trains at the
    rate its first seed's result ``first`` chose. Returns ``{"learning_rate"}``, plus ``"tuning"`` (the choice)
    on the first seed with a grid."""
    if not grid:
        run(default)
        return {"learning_rate": default}
    if seed != first_seed:
        lr = chosen_rate(first or {})
        run(lr)
        return {"learning_rate": lr}
    tuning = choose_on_validation(run, grid, max_extensions, **choice)
    return {"learning_rate": tuning["chosen"], "tuning": tuning}


def _losses(record: dict[str, float | None]) -> dict[float, float]:
    """The inverse of :func:`losses_record`."""
    return {float(lr): DIVERGED if v is None else v for lr, v in record.items()}


def shared_rate_cost(tuning: dict[str, dict]) -> dict[float, dict[str, float]]:
    """What one rate shared by every model would cost each against its own best (what μP is meant to make
    small): ``{rate: {model: validation loss at rate − its lowest, in nats (inf: diverged)}}`` for each rate
    every model trained, ascending. ``tuning``: ``{model: {"validation_loss": losses_record(...)}}``."""
    curves = {key: _losses(t["validation_loss"]) for key, t in tuning.items()}
    common = set.intersection(*(set(c) for c in curves.values())) if curves else set()
    return {lr: {key: c[lr] - min(c.values()) for key, c in curves.items()} for lr in sorted(common)}


def shared_rate_text(tuning: dict[str, dict], unit: str = "nats of validation loss") -> str:
    """One sentence: the shared rate that costs the worst-off model least and what it costs in ``unit``; ""
    for fewer than 2 models or no rate they all trained."""
    costs = shared_rate_cost(tuning)
    if len(tuning) < 2 or not costs:
        return ""
    lr = min(costs, key=lambda r: (max(costs[r].values()), sum(costs[r].values())))
    worst = max(costs[lr], key=costs[lr].get)
    chosen = [t["chosen"] for t in tuning.values()]
    if len(set(chosen)) == 1:
        return f"The chosen rate is the same for every model, {chosen[0]:g}: one shared rate would have cost nothing."
    return (
        f"One rate for every model instead: the best single rate, {lr:g}, would cost up to "
        f"{costs[lr][worst]:.3f} {unit} (`{worst}`; mean over models "
        f"{sum(costs[lr].values()) / len(costs[lr]):.3f}); the chosen rates span a factor "
        f"{max(chosen) / min(chosen):g}."
    )


def selection_markdown(selection: dict, tuning: dict[str, dict], what: str = "model") -> list[str]:
    """A report's section on the rate each ``what`` chose: the rule, the shared-rate cost,
    ``learning_rates.png`` and every validation loss. ``selection``: the :func:`selection_record`, with
    ``"validation"`` and ``"unit"`` in words where the split is not a fraction of documents."""
    rates = sorted({float(lr) for t in tuning.values() for lr in t["validation_loss"]})

    def cell(losses: dict, lr: float) -> str:
        if f"{lr:g}" not in losses:
            return "–"
        v = losses[f"{lr:g}"]
        return "diverged" if v is None else f"{v:.4f}"

    rows = [
        [
            f"`{key}`",
            *(cell(t["validation_loss"], lr) for lr in rates),
            f"**{t['chosen']:g}**" + ("" if t["bracketed"] else " (at an edge)"),
        ]
        for key, t in tuning.items()
    ]
    return [
        f"## A learning rate per {what}",
        "",
        f"Each {what} trained at every rate of the grid {', '.join(f'{lr:g}' for lr in selection['grid'])} "
        f"with seed {selection['seed']} and kept the rate of lowest loss on a validation split ("
        + selection.get(
            "validation",
            f"{selection.get('validation_fraction', 0):g} of the training documents, not the held-out books",
        )
        + f"); rule: {selection['rule']}. Every seed then trained at that rate; only those runs are results. "
        + shared_rate_text(tuning, selection.get("unit", "nats of validation loss"))
        .replace("every model", f"every {what}")
        .replace("over models", f"over {what}s"),
        "",
        "![validation loss against learning rate](learning_rates.png)",
        "",
        *render.table([what, *(f"lr {lr:g}" for lr in rates), "chosen"], rows),
        "",
    ]


def plot_learning_rates(
    selection: dict, path: Path, ylabel: str = "validation loss (nats)", title: str | None = None
) -> None:
    """Validation loss (or ``ylabel``) against learning rate, one line per model, its chosen rate circled and a
    diverged rate a cross at the top. ``selection``: ``{"models": {label: choice record}, "validation_fraction"}``
    (the fraction only for the default ``title``)."""
    plt = pyplot()
    many = len(selection["models"]) > 8  # a legend beside the axes, not over the lines
    fig, ax = plt.subplots(figsize=(9.5 if many else 6.5, 4.2))
    finite = [v for m in selection["models"].values() for v in m["validation_loss"].values() if v is not None]
    top = max(finite) + 0.05 * (max(finite) - min(finite) + 1e-9)
    for name, m in selection["models"].items():
        ran = {float(lr): v for lr, v in m["validation_loss"].items() if v is not None}
        label = f"{name}: lr {m['chosen']:g}" + ("" if m["bracketed"] else " (edge)")
        colour = ax.plot(list(ran), list(ran.values()), marker="o", label=label)[0].get_color()
        ax.plot([m["chosen"]], [m["validation_loss"][f"{m['chosen']:g}"]], "o", ms=12, mfc="none", color=colour)
        diverged = [float(lr) for lr, v in m["validation_loss"].items() if v is None]
        ax.plot(diverged, [top] * len(diverged), "x", color=colour)
    ax.set_xscale("log", base=2)
    render.plain_ticks(ax, sorted({float(lr) for m in selection["models"].values() for lr in m["validation_loss"]}))
    ax.set_xlabel("learning rate")
    ax.set_ylabel(ylabel)
    ax.set_title(
        title
        or f"each model's rate, chosen on a validation split ({selection['validation_fraction']:g} of the documents)",
        fontsize=9,
    )
    if many:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save_figure(fig, path, [ax], legend=not many)
