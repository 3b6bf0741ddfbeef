#!/usr/bin/env python
"""How long the rank intervention's oracle takes: one run's oracle rank curve
(:func:`fixedhead.intervention.run_rank_curve`, every layer alone and all together, k = 1 .. d_p − 1)
with the current :func:`~fixedhead.intervention.fit_visible` and with the one at ``--before`` (a git
commit; its function is read from that commit's source and swapped in), side by side in this one
process, on the same held-out tokens. Prints the seconds of each, their ratio, the largest difference
of any loss on the two curves, and the needed rank each gives at the command's tolerances, so a faster
oracle can be seen to give the same answer. Timings are for reading, never for asserting.

Usage (a trained causal run, e.g. one of ``make run``'s):
python benchmarks/bench_rank_oracle.py runs/compare/standard [--before 7f11611] [--max-eval-tokens 2048]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import fixedhead.intervention as intervention


def fit_visible_at(commit: str):
    """``fit_visible`` as the package had it at ``commit`` (the module's source run in a fresh namespace)."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(
        ["git", "-C", str(root), "show", f"{commit}:src/fixedhead/intervention.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("fixedhead._intervention_before")
    module.__package__ = "fixedhead"
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{commit}:intervention.py", "exec"), module.__dict__)  # the project's own history
    intervention._register()  # executing the old module re-registered its attention function: restore ours
    return module.fit_visible


def timed_curve(run: str, max_eval_tokens: int) -> tuple[float, dict]:
    start = time.perf_counter()
    curve = intervention.run_rank_curve(run, max_eval_tokens, progress=False, method="oracle")
    return time.perf_counter() - start, curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a trained causal run folder")
    parser.add_argument("--before", default="7f11611", help="the git commit whose fit_visible is timed against")
    parser.add_argument("--max-eval-tokens", type=int, default=2048, help="held-out tokens scored")
    args = parser.parse_args()

    after = intervention.fit_visible
    intervention.fit_visible = fit_visible_at(args.before)
    try:
        before_s, before = timed_curve(args.run, args.max_eval_tokens)
    finally:
        intervention.fit_visible = after
    after_s, now = timed_curve(args.run, args.max_eval_tokens)
    largest = max(abs(before["curves"][s][k] - now["curves"][s][k]) for s in now["curves"] for k in now["curves"][s])
    needed = {
        label: {
            f"{t:g}": {s: intervention.needed_rank(losses, c["full"], t) for s, losses in c["curves"].items()}
            for t in intervention.TOLERANCES
        }
        for label, c in (("before", before), ("after", now))
    }
    print(
        json.dumps(
            {
                "run": args.run,
                "scored_tokens": now["scored_tokens"],
                "head_dims": now["head_dims"],
                "before": args.before,
                "before_s": round(before_s, 1),
                "after_s": round(after_s, 1),
                "speed-up": round(before_s / after_s, 2),
                "largest_loss_difference": largest,
                "full": now["full"],
                "needed": needed,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
