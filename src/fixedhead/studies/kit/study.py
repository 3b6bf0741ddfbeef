"""The Study shape: a study is its options, its plan, how to run one point, how to summarise and its
report; :func:`run_study` does everything else (docs/writing-a-study.md).

A study subclasses :class:`Study`, declares ``name``, ``help``, ``Options`` (a frozen dataclass: the command
line reads its fields, defaults and attribute docstrings), ``quick`` and ``default_dir``, and implements
:meth:`~Study.resolve` (the spec every other hook receives), :meth:`~Study.plan` (seed-major :class:`Point` records),
:meth:`~Study.run` (one point to a JSON-able dict) and :meth:`~Study.state`, :meth:`~Study.summarise`,
:meth:`~Study.report`, :meth:`~Study.write_files`.

:func:`run_study` owns the rest: the folder claim and driver lock; ``plan.json`` and its SHA-256, written before
the first point and checked on every read (other settings need ``overwrite``, other points ``grow``);
``results.json``, written atomically after each point with the runs so far (``meta``, ``runs``, ``points`` with
result and file hashes, ``failed``) so a study resumes where it stopped, and whole when the command ends (with
``options``, the plan's hash, ``missing`` and ``summary``); the executor (in-process or Ray); progress; the
report's notes.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...runs import claim_output_dir, load_json_file, write_text_atomic
from . import core
from .executor import Executor, point_files, result_sha256

PLAN_FILE = "plan.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
LOCK_FILE = ".driver.lock"


@dataclass(frozen=True)
class Point:
    """One unit of a study's work: ``key`` names its folder and its ``results.json`` entry, ``spec`` is what
    :meth:`Study.run` needs, ``needs`` the keys of points whose results it reads (it runs after them)."""

    key: str
    spec: Any = None
    needs: tuple[str, ...] = ()


class Study:
    """Subclass and declare ``name``, ``Options``, ``quick``, ``files`` and the methods below."""

    name: ClassVar[str]
    Options: ClassVar[type]
    quick: ClassVar[Any] = None
    help: ClassVar[str] = ""
    """the command's one-line help (``fixedhead --help``)"""
    removed: ClassVar[dict[str, str]] = {}
    """options the command no longer takes, each refused with what replaces it"""
    files: ClassVar[tuple[str, ...]] = ()
    """glob patterns of what the study writes besides plan.json, results.json and report.md (its run
    folders, tables, figures)"""
    paths: ClassVar[tuple[str, ...]] = ()
    """Options fields that only say where an input lies (a sweep's folder): moved, the same study (each point
    checks its input itself, :meth:`still_valid`)"""
    quick_presets: ClassVar[tuple[str, ...]] = ()
    """presets besides ``quick``'s own that ``--quick`` may run; any other would train a full study in the quick
    folder"""
    points_only: ClassVar[tuple[str, ...]] = ()
    """Options fields that only choose which points exist (seeds, lengths), only enter the summary, or that each
    run checks itself (a corpus path): a stored point stays valid when they change, other points need ``grow``"""
    default_dir: ClassVar[str] = "runs/{name}"
    """where the study writes by default, formatted with ``name`` and the options' fields; with ``--quick`` a
    ``-{preset}`` part is dropped and ``-quick`` appended, so a quick run never writes into the real one"""
    states_plan: ClassVar[bool] = False
    """the report states the plan's hash and growth itself (else the kit adds a line)"""
    overwriting: bool = False
    """set by :func:`run_study`: the points are being run again"""
    folder: Path | None = None
    """set by :func:`run_study` and :func:`regenerate`: the study's output folder"""

    def __init__(self, cache_dir=None):
        self.cache_dir, self._prepared = cache_dir, {}

    def __getstate__(self):
        """Sent to a Ray worker without the data prepared in this process (the worker prepares its own)."""
        return self.__dict__ | {"_prepared": {}}

    def data(self, settings, progress: bool = True):
        """:func:`fixedhead.data.prepare_data` of a DataSettings, once per settings in this process."""
        from ...data import prepare_data

        key = json.dumps(settings.record(), sort_keys=True, default=str)
        if key not in self._prepared:
            self._prepared[key] = prepare_data(settings, cache_dir=self.cache_dir, progress=progress)
        return self._prepared[key]

    def resolve(self, options):
        """The spec every other hook receives, computed once: the options (the default), or an object holding
        them as ``options`` with what they derive. Its options have every value that stands for another written
        out (a preset's fields), so giving a default explicitly is the same study. It must pickle (Ray)."""
        return options

    def still_valid(self, spec, point: Point, result: dict) -> bool:
        """Whether a stored point's ``result`` still holds for the inputs it read (False: :func:`run_study`
        refuses to reuse it); True by default."""
        return True

    def describe(self, spec) -> str:
        """One line on what the study trains, recorded as ``meta.description`` (the study's name by default)."""
        return self.name

    def check(self, spec) -> None:
        """Refuse options that cannot run (raise ValueError) before the folder is touched; nothing by default."""

    def first_seed(self, spec) -> int | None:
        """The seed whose points choose what the other seeds reuse (their learning rates), fixed once results
        exist; None by default."""
        return None

    def plan(self, spec) -> list[Point]:
        raise NotImplementedError

    def plan_record(self, spec) -> dict:
        """What the plan states besides its options and points (the pairing, the target); {} by default."""
        return {}

    def run(self, spec, point: Point, folder: Path, done: dict[str, Any], progress: bool) -> dict:
        """Run ``point`` in the study's ``folder``; ``done`` holds the results of every point of ``point.needs``."""
        raise NotImplementedError

    def run_files(self, spec, point: Point, folder: Path, result: dict) -> dict[str, str]:
        """``{path relative to folder: sha256}`` of the files finished ``point`` wrote, recorded so that a file
        rewritten since is refused on resume (:func:`check_points`). Default: :func:`~.executor.point_files` of
        its key (the ``metrics.json`` and weights of its run folders)."""
        return point_files(folder, point.key)

    def state(self, spec, results: list[dict], record: dict | None = None) -> Any:
        """The one view of the plan's finished points (``results``, in plan order) that :meth:`summarise`,
        :meth:`report` and :meth:`write_files` read; ``record``: the ``results.json`` record, None while
        summarising. Default: the record's fields with ``options`` and ``results``."""
        return {**(record or {}), "options": options_in(spec), "results": list(results)}

    def summarise(self, state) -> Any:
        """The summary (``results.json``'s ``summary``) of a :meth:`state` read without a record."""
        raise NotImplementedError

    def report(self, state) -> str:
        """The markdown report of a :meth:`state` (also printed)."""
        raise NotImplementedError

    def write_files(self, state, folder: Path) -> None:
        """Tables and figures beside the report (none by default)."""


def options_of(study: Study, options=None, quick: bool = False):
    """The study's options: ``options``, else ``study.quick`` when ``quick``, else ``study.Options()``."""
    return options if options is not None else (study.quick if quick else study.Options())


def options_in(spec):
    """The resolved options a spec (:meth:`Study.resolve`) holds: its ``options``, or the spec itself."""
    return getattr(spec, "options", spec)


def study_folder(study: Study, options, output_dir=None, quick: bool = False) -> Path:
    """Where a study writes: ``output_dir``, else its :attr:`Study.default_dir`."""
    if output_dir is not None:
        return Path(output_dir)
    values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    # part by part: an empty folder option is the current folder, never the root
    return Path(*(part.format(name=study.name, **values) for part in _default_dir(study, quick).split("/")))


def default_dir_text(study: Study, quick: bool = False) -> str:
    """:attr:`Study.default_dir` as the command's help shows it: ``runs/sweep-PRESET``."""
    return re.sub(r"\{(\w+)\}", lambda m: m[1].upper(), _default_dir(study, quick).replace("{name}", study.name))


def _default_dir(study: Study, quick: bool) -> str:
    return study.default_dir.replace("-{preset}", "") + "-quick" if quick else study.default_dir


def plan_file(study: Study, spec) -> dict:
    """``{"plan": {study, options, points, settings_sha256, **plan_record}, "sha256"}`` of a spec; ValueError
    for an empty plan or a point key twice (``--seeds 1 1``)."""
    keys, options = [p.key for p in study.plan(spec)], options_in(spec)
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if not keys or twice:
        raise ValueError(
            f"the {study.name} plan has no point (check the options' lists)"
            if not keys
            else f"the {study.name} plan holds points twice ({', '.join(twice[:3])}): a value is given twice"
        )
    plan = {
        "study": study.name,
        "options": dataclasses.asdict(options),
        "points": keys,
        "settings_sha256": settings_sha256(study, options),
        **study.plan_record(spec),
    }
    text = json.dumps(plan, indent=1, sort_keys=True)
    return {"plan": json.loads(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def settings_sha256(study: Study, options) -> str:
    """The hash of the options a point's result depends on (all but ``points_only`` and ``paths``); a stored
    point is reused only under the same settings."""
    skip = study.points_only + study.paths
    values = {k: v for k, v in dataclasses.asdict(options_in(options)).items() if k not in skip}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def write_plan(
    folder: Path, study: Study, spec, grow: bool = False, overwrite: bool = False, new: dict | None = None
) -> dict:
    """``plan.json`` = ``{"plan", "sha256", "history"}``, written before any point runs. Once results exist,
    other settings are refused without ``overwrite`` (all points run again: a new study, no history) and other
    points without ``grow`` (stored results kept; the replaced plan goes into ``history``). Results written
    before plans are held to the options their ``results.json`` records.

    Raises:
        FileExistsError: another study's plan, results that record no options, or the refusals above; nothing
            is changed.
        ValueError: a damaged plan.json or results.json (not a JSON object, or a field that should be one).
    """
    new = new or plan_file(study, spec)
    path = folder / PLAN_FILE
    old = read_plan(path, study.name) if path.is_file() else None
    if overwrite:
        return _write_plan(path, new, [])
    done = sorted(stored_runs(folder))
    if old is None and done:
        old = _unplanned(folder, study)
    if old is None:
        return _write_plan(path, new, [])
    if old["sha256"] == new["sha256"]:  # the same plan (written again where results predate plan files)
        return old if path.is_file() else _write_plan(path, new, old["history"])
    if study.paths and _without(old["plan"], study.paths) == _without(new["plan"], study.paths):
        return _write_plan(path, new, old.get("history", []))  # an input moved: the same plan, written with it
    # the stored options read through today's Options (a field added since takes its default, which keeps
    # what the stored points ran); the stored hash only where they no longer read (a field gone since)
    try:
        was_spec = study.resolve(options_from_dict(study.Options, old["plan"]["options"]))
    except (TypeError, ValueError):
        was_spec = None
    if was_spec is not None and plan_file(study, was_spec)["sha256"] == new["sha256"]:
        return _write_plan(path, new, old.get("history", []))  # the same plan, read through today's Options
    was_settings = settings_sha256(study, was_spec) if was_spec else old["plan"].get("settings_sha256")
    if done and was_settings != new["plan"]["settings_sha256"]:
        changed = _changed(old["plan"]["options"], new["plan"]["options"], study.points_only)
        more = f"; and {len(changed) - 6} more" if len(changed) > 6 else ""
        raise FileExistsError(
            f"{folder} holds {len(done)} point(s) run with other settings ({'; '.join(changed[:6])}{more}); pass "
            "--overwrite to run them all again with these, or choose another --output-dir (nothing was changed)"
        )
    if done and was_spec is not None:
        was = study.first_seed(was_spec)
        if was is not None and was != study.first_seed(spec):
            raise FileExistsError(
                f"{folder}: the stored points chose their rates with seed {was}, this plan's first seed is "
                f"{study.first_seed(spec)}; pass {was} first in --seeds, or choose another --output-dir "
                "(nothing was changed)"
            )
    asked, planned = new["plan"]["points"], old["plan"].get("points", [])
    if done and not grow and set(asked) < set(planned):  # fewer of the same points: not growth
        report = folder / REPORT_FILE
        raise FileExistsError(
            f"{folder} holds a study of {len(planned)} points ({len(done)} finished); these options ask for "
            f"{len(asked)} of them{f' (its report of all: {report})' if report.is_file() else ''}; give the "
            "folder's options to finish or report the whole study, pass --grow to make its plan these points "
            "only (stored results are kept; the report covers these and says the plan changed), or choose "
            "another --output-dir (nothing was changed)"
        )
    if done and not grow:
        where = path if path.is_file() else folder / RESULTS_FILE
        raise FileExistsError(
            f"{where} holds another plan (sha256 {(old['sha256'] or 'unrecorded')[:12]}, this one "
            f"{new['sha256'][:12]}) and {len(done)} finished point(s); pass --grow to extend the study (the report "
            "covers this plan's points, so give all of them, e.g. every seed; it says the study grew; stored "
            "results are kept), or choose another --output-dir (nothing was changed)"
        )
    replaced = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    grown = [{"sha256": old["sha256"], "replaced": replaced, "runs_done": done}] if done else []
    return _write_plan(path, new, old.get("history", []) + grown)


def _write_plan(path: Path, plan: dict, history: list) -> dict:
    record = plan | {"history": history}
    write_text_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def _unplanned(folder: Path, study: Study) -> dict:
    """The plan that results written before plans ran: the options and points their ``results.json`` records;
    FileExistsError where it records no options (which settings its points ran with is unknown)."""
    stored = _stored(folder)
    if not isinstance(stored.get("options"), dict):
        raise FileExistsError(
            f"{folder / RESULTS_FILE} holds {len(stored.get('runs', {}))} point(s) but neither {PLAN_FILE} nor the "
            "options they ran with; pass --overwrite to run them all again, or choose another --output-dir "
            "(nothing was changed)"
        )
    options = _unplanned_options(study, stored["options"])
    plan = {"study": study.name, "options": options, "points": list(stored["runs"])}
    return {"plan": plan, "sha256": stored.get("plan_sha256"), "history": stored.get("plan_history", [])}


def _unplanned_options(study: Study, values: dict) -> dict:
    """Options recorded before plans, when an empty list stood for the preset's value (today None does)."""
    unset = {f.name for f in dataclasses.fields(study.Options) if f.default is None}
    return {k: None if k in unset and v == [] else v for k, v in values.items()}


def _without(plan: dict, fields) -> dict:
    return plan | {"options": {k: v for k, v in plan.get("options", {}).items() if k not in fields}}


def _changed(was: dict, now: dict, skip=()) -> list[str]:
    """The options that differ, as ``--option: old → new`` (nested ones by their own name: ``--steps``), and those
    recorded that the options no longer have, as ``--option: old → not an option now``."""
    out = []
    for k, v in now.items():
        if k in skip or was.get(k) == v:
            continue
        if isinstance(v, dict) and isinstance(was.get(k), dict):
            out += _changed(was[k], v)
        else:
            out.append(f"--{k.replace('_', '-')}: {was.get(k)!r} → {v!r}")
    return out + [f"--{k.replace('_', '-')}: {v!r} → not an option now" for k, v in was.items() if k not in now]


def _stored(folder: Path) -> dict:
    path = folder / RESULTS_FILE
    stored = load_json_file(path, "study results") if path.is_file() else {}
    if not isinstance(stored.get("runs", {}), dict):
        raise FileExistsError(
            f"{path} holds results in an older format (runs as a list); move it aside or choose another "
            "--output-dir (nothing was changed)"
        )
    _objects(path, stored, ("meta", "points", "failed"))
    return stored


def _objects(path: Path, record: dict, keys) -> None:
    """ValueError naming the file and the field where one of ``keys`` holds something other than a JSON object."""
    for key in keys:
        if key in record and not isinstance(record[key], dict):
            raise ValueError(
                f"{path}: its {key!r} is a JSON {type(record[key]).__name__}, not an object; the file is damaged: "
                "restore it (nothing was changed)"
            )


def stored_runs(folder: Path) -> dict:
    """``{point key: result}`` of the folder's ``results.json`` ({} for none)."""
    return dict(_stored(folder).get("runs", {}))


def read_plan(path: Path, name: str, instead: str = "choose another --output-dir") -> dict:
    """``plan.json`` of study ``name``; FileExistsError for another study's plan or one changed after it was
    hashed (suggesting ``instead``)."""
    record = load_json_file(path, f"{name} plan")
    _objects(path, record, ("plan",))
    if record.get("plan", {}).get("study") != name:
        raise FileExistsError(
            f"{path} is the plan of `fixedhead {record.get('plan', {}).get('study')}`, not of `fixedhead "
            f"{name}`; {instead} (nothing was changed)"
        )
    text = json.dumps(record.get("plan"), indent=1, sort_keys=True)
    actual = hashlib.sha256(text.encode()).hexdigest()
    if record.get("sha256") != actual:
        raise FileExistsError(
            f"{path} was changed after it was written: its plan hashes to {actual[:12]}, it records "
            f"{str(record.get('sha256'))[:12]}; restore it or {instead} (nothing was changed)"
        )
    return record


def check_points(folder: Path, stored: dict, again: str = "pass --overwrite to run the study again") -> None:
    """Refuse (FileExistsError) stored results edited since they were recorded: the meta, a result, or a run
    file rewritten. An absent file passes (a committed folder carries no weights), and so does a record older
    than its hashes. ``again``: how the reading command runs the study again."""
    from ...runs import file_digest

    if stored.get("meta_sha256") not in (None, core.meta_sha256(stored.get("meta", {}))):
        raise FileExistsError(
            f"{folder / RESULTS_FILE}: its meta (commands, description, timing, versions) was changed after it was "
            f"written (it no longer matches its hash); restore it, or {again} (nothing was changed)"
        )
    for key, rec in stored.get("points", {}).items():
        if key not in stored.get("runs", {}):
            continue
        if rec.get("result_sha256") not in (None, result_sha256(stored["runs"][key])):
            raise FileExistsError(
                f"{folder / RESULTS_FILE}: the result of point {key} was changed after it was recorded (it no "
                f"longer matches its hash); restore it, or {again} (nothing was changed)"
            )
        for rel, digest in rec.get("files", {}).items():
            path = folder / rel
            if path.is_file() and file_digest([path]) != digest:
                raise FileExistsError(
                    f"{path} (point {key}) no longer matches its record in {RESULTS_FILE}: it was rewritten after "
                    f"the point finished; {again} (nothing was changed)"
                )


def _staging(name: str) -> re.Pattern:
    """The temporary names :func:`fixedhead.runs.staged_outputs` writes ``name`` under."""
    return re.compile(rf"\.{re.escape(name)}\.[A-Za-z0-9_]+\.tmp{re.escape(Path(name).suffix)}")


def _leftovers(folder: Path) -> list[Path]:
    """The study's own files that a killed driver may leave: the staging files of plan, results and report."""
    if not folder.is_dir():
        return []
    own = [_staging(n) for n in (PLAN_FILE, RESULTS_FILE, REPORT_FILE)]
    return [e for e in folder.iterdir() if e.is_file() and any(p.fullmatch(e.name) for p in own)]


def _lock(folder: Path, name: str):
    """Hold the folder's driver lock (an exclusive ``flock`` the kernel drops when the process ends, killed or
    not) and return its open file; FileExistsError naming the live command that holds it."""
    handle = open(folder / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise FileExistsError(
            f"{folder} is being run by another `fixedhead {name}` ({holder}); wait for it to finish or choose "
            "another --output-dir (nothing was changed)"
        ) from None
    handle.seek(0)
    handle.truncate()
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {since}")
    handle.flush()
    return handle


def _take_folder(folder: Path, study: Study):
    """Claim ``folder`` and take its driver lock; the staging files of a killed driver are removed (a folder
    holding only those and the lock is the study's own, and empty). Nothing else in it is removed: overwrite
    runs the points again, so the claim lists no owned files."""
    early = None
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    if entries and set(entries) <= {*_leftovers(folder), folder / LOCK_FILE}:
        early = _lock(folder, study.name)  # only what a killed driver left: ours to clear
        for leftover in _leftovers(folder):
            leftover.unlink(missing_ok=True)
    try:
        if not early:  # (a folder holding only its driver lock is the study's own, and empty)
            claim_output_dir(folder, (PLAN_FILE, RESULTS_FILE), (), study.name, results_file=RESULTS_FILE)
        handle = early or _lock(folder, study.name)
    except BaseException:
        if early:
            early.close()
        raise
    for leftover in _leftovers(folder):
        leftover.unlink(missing_ok=True)
    return handle


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
    executor: Executor | None = None,
) -> dict:
    """Run every point of ``study``'s plan that is not finished, summarise, write the report.

    ``output_dir`` defaults to :attr:`Study.default_dir`; with Ray workers on other machines, a path every node
    sees at the same place. ``grow`` accepts other points once results exist, ``overwrite`` runs every point
    again. Returns the ``results.json`` record (``meta``, ``options``, ``plan_sha256``, ``plan_history``,
    ``runs``, ``points``, ``failed``, ``missing``, ``summary``).

    Raises:
        ValueError: bad options, an empty plan, more GPUs per point than the Ray cluster has, or a damaged
            plan.json or results.json (named with the file and the field).
        ConnectionError: no Ray cluster at the executor's ``ray_address``.
        FileExistsError: the folder holds something else, points of other settings or another plan (or results
            that record neither), a file changed since it was recorded, or another live command runs it.
        Exception: in-process, whatever a point raised (the points before it are saved).
    """
    from tqdm.auto import tqdm

    executor = executor or Executor()
    spec = study.resolve(options_of(study, options, quick))  # once: every hook reads this spec
    options = options_in(spec)
    if getattr(options, "corpus", None):  # a corpus path that does not exist, named before the folder is touched
        from ...data.corpus import check_corpus_source

        check_corpus_source(options.corpus)
    study.check(spec)
    new = plan_file(study, spec)  # a plan that cannot run is refused before the folder is touched
    folder = study_folder(study, options, output_dir, quick)
    with executor.connected(progress):  # Ray reached and its GPUs counted before the folder is touched
        lock = _take_folder(folder, study)
        try:
            study.overwriting, study.folder = overwrite, folder
            points, previous = study.plan(spec), _stored(folder)
            stored = {} if overwrite else previous.get("runs", {})
            if not overwrite:
                check_points(folder, previous)
            changed = [p.key for p in points if p.key in stored and not study.still_valid(spec, p, stored[p.key])]
            if changed:
                raise FileExistsError(
                    f"{folder}: {len(changed)} stored point(s) were computed from inputs that have changed since "
                    f"({', '.join(changed[:3])}{' …' if len(changed) > 3 else ''}); pass --overwrite to run them all "
                    "again, or choose another --output-dir (nothing was changed)"
                )
            plan = write_plan(folder, study, spec, grow, overwrite, new)
            preset = getattr(options, "preset", "custom")
            meta = core.start_meta(
                preset, study.describe(spec), command, previous, study.name, plan_sha256=plan["sha256"]
            )
            if quick or (previous.get("meta", {}).get("quick") and not overwrite):
                meta["quick"] = True  # the report says its numbers mean nothing
            state = {
                "meta": meta,
                "runs": dict(stored),
                "points": {} if overwrite else dict(previous.get("points", {})),
                "failed": {} if overwrite else dict(previous.get("failed", {})),
            }
            todo = [p for p in points if p.key not in state["runs"]]
            bar = tqdm(total=len(todo), desc=study.name, unit="point", disable=not progress or not todo)
            for outcome in executor.run(study, spec, folder.absolute(), todo, state["runs"], progress):
                if outcome.error is None:
                    state["runs"][outcome.key] = outcome.result
                    state["points"][outcome.key] = {**outcome.record, "result_sha256": result_sha256(outcome.result)}
                    state["failed"].pop(outcome.key, None)
                else:
                    state["failed"][outcome.key] = outcome.error
                core.save_state(folder / RESULTS_FILE, state, state["runs"].values())
                bar.update()
            bar.close()
            runs = state["runs"]
            record = _record(study, spec, state["meta"], plan, runs, points, state["points"], state["failed"])
            core.save_state(folder / RESULTS_FILE, record, runs.values())
            study.write_files(record_state(study, spec, record), folder)
            write_text_atomic(folder / REPORT_FILE, _report(study, spec, record))
        finally:
            lock.close()
    return record


def _record(
    study: Study, spec, meta: dict, plan: dict, runs: dict, points: list[Point], recorded=None, failed=None
) -> dict:
    keys = [p.key for p in points]
    ordered = {k: runs[k] for k in keys if k in runs} | {k: v for k, v in runs.items() if k not in keys}
    return {
        "meta": meta,
        "options": dataclasses.asdict(options_in(spec)),
        "plan_sha256": plan["sha256"],
        "plan_history": plan["history"],
        "runs": ordered,
        **({"points": {k: recorded[k] for k in ordered if k in recorded}} if recorded else {}),
        **({"failed": {k: v for k, v in failed.items() if k not in runs}} if failed else {}),
        "missing": [k for k in keys if k not in runs],
        "summary": study.summarise(study.state(spec, [runs[k] for k in keys if k in runs])),
    }


def record_state(study: Study, spec, record: dict):
    """The study's state of a record's plan points (other stored points left out, as in the summary)."""
    keys = {p.key for p in study.plan(spec)}
    return study.state(spec, [v for k, v in record["runs"].items() if k in keys], record)


def _report(study: Study, spec, record: dict) -> str:
    """The study's report with the kit's notes: quick and incomplete at the top, the plan's hash at the end."""
    text = study.report(record_state(study, spec, record))
    if record["meta"].get("quick"):
        title, _, rest = text.partition("\n")
        note = (
            "**The seconds-sized version (`--quick`): it shows the study runs end to end; its numbers mean nothing.**"
        )
        text = f"{title}\n\n{note}\n{rest}"
    if record["missing"]:
        title, _, rest = text.partition("\n")
        failed = record.get("failed", {})
        note = (
            f"**Incomplete: {len(record['missing'])} point(s) of the plan have no result yet**: "
            f"{', '.join(record['missing'][:5])}{' …' if len(record['missing']) > 5 else ''}. "
            + "".join(f"Point {k} failed: {v}. " for k, v in failed.items())
            + "Rerun the same command to finish."
        )
        text = f"{title}\n\n{note}\n{rest}"
    if not study.states_plan and record["plan_sha256"]:
        grew = (
            f" **The study grew after results existed** ({len(record['plan_history'])} earlier plan(s), in "
            "`plan.json`)."
            if record["plan_history"]
            else ""
        )
        line = f"Plan: `plan.json`, sha256 `{record['plan_sha256']}`, written before the first point.{grew}"
        text = text.rstrip("\n") + f"\n\n{line}\n"
    return text


def regenerate(study: Study, folder: Path) -> tuple[dict, str]:
    """The record and report a study folder regenerates to from its per-point results, with the options its
    ``plan.json`` (or, before plans were hashed, its ``results.json``) names."""
    spec, record = _regenerated(study, Path(folder))
    return record, _report(study, spec, record)


def _regenerated(study: Study, folder: Path) -> tuple[Any, dict]:
    """The spec of the options a folder names and the record its results regenerate to."""
    stored = load_json_file(folder / RESULTS_FILE, f"{study.name} results")
    _objects(folder / RESULTS_FILE, stored, ("runs", "meta", "points", "failed"))
    study.folder = folder
    path = folder / PLAN_FILE
    again = f"run `fixedhead {study.name}` again with --overwrite"
    plan = read_plan(path, study.name, again) if path.is_file() else None
    if plan is None and "options" not in stored:
        raise ValueError(f"{folder} was written before its study recorded its options: its report cannot be rendered")
    check_points(folder, stored, again=again)
    values = plan["plan"]["options"] if plan else _unplanned_options(study, stored["options"])
    spec = study.resolve(options_from_dict(study.Options, values))
    plan = plan or {"sha256": stored.get("plan_sha256"), "history": stored.get("plan_history", [])}  # as resumed
    points = study.plan(spec)
    recorded, failed = stored.get("points"), stored.get("failed")
    return spec, _record(study, spec, stored["meta"], plan, stored["runs"], points, recorded, failed)


def rerender(study: Study, folder: Path, output_dir=None) -> Path:
    """Write a study folder's report, tables and figures again from its results (:func:`regenerate`) into
    ``output_dir`` (default: the folder; FileExistsError if it holds something else). Returns the report's
    path."""
    folder = Path(folder)
    spec, record = _regenerated(study, folder)
    text = _report(study, spec, record)
    out = Path(output_dir) if output_dir is not None else folder
    if out.resolve() != folder.resolve():  # report.md: every study's marker
        owned = (REPORT_FILE, f".{REPORT_FILE}.*", *study.files)
        claim_output_dir(out, (REPORT_FILE,), owned, "report", exclusive=True)
    study.write_files(record_state(study, spec, record), out)
    write_text_atomic(out / REPORT_FILE, text)
    return out / REPORT_FILE


def options_from_dict(cls, values: dict):
    """The dataclass ``cls`` from its :func:`dataclasses.asdict` after a JSON round trip (nested dataclasses
    rebuilt, lists back to tuples)."""
    import typing

    hints, out = typing.get_type_hints(cls), dict(values)
    for f in dataclasses.fields(cls):
        if f.name not in out:
            continue
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(out[f.name], dict):
            out[f.name] = options_from_dict(hints[f.name], out[f.name])
        elif typing.get_origin(hints[f.name]) is tuple and isinstance(out[f.name], list):
            out[f.name] = tuple(out[f.name])
    return cls(**out)
