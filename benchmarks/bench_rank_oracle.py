#!/usr/bin/env python
"""How long the rank intervention's oracle takes: one run's oracle rank curve
(:func:`fixedhead.diagnostics.intervention.run_rank_curve`, every layer alone and all together, k = 1 .. d_p − 1)
with the current :func:`~fixedhead.diagnostics.intervention.fit_visible` and with the ones at ``--before`` (git
commits; each function is read from that commit's source and swapped in), side by side in this one
process, on the same held-out tokens, alternated ``--repeat`` times (the machine may be shared: read
the spread). Prints the seconds of each, each earlier version's median time over the current one's,
the largest difference of any loss between the curves, and the needed rank each gives at the
command's tolerances, so a faster oracle can be seen to give the same answer. With ``--fits`` it also
times the fits alone on the run's own logits (the first sequences' heads, layer 0) at every k, and
prints each version's visible residual summed over the heads relative to the current one's. Timings are
for reading, never for asserting.

Usage (a trained causal run, e.g. one of ``make run``'s):
python benchmarks/bench_rank_oracle.py runs/compare/standard [--before 7f11611 cf1e911] [--max-eval-tokens 512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

import fixedhead.diagnostics.intervention as intervention


def fit_visible_at(commit: str):
    """``fit_visible`` as the package had it at ``commit`` (the module's source run in a fresh namespace)."""
    root = Path(__file__).resolve().parents[1]
    places = {"diagnostics/intervention.py": "fixedhead.diagnostics", "intervention.py": "fixedhead"}  # it moved
    shown = {
        path: subprocess.run(["git", "-C", str(root), "show", f"{commit}:src/fixedhead/{path}"], capture_output=True)
        for path in places
    }
    found = [path for path in places if shown[path].returncode == 0]
    if not found:
        raise SystemExit(f"--before {commit}: no intervention module at that commit")
    source, package_name = shown[found[0]].stdout.decode(), places[found[0]]
    module = types.ModuleType(f"fixedhead._intervention_{commit}")
    module.__package__ = package_name
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{commit}:intervention.py", "exec"), module.__dict__)  # the project's own history
    intervention._register()  # executing the old module re-registered its attention function: restore ours
    return module.fit_visible


def timed_curve(fit, run: str, max_eval_tokens: int) -> tuple[float, dict]:
    current = intervention.fit_visible
    intervention.fit_visible = fit
    try:
        start = time.perf_counter()
        curve = intervention.run_rank_curve(run, max_eval_tokens, progress=False, method="oracle")
        return time.perf_counter() - start, curve
    finally:
        intervention.fit_visible = current


def layer0_logits(run: str, max_eval_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The first attention layer's logits [sequences, heads, n, n] on the held-out tokens, its mask and d_p."""
    caught = []

    def catch(logits, visible, rank, **kwargs):
        caught.append((logits.clone(), visible.clone()))
        return intervention.truncate_logits(logits, rank)

    curve = timed_curve(catch, run, max_eval_tokens)[1]
    return *caught[0], curve["head_dims"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a trained causal run folder")
    parser.add_argument("--before", nargs="+", default=["7f11611"], help="git commits whose fit_visible is timed")
    parser.add_argument("--max-eval-tokens", type=int, default=512, help="held-out tokens scored")
    parser.add_argument("--repeat", type=int, default=1, help="times each version's curve is timed, alternated")
    parser.add_argument("--fits", action="store_true", help="also time the fits alone on layer 0's logits")
    args = parser.parse_args()

    versions = {commit: fit_visible_at(commit) for commit in args.before} | {"current": intervention.fit_visible}
    seconds: dict[str, list[float]] = {label: [] for label in versions}
    curves = {}
    for _ in range(args.repeat):
        for label, fit in versions.items():
            took, curves[label] = timed_curve(fit, args.run, args.max_eval_tokens)
            seconds[label].append(round(took, 1))
    now = curves["current"]
    median = {label: statistics.median(s) for label, s in seconds.items()}
    record = {
        "run": args.run,
        "scored_tokens": now["scored_tokens"],
        "head_dims": now["head_dims"],
        "threads": torch.get_num_threads(),
        "seconds": seconds,
        "speed-up (median before / median current)": {c: round(median[c] / median["current"], 2) for c in args.before},
        "largest_loss_difference": {
            c: max(abs(curves[c]["curves"][s][k] - loss) for s in now["curves"] for k, loss in now["curves"][s].items())
            for c in args.before
        },
        "full": now["full"],
        "needed": {
            label: {
                f"{t:g}": {s: intervention.needed_rank(losses, c["full"], t) for s, losses in c["curves"].items()}
                for t in intervention.TOLERANCES
            }
            for label, c in curves.items()
        },
    }
    if args.fits:
        logits, visible, head_dim = layer0_logits(args.run, args.max_eval_tokens)
        mask = visible.double()
        record["fits"] = {}
        for k in range(1, head_dim):
            row = {}
            residuals = {}
            for label, fit in versions.items():
                start = time.perf_counter()
                out = fit(logits, visible, k)
                row[f"{label}_s"] = round(time.perf_counter() - start, 2)
                residuals[label] = float((mask * (logits.double() - out)).pow(2).sum())
            for c in args.before:
                row[f"{c}_residual / current"] = residuals[c] / residuals["current"]
            record["fits"][k] = row
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
