"""The Study shape: a study is its options, its plan, how to run one point, how to summarise and its
report; :func:`run_study` does everything else.

A study subclasses :class:`Study` and declares

* ``name``: its ``fixedhead`` command (the default folder is ``runs/NAME``, ``runs/NAME-quick`` for
  the quick plan), ``Options``: a frozen dataclass (the command line reads its fields, defaults and
  attribute docstrings: :func:`fixedhead.options.add_options`) and ``quick``: the seconds-sized options;
* :meth:`Study.plan`: the points to run, each a :class:`Point` with its run key
  (:func:`~fixedhead.studies.kit.core.run_key`), in the order to run them (seed-major:
  :func:`~fixedhead.studies.kit.core.seed_major`), and :meth:`Study.plan_record`: what else the plan
  states before any result (the pairing, the smallest difference it must see);
* :meth:`Study.run`: one point, to a JSON-able dict; :meth:`Study.summarise`: every finished point to
  the summary; :meth:`Study.report`: the report (markdown, also printed) and :meth:`Study.write_files`
  (tables and figures beside it).

:func:`run_study` owns the rest: the output-folder claim; the plan written to ``plan.json`` with its
SHA-256 before the first point runs (a different plan is refused once results exist, unless the study is
asked to grow, which its record keeps in ``plan_history``); ``results.json`` (``meta``: command, every
earlier command, versions, machine, wall and compute time; ``runs``: one result per point key;
``summary``) written atomically after every point, so an interrupted study resumes where it stopped;
workers sharing a folder (each point claimed with a lock, results merged under a lock); progress.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...runs import claim_output_dir, load_json_file, write_text_atomic
from . import core

PLAN_FILE = "plan.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"


@dataclass(frozen=True)
class Point:
    """One unit of a study's work: ``key`` names it (its folder and its entry in ``results.json``),
    ``spec`` is whatever :meth:`Study.run` needs to run it."""

    key: str
    spec: Any = None


class Study:
    """Subclass and declare ``name``, ``Options``, ``quick``, ``files`` and the methods below."""

    name: ClassVar[str]
    Options: ClassVar[type]
    quick: ClassVar[Any] = None
    files: ClassVar[tuple[str, ...]] = ()
    """glob patterns of what the study writes besides plan.json, results.json and report.md (its run
    folders, tables, figures)"""

    def plan(self, options) -> list[Point]:
        raise NotImplementedError

    def plan_record(self, options) -> dict:
        """What the plan states besides its options and points (the pairing, the target); {} by default."""
        return {}

    def run(self, options, point: Point, folder: Path, done: dict[str, Any], progress: bool) -> dict:
        """Run ``point`` in ``folder`` (the study's output folder); ``done``: the results of the points
        finished so far (a later point may use an earlier one's, e.g. the rates the first seed chose)."""
        raise NotImplementedError

    def summarise(self, options, results: list[dict]) -> Any:
        """The summary of the finished points' ``results`` (in plan order)."""
        raise NotImplementedError

    def report(self, options, record: dict) -> str:
        """The markdown report of a record (``meta``, ``plan_sha256``, ``plan_history``, ``runs``, ``summary``)."""
        raise NotImplementedError

    def write_files(self, options, record: dict, folder: Path) -> None:
        """Tables and figures beside the report (none by default)."""


def options_of(study: Study, options=None, quick: bool = False, **given):
    """The study's options: ``options`` (default: ``study.quick`` when ``quick``, else ``study.Options()``)
    with the ``given`` fields replaced (validated by the dataclass)."""
    base = options if options is not None else (study.quick if quick else study.Options())
    return dataclasses.replace(base, **given) if given else base


def plan_file(study: Study, options) -> dict:
    """The plan record (``study``, ``options``, ``points``, and :meth:`Study.plan_record`) and its sha256."""
    plan = {
        "study": study.name,
        "options": dataclasses.asdict(options),
        "points": [p.key for p in study.plan(options)],
        **study.plan_record(options),
    }
    text = json.dumps(plan, indent=1, sort_keys=True)
    return {"plan": plan, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def write_plan(folder: Path, study: Study, options, grow: bool = False) -> dict:
    """``plan.json`` = ``{"plan", "sha256", "history"}``, written before any point runs. A folder whose
    plan differs keeps it while no point has finished; once results exist it is refused unless ``grow``
    (the replaced plan's hash, when and how many points were done go into ``history``).

    Raises:
        FileExistsError: another plan with results and not ``grow`` (naming both hashes).
    """
    new = plan_file(study, options)
    path, history = folder / PLAN_FILE, []
    if path.is_file():
        old = load_json_file(path, f"{study.name} plan")
        if old["sha256"] == new["sha256"]:
            return old
        done = sorted(_stored(folder).get("runs", {}))
        if done and not grow:
            raise FileExistsError(
                f"{path} holds another plan (sha256 {old['sha256'][:12]}, this one {new['sha256'][:12]}) and "
                f"{len(done)} finished point(s); pass --grow to extend the study, which its report then states, "
                "or choose another --output-dir"
            )
        replaced = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        history = old.get("history", []) + (
            [{"sha256": old["sha256"], "replaced": replaced, "runs_done": done}] if done else []
        )
    record = new | {"history": history}
    write_text_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def _stored(folder: Path) -> dict:
    path = folder / RESULTS_FILE
    return load_json_file(path, "study results") if path.is_file() else {}


def output_files(study: Study) -> tuple[str, ...]:
    return (PLAN_FILE, RESULTS_FILE, REPORT_FILE, f".{PLAN_FILE}.*", f".{RESULTS_FILE}.*", *study.files)


def run_study(
    study: Study,
    options=None,
    output_dir=None,
    *,
    quick: bool = False,
    grow: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    command: str = "",
) -> dict:
    """Run every point of ``study``'s plan that is not finished, summarise, write the report.

    Args:
        options: the study's ``Options`` (None: its defaults, or its quick options with ``quick``).
        output_dir: where it writes (None: ``runs/NAME``, ``runs/NAME-quick`` with ``quick``:
            :func:`~fixedhead.studies.kit.core.output_folder`).
        grow: accept a plan that differs from the folder's after results exist (recorded).
        overwrite: run finished points again (their results are replaced, the plan kept).
        progress: a progress bar over the points. command: the command line, recorded.

    Returns:
        the record written to ``results.json``: ``meta``, ``plan_sha256``, ``plan_history``, ``runs``
        (``{point key: result}`` in plan order) and ``summary``.

    Raises:
        FileExistsError: the folder holds something the study did not write, another study's output,
            or another plan with results (without ``grow``). Nothing is changed.
    """
    from tqdm.auto import tqdm

    options = options_of(study, options, quick)
    folder = core.output_folder(output_dir, study.name, quick=quick)
    owned = output_files(study)
    claim_output_dir(folder, (PLAN_FILE, RESULTS_FILE), owned, study.name, results_file=RESULTS_FILE)
    plan = write_plan(folder, study, options, grow)
    points = study.plan(options)
    previous = _stored(folder)
    meta = core.start_meta("custom", study.name, command, previous, study.name, plan_sha256=plan["sha256"])
    state = {"meta": meta, "runs": {} if overwrite else dict(previous.get("runs", {}))}
    todo = [p for p in points if p.key not in state["runs"]]
    for point in tqdm(todo, desc=study.name, unit="point", disable=not progress or not todo):
        lock = core.try_lock(folder / point.key)
        if lock is None:  # another worker runs it
            continue
        try:
            result = json.loads(json.dumps(study.run(options, point, folder, state["runs"], progress)))
        finally:
            lock.unlink(missing_ok=True)
        with core.one_writer(folder / RESULTS_FILE):
            others = _stored(folder)
            state["runs"] = {**others.get("runs", {}), **state["runs"], point.key: result}
            core.save_state(folder / RESULTS_FILE, state, state["runs"].values(), others.get("meta"))
    with core.one_writer(folder / RESULTS_FILE):
        others = _stored(folder)
        runs = {**others.get("runs", {}), **state["runs"]}
        state["runs"] = {p.key: runs[p.key] for p in points if p.key in runs}
        record = _record(study, options, state["meta"], plan, state["runs"])
        core.save_state(folder / RESULTS_FILE, record, record["runs"].values(), others.get("meta"))
    study.write_files(options, record, folder)
    write_text_atomic(folder / REPORT_FILE, study.report(options, record))
    return record


def _record(study: Study, options, meta: dict, plan: dict, runs: dict) -> dict:
    return {
        "meta": meta,
        "options": dataclasses.asdict(options),
        "plan_sha256": plan["sha256"],
        "plan_history": plan["history"],
        "runs": runs,
        "summary": study.summarise(options, list(runs.values())),
    }


def regenerate(study: Study, folder: Path) -> tuple[dict, str]:
    """The record and report a committed study folder regenerates to: the summary recomputed from its
    per-point results and the report rendered from it, with the options its ``plan.json`` names (or,
    for a folder written before plans were hashed, its ``results.json``)."""
    stored = load_json_file(folder / RESULTS_FILE, f"{study.name} results")
    path = folder / PLAN_FILE
    plan = load_json_file(path, f"{study.name} plan") if path.is_file() else None
    values = plan["plan"]["options"] if plan else stored["options"]
    options = options_from_dict(study.Options, values)
    plan = plan or {"sha256": stored["plan_sha256"], "history": stored["plan_history"]}
    record = _record(study, options, stored["meta"], plan, stored["runs"])
    return record, study.report(options, record)


def options_from_dict(cls, values: dict):
    """The dataclass ``cls`` from its :func:`dataclasses.asdict` after a JSON round trip: nested
    dataclasses rebuilt, lists back to tuples where the field's default is a tuple."""
    import typing

    hints, out = typing.get_type_hints(cls), dict(values)
    for f in dataclasses.fields(cls):
        if f.name not in out:
            continue
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(out[f.name], dict):
            out[f.name] = options_from_dict(hints[f.name], out[f.name])
        elif isinstance(f.default, tuple) and isinstance(out[f.name], list):
            out[f.name] = tuple(out[f.name])
    return cls(**out)
