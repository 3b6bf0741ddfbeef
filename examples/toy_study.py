"""A study in one file: the rank of one attention head's logits against its head size.

A head of size d_p scores n tokens with logits (X W_q)(X W_k)^T / sqrt(d_p), an [n, n] matrix of rank at most
d_p: the low-rank bottleneck (paper Section 3; Theorem 1 needs d_p >= n to represent every attention matrix).
For random hidden states and weights the rank is min(d_p, n, d), every seed. The kit does the rest: the
folder, plan.json, resume, results.json, the report's notes (docs/writing-a-study.md).

    python examples/toy_study.py --output-dir runs/logit-rank

or, registered with one line of fixedhead.studies.STUDIES (``"logit-rank": "toy_study:LogitRankStudy"``, this
folder importable), ``fixedhead logit-rank --quick``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass

import numpy as np

from fixedhead.checks import positive_int
from fixedhead.studies.kit import render
from fixedhead.studies.kit.core import run_key, seed_major
from fixedhead.studies.kit.study import Point, Study, run_study
from fixedhead.theory import numerical_rank


@dataclass(frozen=True)
class LogitRankOptions:
    n: int = 32
    """tokens per sequence"""
    hidden_size: int = 64
    """d: the width of the hidden states the head reads"""
    head_dims: tuple[int, ...] = (4, 8, 16, 32, 64)
    """the head sizes d_p to measure"""
    seeds: tuple[int, ...] = (0, 1, 2)
    """seeds of the random hidden states and weights"""

    def __post_init__(self):
        positive_int("n", self.n)
        positive_int("hidden_size", self.hidden_size)
        for d_p in self.head_dims:
            positive_int("head_dims", d_p)


class LogitRankStudy(Study):
    """One point per (d_p, seed): a random head's logits and their numerical rank."""

    name = "logit-rank"
    help = "the rank of a random attention head's logits against its head size (the low-rank bottleneck)"
    Options = LogitRankOptions
    quick = LogitRankOptions(head_dims=(4, 64), seeds=(0,))
    files = ("logit_rank.csv",)
    points_only = ("head_dims", "seeds")  # they only choose which points exist: more of them need only --grow
    # no resolve(): the spec run_study hands every hook is the options themselves (o)

    def plan(self, o):
        return [Point(run_key(f"dp{d_p}", seed=s), (d_p, s)) for d_p, s in seed_major(o.head_dims, o.seeds)]

    def plan_record(self, o):
        return {"expected": "every head's logit rank is min(d_p, n, d)"}

    def run(self, o, point, folder, done, progress):
        d_p, seed = point.spec
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((o.n, o.hidden_size))  # [n, d]
        w_q, w_k = rng.standard_normal((2, o.hidden_size, d_p)) / np.sqrt(o.hidden_size)  # each [d, d_p]
        logits = (x @ w_q) @ (x @ w_k).T / np.sqrt(d_p)  # [n, n]
        return {"head_dim": d_p, "seed": seed, "logit_rank": numerical_rank(logits)}

    def summarise(self, state):
        o, results = state["options"], state["results"]
        rows = [
            {
                "head_dim": d_p,
                "bound": min(d_p, o.n, o.hidden_size),
                "ranks": [r["logit_rank"] for r in results if r["head_dim"] == d_p],
            }
            for d_p in o.head_dims
        ]
        return {"rows": rows, "passed": all(rank == r["bound"] for r in rows for rank in r["ranks"])}

    def report(self, state):
        o, summary = state["options"], state["summary"]
        ranks = ("logit rank per seed", lambda r: ", ".join(map(str, r["ranks"])))
        verdict = "Every head's logits reach the bound." if summary["passed"] else "**A head misses the bound.**"
        return render.markdown(
            render.Report(
                "The rank of one head's logits against its head size",
                [
                    f"Random hidden states (n = {o.n}, d = {o.hidden_size}) and weights, seeds {list(o.seeds)}; "
                    "the logits' numerical rank against the bound min(d_p, n, d) (paper Section 3).",
                    f"Command: `{state['meta']['command']}`",
                    render.Table([("d_p", "{head_dim}"), ("min(d_p, n, d)", "{bound}"), ranks], summary["rows"]),
                    verdict,
                ],
            )
        )

    def write_files(self, state, folder):
        render.write_csv(folder / "logit_rank.csv", ["head_dim", "seed", "logit_rank"], state["results"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=LogitRankStudy.help)
    parser.add_argument("--output-dir", help="default: runs/logit-rank (--quick: runs/logit-rank-quick)")
    parser.add_argument("--quick", action="store_true", help="two head sizes, one seed")
    parser.add_argument("--grow", action="store_true", help="accept another plan after results exist")
    parser.add_argument("--overwrite", action="store_true", help="run every point again")
    args = parser.parse_args()
    study = LogitRankStudy()
    command = shlex.join(["python", "examples/toy_study.py", *sys.argv[1:]])  # as given, --quick included
    how = {"grow": args.grow, "overwrite": args.overwrite}
    try:
        run_study(study, output_dir=args.output_dir, quick=args.quick, command=command, **how)
    except (ValueError, OSError) as e:  # a refusal: one line and exit status 2, as the fixedhead command
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    print((study.folder / "report.md").read_text())
