#!/usr/bin/env python
"""A study's points in this process one after another against ``--workers 2`` (Ray tasks on a local
instance), in one run on one machine: the wall-clock ratio and Ray's start-up seconds.

The study is ``fixedhead farthest-point --quick --more-heads 4`` (4 points: ranks 2 and 4 × head sizes 2
and 4, h = 4, seed 0) with ``--steps`` raised so that a point takes seconds, not tenths; both runs use
one torch thread per point, so their numbers are the same bit for bit (checked here: the per-point
results must agree). Each run is a fresh ``fixedhead`` process in a new folder, so both pay the same
imports; the Ray run also pays Ray's start-up and its workers' imports, measured apart as the seconds
``ray.init`` takes to start a local instance. Timings are for reading, never for asserting.

Usage: python benchmarks/bench_study_workers.py [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent / "fixedhead"


def run(folder: Path, steps: int, extra: list[str]) -> float:
    """Wall seconds of one ``fixedhead farthest-point`` command into ``folder``."""
    argv = [str(BIN), "farthest-point", "--quick", "--more-heads", "4", "--steps", str(steps), "--threads", "1"]
    argv += ["--no-progress", "--output-dir", str(folder), *extra]
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start


def untimed(value):
    """``value`` without the entries that are wall times (``*seconds*`` keys, at any depth)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if "seconds" not in k}
    return [untimed(v) for v in value] if isinstance(value, list) else value


def ray_start_seconds() -> float:
    """Seconds ``ray.init`` takes to start a local instance of 2 CPUs (no dashboard), and its shutdown apart."""
    import ray

    start = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 2**20,
        _system_config={"worker_niceness": 0},
    )
    took = time.perf_counter() - start
    ray.shutdown()
    return took


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20000, help="training steps per point (default 20000)")
    p.add_argument("--out", type=Path, help="keep the two study folders here (default: a temporary folder)")
    args = p.parse_args(argv)
    load = os.getloadavg()[0]  # other work on the machine shares its cores with the two runs
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        serial = run(root / "in-process", args.steps, [])
        workers = run(root / "workers-2", args.steps, ["--workers", "2"])
        startup = ray_start_seconds()
        a, b = (json.loads((root / f / "results.json").read_text()) for f in ("in-process", "workers-2"))
        same = untimed(a["runs"]) == untimed(b["runs"])
        point_seconds = [r["train_seconds"] for r in a["runs"].values()]
        ray_seconds = [r["train_seconds"] for r in b["runs"].values()]
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(
        f"points: {len(point_seconds)}; seconds a point in-process {min(point_seconds):.1f}-{max(point_seconds):.1f}, "
        f"on the Ray workers {min(ray_seconds):.1f}-{max(ray_seconds):.1f}"
    )
    print(f"in-process: {serial:.1f} s; --workers 2: {workers:.1f} s; ratio {serial / workers:.2f}x")
    print(f"ray.init of a local instance: {startup:.1f} s")
    print(f"results the same (every number but seconds): {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
