"""What seq-len-long's twelve points bound, recomputed from results.json (post hoc: none of this was in its plan).

    .venv/bin/python docs/results/seq-len-long/bounds.py

Prints, per architecture: the gap (d_p 32 - d_p 8 held-out loss, nats) of every (n, seed), the gap pooled over
n and seeds, the paired interval of each n against the +-0.02-nat margin (equivalence only where an interval
lies inside it), and the change of the gap from n / d_p = 8 to 32 as the slope of a least-squares line of the
gap on log4(n / 64) over the six points (4 degrees of freedom, seeds treated as independent); then the sign
test over all twelve pairs and each model's needed rank (the smallest k of the grid within a tolerance of its
full-rank loss) at 0.01 and 0.002 nats.
"""

import json
from pathlib import Path

import numpy as np
from scipy import stats

MARGIN = 0.02
runs = json.loads((Path(__file__).parent / "results.json").read_text())["runs"]
gaps, needed = {}, {}
for point in runs.values():
    models = {m["head_dim"]: m for m in point["models"]}
    arch, n, seed = models[8]["architecture"], models[8]["n"], models[8]["seed"]
    gaps[arch, n, seed] = models[32]["heldout_loss"] - models[8]["heldout_loss"]
    for d_p, m in models.items():
        full, cut = m["curve"]["full"], m["curve"]["curves"]["all"]
        needed[arch, n, seed, d_p] = {
            tol: min([int(k) for k, v in cut.items() if v - full <= tol and int(k) <= d_p] + [d_p])
            for tol in (0.01, 0.002)
        }
for arch in ("fixedhead", "llama"):
    rows = {k: v for k, v in gaps.items() if k[0] == arch}
    print(f"{arch}: gaps " + ", ".join(f"n {n} s{s} {g:+.4f}" for (_, n, s), g in sorted(rows.items())))
    print(f"  pooled over n and seeds: {np.mean(list(rows.values())):+.4f}")
    for n in (64, 128, 256):
        g = np.array([rows[arch, n, s] for s in (0, 1)])
        half = stats.t.ppf(0.975, len(g) - 1) * g.std(ddof=1) / np.sqrt(len(g))
        inside = "inside" if abs(g.mean()) + half < MARGIN else "not inside"
        print(f"  n {n}: {g.mean():+.4f} [{g.mean() - half:+.4f}, {g.mean() + half:+.4f}], {inside} +-{MARGIN}")
    x = [np.log(n / 64) / np.log(4) for (_, n, _) in rows]
    fit = stats.linregress(x, list(rows.values()))
    half = stats.t.ppf(0.975, len(x) - 2) * fit.stderr
    print(f"  change of the gap, n / d_p 8 -> 32: {fit.slope:+.4f} [{fit.slope - half:+.4f}, {fit.slope + half:+.4f}]")
lower = sum(g < 0 for g in gaps.values())
print(f"larger head lower in {lower} of {len(gaps)} pairs, sign test p = {stats.binomtest(lower, len(gaps)).pvalue:.4f}")
for tol in (0.01, 0.002):
    line = ", ".join(f"{a} d_p {d}: " + "/".join(str(v[tol]) for (aa, _, _, dd), v in sorted(needed.items()) if (aa, dd) == (a, d))
                     for a in ("fixedhead", "llama") for d in (8, 32))
    print(f"needed rank at {tol} nats (n 64, 128, 256, seeds 0 and 1 each): {line}")
