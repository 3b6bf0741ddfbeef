"""The pieces :mod:`fixedhead.studies.kit.study` is built of: a named preset, the step override, a results
file's meta (environment, commands, timing) written atomically, run keys, a seed-major plan, and the locks
workers sharing a folder take.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...checks import positive_int
from ...model.paper_presets import lookup
from ...runs import environment_info, invocation_commands, write_json_atomic


def pick(table: dict[str, Callable], name: str, kind: str, *args):
    """``table[name](*args)``: a fresh preset of a study's table. Raises ValueError naming ``kind``
    and listing the known names."""
    return lookup(table, name, kind)(*args)


def first_unknown(chosen: Iterable[str], known: Iterable[str]) -> str | None:
    """The first of ``chosen`` that is not in ``known`` (``"(none)"`` for an empty choice), else None:
    what a study's subset option (models, families, experiments) names in its error."""
    chosen, known = list(chosen), set(known)
    return next((c for c in chosen if c not in known), None) if chosen else "(none)"


def steps_override(name: str, steps: int | None, default: int) -> int:
    """``steps`` (None: ``default``) as a positive int. Raises ValueError naming ``name`` and the value."""
    return default if steps is None else positive_int(name, steps)


def start_meta(preset, description: str, command: str | None, previous: dict, study: str, **fields) -> dict:
    """A results file's ``meta``: the ``study`` (the ``fixedhead`` command that owns the folder, which
    :func:`claim` checks), the preset's name (``"custom"`` for a preset object), its description,
    this invocation's command and every earlier one recorded in the ``previous`` results, the study's
    own ``fields`` (its settings record first), when the first invocation started, and the software
    and machine (:func:`fixedhead.runs.environment_info`)."""
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


def save_state(path: Path, state: dict, runs: Iterable[dict], others: dict | None = None) -> None:
    """Write ``state`` atomically to ``path`` with its wall time and the training seconds of
    ``runs`` summed, fine-tuning included (``meta.total_seconds``, ``meta.compute_seconds``).

    The wall time is the length of the union of every invocation's span, from its start to its
    latest save (``meta.active``, which :func:`start_meta` carries over from the results it
    resumes, merged with ``others``: the ``meta`` another worker sharing the folder wrote): workers
    running side by side count once, and the days between a study's sessions do not count. Results
    from before the spans were recorded contribute their first start plus their recorded wall time
    as one span."""
    meta = state["meta"]
    spans = [[meta["invocation_started"], time.time()]]
    for old in (meta, others or {}):
        spans += old.get("active") or (
            [[old["first_started"], old["first_started"] + old["total_seconds"]]] if "total_seconds" in old else []
        )
    meta["active"] = [[round(a, 1), round(b, 1)] for a, b in active_spans(spans)]
    meta["total_seconds"] = round(sum(b - a for a, b in meta["active"]), 1)
    meta["compute_seconds"] = round(
        sum(r.get("train_seconds", 0) + r.get("finetune", {}).get("train_seconds", 0) for r in runs), 1
    )
    write_json_atomic(path, state)


def run_key(name: str, lr: float | None = None, seed: int | None = None) -> str:
    """The one name of a study's run: ``NAME``, ``NAME-lrRATE``, ``NAME-sSEED`` or ``NAME-lrRATE-sSEED``
    (the rate as ``%g``: ``NAME-lr0.002-s1``), used for its folder and its key in the results file."""
    return name + ("" if lr is None else f"-lr{lr:g}") + ("" if seed is None else f"-s{seed}")


def seed_major(items: Iterable, seeds: Iterable[int]) -> list[tuple[Any, int]]:
    """``(item, seed)`` pairs, every item's first seed before any second seed: an interrupted study
    has the widest picture first."""
    items = list(items)
    return [(item, seed) for seed in seeds for item in items]


@contextmanager
def one_writer(results_file: Path) -> Iterator[None]:
    """Hold an exclusive lock beside ``results_file`` (``.NAME.lock``) for the block: workers sharing
    a folder read, merge and write the results file one at a time, so none drops another's newest run."""
    with open(results_file.with_name(f".{results_file.name}.lock"), "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes
        yield


def try_lock(run_dir: Path) -> Path | None:
    """Claim ``run_dir`` for this process (``RUN_DIR.lock`` holding the pid); None if a live process holds it.

    Lets several workers of a study share one output directory (each skips what another is
    training); a lock left by a dead process is taken over.
    """
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = run_dir.with_name(run_dir.name + ".lock")  # beside, not inside: pretrain wants its own directory
    # the pid is written first and the lock appears whole (a hard link), so no reader sees it empty
    staged = run_dir.with_name(f".{run_dir.name}.lock.{os.getpid()}")
    staged.write_text(str(os.getpid()))
    try:
        return _take(lock, staged)
    finally:
        staged.unlink(missing_ok=True)


def _take(lock: Path, staged: Path) -> Path | None:
    for _ in range(2):
        try:
            os.link(staged, lock)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid():
                try:
                    os.kill(pid, 0)
                    return None  # alive
                except ProcessLookupError:
                    pass
                except PermissionError:
                    return None
            lock.unlink(missing_ok=True)
            continue
        return lock
    return None
