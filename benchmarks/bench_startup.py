#!/usr/bin/env python
"""How long the `fixedhead` command takes before it does anything: `--help` and a bad option.

Both should answer in under a second (the goal of a command line whose heavy imports are lazy); every
one-line error a user meets costs at least this. Each row is the median wall time of ``--repeats``
fresh processes, with ``import fixedhead`` alone beside them (what a Python user pays: it registers the
Auto classes, which imports torch and transformers; the command registers them after parsing), and the
exit status each command must have (0 for ``--help``, 2 for a bad option): a row whose command did
something else is an error, not a number.

Usage::

    .venv/bin/python benchmarks/bench_startup.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

FIXEDHEAD = Path(sys.executable).with_name("fixedhead")
ROWS = (
    ("fixedhead --help", [str(FIXEDHEAD), "--help"], 0),
    ("fixedhead pretrain --no-such-option", [str(FIXEDHEAD), "pretrain", "--no-such-option"], 2),
    ("python -c 'import fixedhead'", [sys.executable, "-c", "import fixedhead"], 0),
)
GOAL_SECONDS = 1.0


def seconds(command: list[str], expected_status: int, repeats: int) -> float:
    """Median wall seconds of ``repeats`` runs of ``command``.

    Raises:
        RuntimeError: a run exited with another status than ``expected_status`` (its stderr's last line).
    """
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != expected_status:
            last = (done.stderr.strip().splitlines() or [""])[-1]
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}, not {expected_status}: {last}")
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per row (default 3)")
    args = parser.parse_args(argv)
    print(f"| command | median seconds ({args.repeats} runs) | / goal {GOAL_SECONDS:g} s |")
    print("|---|---|---|")
    for name, command, status in ROWS:
        s = seconds(command, status, args.repeats)
        print(f"| `{name}` | {s:.2f} | {s / GOAL_SECONDS:.1f}× |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
