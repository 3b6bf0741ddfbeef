"""Where a study's points run: in this process one after another (the default; Ray is not imported), or as
Ray tasks on a local instance this command starts (``workers``) or an existing cluster (``ray_address``). The
driver stays the only writer of the study's files; an executor only runs points and hands back their results.
On Ray a needed point's result is an argument of the dependent task, so Ray holds the dependent back.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...checks import positive_int

RUN_FILES = ("metrics.json", "*.safetensors")
"""what :func:`point_files` digests in each of a point's run folders (a study may record others:
:meth:`~fixedhead.studies.kit.study.Study.run_files`)"""


@dataclass(frozen=True)
class Outcome:
    """What became of one point: its ``result`` (JSON-able) and ``record`` (where it ran, with which versions,
    the digests of its run files), or ``error`` (one line) when it failed."""

    key: str
    result: dict | None = None
    record: dict | None = None
    error: str | None = None


@dataclass(frozen=True)
class Executor:
    """How points run. ``workers``: points at once on a local Ray instance (None: in this process);
    ``ray_address``: an existing cluster (``auto`` or ``HOST:PORT``); ``gpus_per_point``: GPUs per task;
    ``threads``: torch CPU threads per point (default on a local instance cores // workers, on a cluster 1).
    ValueError for a non-positive number, ``gpus_per_point`` without Ray, both ``workers`` and ``ray_address``,
    or Ray not installed.
    """

    workers: int | None = None
    ray_address: str | None = None
    gpus_per_point: float | None = None
    threads: int | None = None

    def __post_init__(self):
        if self.workers is not None:
            positive_int("workers", self.workers)
        if self.threads is not None:
            positive_int("threads", self.threads)
        if self.gpus_per_point is not None and not self.gpus_per_point > 0:
            raise ValueError(f"gpus_per_point must be positive, got {self.gpus_per_point!r}")
        if self.workers is not None and self.ray_address:
            raise ValueError(
                f"--workers {self.workers} starts a Ray instance on this machine, --ray-address {self.ray_address} "
                "(or $RAY_ADDRESS) names a cluster: give one of them"
            )
        if self.distributed and importlib.util.find_spec("ray") is None:  # refused before the folder is touched
            raise ValueError("--workers and --ray-address run points on Ray: pip install 'fixedhead[ray]'")
        if self.gpus_per_point is not None and not self.distributed:
            raise ValueError("--gpus-per-point asks Ray for GPUs: give --workers N or --ray-address too")

    @property
    def distributed(self) -> bool:
        return self.workers is not None or bool(self.ray_address)

    @property
    def point_threads(self) -> int | None:
        """torch CPU threads per point (see the class); None in this process without ``threads``."""
        if self.threads or not self.distributed:
            return self.threads
        return max(1, (os.cpu_count() or 1) // self.workers) if self.workers else 1

    @contextlib.contextmanager
    def connected(self, progress: bool = True):
        """Ray started or reached for the length of the ``with`` (nothing in-process); the driver enters it
        before it touches the study's folder.

        Raises:
            ConnectionError: no Ray cluster answers within :data:`PROBE_SECONDS`.
            ValueError: ``gpus_per_point`` exceeds the GPUs the cluster has.
        """
        if not self.distributed:
            yield
            return
        import ray

        if ray.is_initialized():  # already entered (run inside the driver's with)
            yield
            return
        if self.workers is not None:
            _start_local(ray, self.workers, self.point_threads, progress)
        else:
            ray.init(address=_reachable(self.ray_address), log_to_driver=progress)
        try:
            gpus = ray.cluster_resources().get("GPU", 0)
            if self.gpus_per_point and gpus < self.gpus_per_point:  # its tasks would wait for ever
                where = "this machine's Ray instance" if self.workers else f"the Ray cluster at {self.ray_address}"
                raise ValueError(
                    f"--gpus-per-point {self.gpus_per_point:g}: {where} has {gpus:g} GPU(s); give fewer, or none "
                    "(nothing was written)"
                )
            yield
        finally:
            ray.shutdown()

    def run(self, study, spec, folder: Path, points: list, stored: dict, progress: bool) -> Iterator[Outcome]:
        """Run ``points`` (plan order), yielding each one's :class:`Outcome` as it finishes. In-process an
        exception of ``study.run`` ends the run; on Ray it is the point's ``error`` and the rest go on."""
        if not self.distributed:
            yield from _in_process(study, spec, folder, points, stored, progress)
        else:
            with self.connected(progress):
                yield from _on_ray(self, study, spec, folder, points, stored, progress)


PROBE_SECONDS = 5.0
"""how long :func:`_reachable` waits for a Ray cluster's address to accept a connection"""


def _reachable(address: str) -> str:
    """``address`` as ``ray.init`` takes it, once a TCP connection to it opened within :data:`PROBE_SECONDS`
    (Ray itself retries an unreachable address for minutes)."""
    from ray._private.services import canonicalize_bootstrap_address_or_die, parse_address

    if address.startswith("ray://"):
        target = address
    else:
        try:  # auto: the cluster `ray start` on this machine recorded, or a running one
            target = canonicalize_bootstrap_address_or_die(address)
        except ConnectionError:
            raise ConnectionError(
                f"--ray-address {address}: no Ray cluster is running on this machine; start one with "
                "`ray start --head` (and `ray start --address HEAD:6379` on the other nodes), or give the head's "
                "HOST:PORT (nothing was written)"
            ) from None
        except ValueError:  # not HOST:PORT
            target = ""
    parsed = parse_address(target.removeprefix("ray://")) if target else None
    if parsed is None or not parsed[1].isdigit():
        raise ValueError(f"--ray-address {address}: give auto or HOST:PORT (nothing was written)")
    host, port = parsed
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_SECONDS).close()
    except OSError as e:
        shown = f"auto ({target})" if address == "auto" else address  # (localhost is probed at the node's IP)
        raise ConnectionError(
            f"--ray-address {shown}: no Ray cluster answers there ({e.strerror or e}); start one with "
            "`ray start --head`, or check the head's HOST:PORT (nothing was written)"
        ) from None
    return target


def _start_local(ray, workers: int, threads: int, progress: bool) -> None:
    """A fresh Ray instance for this command: ``workers`` points at once, no dashboard; workers see the driver's
    imports."""
    import sys

    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": str(threads)}
    ray.init(
        address="local",  # never an instance another command started
        num_cpus=workers * threads,
        include_dashboard=False,
        object_store_memory=200 * 2**20,
        runtime_env={"env_vars": env},
        log_to_driver=progress,
        _system_config={"worker_niceness": 0},  # the points are this command's work, not background jobs
    )


def run_point(study, spec, point, folder: Path, done: dict, progress: bool, ray_version: str | None = None):
    """``study.run`` of one point, to ``(result through a JSON round trip, record)``; the record names the node,
    the versions and the digests of its run files."""
    import platform

    import torch
    import transformers

    start = time.time()
    result = json.loads(json.dumps(study.run(spec, point, folder, done, progress)))
    result.setdefault("train_seconds", round(time.time() - start, 1))
    record = {
        "node": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        **({"ray": ray_version} if ray_version else {}),
        "files": study.run_files(spec, point, folder, result),
    }
    return result, record


def result_sha256(result: dict) -> str:
    """The hash of a point's result as JSON (keys sorted): an edited value in results.json no longer matches."""
    return hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()


def point_files(folder: Path, key: str) -> dict[str, str]:
    """``{path relative to folder: sha256}`` of :data:`RUN_FILES` below the run folders of point ``key`` =
    ``NAME[-sSEED]``: the folders, at any depth, named ``NAME[-lrRATE][-sSEED]`` with RATE a number (as
    :func:`~fixedhead.studies.kit.core.run_key` writes it), with what they hold in subfolders (a point that keeps
    its models in its own folder, ``KEY/NAME/metrics.json``); checkpoints not included (a finished run may delete
    them)."""
    from ...runs import file_digest

    name, seed = re.fullmatch(r"(.*?)((?:-s\d+)?)", key).groups()
    own = re.compile(re.escape(name) + r"(?:-lr\d[\d.]*(?:e[+-]\d+)?)?" + re.escape(seed))  # a rate as %g writes it
    out = {}
    for pattern in RUN_FILES:
        for path in folder.rglob(pattern):
            rel = path.relative_to(folder)
            mine = any(own.fullmatch(part) for part in rel.parts[:-1])
            if mine and not any(p.startswith("checkpoint-") for p in rel.parts):
                out[rel.as_posix()] = file_digest([path])
    return dict(sorted(out.items()))


def _in_process(study, spec, folder, points, stored, progress) -> Iterator[Outcome]:
    done = dict(stored)
    for point in _ordered(points, stored):
        result, record = run_point(study, spec, point, folder, done, progress)
        done[point.key] = result
        yield Outcome(point.key, result, record)


def _ordered(points, stored) -> list:
    """``points`` in plan order, each after the points it needs (ValueError for a need neither planned nor
    stored)."""
    planned, out, placed = {p.key: p for p in points}, [], set(stored)

    def place(point, chain=()):
        if point.key in placed:
            return
        if point.key in chain:
            raise ValueError(f"point {point.key} needs itself (through {', '.join(chain)})")
        for need in point.needs:
            if need not in planned and need not in stored:
                raise ValueError(f"point {point.key} needs {need}, which is neither planned nor finished")
            if need in planned:
                place(planned[need], (*chain, point.key))
        placed.add(point.key)
        out.append(point)

    for point in points:
        place(point)
    return out


def _ray_task(study, spec, point, folder, stored, progress, threads, keys, *needed):
    """One point on a Ray worker; ``needed``: the (result, record) pairs of the points ``keys``, which Ray
    resolved before starting this one."""
    import ray
    import torch

    torch.set_num_threads(threads)
    done = {**stored, **{k: r for k, (r, _) in zip(keys, needed, strict=True)}}
    return run_point(study, spec, point, Path(folder), done, progress, ray_version=ray.__version__)


def _on_ray(ex: Executor, study, spec, folder, points, stored, progress) -> Iterator[Outcome]:
    import ray

    threads = ex.point_threads
    task = ray.remote(_ray_task).options(
        num_cpus=threads, num_gpus=ex.gpus_per_point or 0, max_retries=1, retry_exceptions=False
    )
    study_ref, spec_ref, stored_ref = ray.put(study), ray.put(spec), ray.put(dict(stored))
    refs: dict[str, Any] = {}
    planned = {p.key: p for p in points}
    for point in _ordered(points, stored):
        keys = [k for k in point.needs if k in refs]
        refs[point.key] = task.remote(
            study_ref, spec_ref, point, str(folder), stored_ref, progress, threads, keys, *(refs[k] for k in keys)
        )
    waiting = {ref: key for key, ref in refs.items()}
    while waiting:
        ready, _ = ray.wait(list(waiting), num_returns=1)
        key = waiting.pop(ready[0])
        try:
            result, record = ray.get(ready[0])
        except ray.exceptions.RayError as e:
            yield Outcome(key, error=_failed_need(ray, planned[key], refs) or _one_line(ray, e))
            continue
        yield Outcome(key, result, record)


def _failed_need(ray, point, refs: dict) -> str | None:
    """Which point a point needs failed, for one that did not run."""
    for need in point.needs:
        try:
            ray.get(refs[need]) if need in refs else None
        except ray.exceptions.RayError:
            return f"not run: it needs {need}, which failed"
    return None


def _one_line(ray, error) -> str:
    """A failed task's error in one line: the point's own exception (``Type: message``), or a worker that died
    on both tries."""
    cause = getattr(error, "cause", None)
    if isinstance(error, ray.exceptions.RayTaskError) and cause is not None:
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    if isinstance(error, ray.exceptions.WorkerCrashedError | ray.exceptions.NodeDiedError):
        return f"its worker died on both tries ({type(error).__name__})"
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
