"""The pieces :mod:`fixedhead.studies.kit.study` is built of: a named preset and the options it fills, a results
file's meta (environment, commands, timing) written atomically, run keys and a seed-major plan.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...model.paper_presets import lookup
from ...runs import environment_info, invocation_commands, write_json_atomic


def pick(table: dict[str, Callable], name: str, kind: str, *args):
    """``table[name](*args)``: a fresh preset; ValueError naming ``kind`` and listing the known names."""
    return lookup(table, name, kind)(*args)


def from_preset(presets: dict, options, fields: tuple[str, ...], kind: str):
    """``options`` with each of ``fields`` it leaves None at the value of ``presets[options.preset]``: a preset
    is the options a run starts from, and the options given override it (an empty list is a value). ValueError
    for an unknown preset, listing the known names."""
    return replace(options, **filled_by_preset(presets, options, fields, kind))


def filled_by_preset(presets: dict, options, fields: tuple[str, ...], kind: str) -> dict:
    """``{field: the preset's value}`` of each of ``fields`` that ``options`` leaves None (see :func:`from_preset`)."""
    preset = lookup(presets, options.preset, kind)
    return {k: getattr(preset, k) for k in fields if getattr(options, k) is None}


@contextlib.contextmanager
def naming_preset(name: str, filled: dict):
    """A ValueError raised inside that names a field the preset ``name`` filled says so: ``... (--preset cpu-mup
    sets --parametrization mup; give --parametrization to override it)``."""
    try:
        yield
    except ValueError as e:
        named = [k for k in filled if re.search(rf"\b{k}\b", str(e))]
        if not named:
            raise
        flag = {k: f"--{k.replace('_', '-')}" for k in named}
        words = {k: " ".join(map(str, v)) if isinstance(v, (tuple, list)) else v for k, v in filled.items()}
        sets = ", ".join(f"{flag[k]} {words[k]}" for k in named)
        raise ValueError(f"{e} (--preset {name} sets {sets}; give {', '.join(flag.values())} to override it)") from None


def first_unknown(chosen: Iterable[str], known: Iterable[str]) -> str | None:
    """The first of ``chosen`` not in ``known`` (``"(none)"`` for an empty choice), else None."""
    chosen, known = list(chosen), set(known)
    return next((c for c in chosen if c not in known), None) if chosen else "(none)"


def start_meta(preset, description: str, command: str | None, previous: dict, study: str, **fields) -> dict:
    """A results file's ``meta``: study, preset name, description, this and every earlier command, the study's
    ``fields``, start times, software and machine."""
    previous_meta = previous.get("meta", {})
    this_command, commands = invocation_commands(command, previous_meta)
    now = time.time()
    return {
        "study": study,
        "preset": preset if isinstance(preset, str) else "custom",
        "description": description,
        "command": this_command,
        "commands": commands,
        **fields,
        "first_started": previous_meta.get("first_started", now),
        "invocation_started": now,
        **({"active": previous_meta["active"]} if "active" in previous_meta else {}),
        **({"total_seconds": previous_meta["total_seconds"]} if "total_seconds" in previous_meta else {}),
        **environment_info(),
    }


def active_spans(spans: Iterable[Iterable[float]]) -> list[list[float]]:
    """The union of ``[start, end]`` spans (seconds since the epoch), sorted, overlaps merged."""
    merged: list[list[float]] = []
    for start, end in sorted((float(a), float(b)) for a, b in spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def save_state(path: Path, state: dict, runs: Iterable[dict]) -> None:
    """Write ``state`` atomically with ``meta.total_seconds`` (the union of every invocation's span, so time
    between invocations does not count), ``meta.compute_seconds`` (the training seconds of ``runs``, fine-tuning
    included) and ``meta_sha256``, which a rerun and ``fixedhead report`` check."""
    meta = state["meta"]
    spans = [[meta["invocation_started"], time.time()]]
    spans += meta.get("active") or (
        [[meta["first_started"], meta["first_started"] + meta["total_seconds"]]] if "total_seconds" in meta else []
    )
    meta["active"] = [[round(a, 1), round(b, 1)] for a, b in active_spans(spans)]
    meta["total_seconds"] = round(sum(b - a for a, b in meta["active"]), 1)
    meta["compute_seconds"] = round(
        sum(r.get("train_seconds", 0) + r.get("finetune", {}).get("train_seconds", 0) for r in runs), 1
    )
    write_json_atomic(path, {**state, "meta_sha256": meta_sha256(meta)})


def meta_sha256(meta: dict) -> str:
    """The hash of a results file's meta as JSON (keys sorted)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def run_key(name: str, lr: float | None = None, seed: int | None = None) -> str:
    """The one name of a study's run, its folder and results key: ``NAME[-lrRATE][-sSEED]`` (``NAME-lr0.002-s1``)."""
    return name + ("" if lr is None else f"-lr{lr:g}") + ("" if seed is None else f"-s{seed}")


def seed_major(items: Iterable, seeds: Iterable[int]) -> list[tuple[Any, int]]:
    """``(item, seed)`` pairs, every item's first seed before any second: an interrupted study has the widest
    picture first."""
    items = list(items)
    return [(item, seed) for seed in seeds for item in items]
