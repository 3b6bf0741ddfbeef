"""The re-decision of docs/results/redecide-plan.md, from the committed files (no training)."""

import json
from pathlib import Path

from fixedhead.studies.kit.stats import difference_word, holm, mean_std, paired_difference, seeds_for, welch

R = Path("docs/results")
mr = {}  # make run: model -> {seed: held-out loss}; seed 0 in make-run/, seed S in make-run/seed-S/
for f in [R / "make-run/results.json", *sorted(R.glob("make-run/seed-*/results.json"))]:
    stored = json.load(open(f))
    seed = 0 if f.parent.name == "make-run" else int(f.parent.name.removeprefix("seed-"))
    for r in stored["runs"].values() if "runs" in stored else stored["results"]:  # the kit's record or the older one
        mr.setdefault(r["name"], {})[seed] = r["heldout_loss"]
t2b = {}  # Table 2B: model key -> {seed: held-out loss}
for r in json.load(open(R / "table2b-seeds/results.json"))["runs"].values():
    t2b.setdefault(r["key"], {})[r["seed"]] = r["heldout_loss"]

rows = [
    ("make run: fixed d_p = 32 − standard d_p = 8", mr["standard"], mr["fixed"]),
    ("make run: standard-wide d = 160 − standard", mr["standard"], mr["standard-wide"]),
    ("Table 2B masked: d_p = 64 − d_p = 8 (h = 8)", t2b["d128-h8-dp8-fixed"], t2b["d128-h8-dp64-fixed"]),
]
done = []
for label, a, b in rows:
    seeds = sorted(set(a) & set(b))
    x, y = [a[s] for s in seeds], [b[s] for s in seeds]
    done.append((label, seeds, x, y, paired_difference(x, y)))
adjusted = holm([d["p"] for *_, d in done])
HEADER = ["comparison", "seeds", "per-seed differences", "Δ nats [95% interval]", "paired p (Holm)", "Welch p", "sd"]
print("| " + " | ".join(HEADER + ["seeds for 0.02", "word"]) + " |")
print("|---" * (len(HEADER) + 2) + "|")
for (label, seeds, x, y, d), q in zip(done, adjusted, strict=True):
    diffs = [v - u for u, v in zip(x, y, strict=True)]
    sd = mean_std(diffs)[1]
    print(
        f"| {label} | {seeds[0]}–{seeds[-1]} ({len(seeds)}) | {', '.join(f'{v:+.3f}' for v in diffs)} | "
        f"{d['difference']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | {d['p']:.2g} ({q:.2g}) | {welch(x, y)[1]:.2g} | "
        f"{sd:.3f} | {seeds_for(sd, 0.02, 0.01 / 3)} | {difference_word(d['difference'], d['low'], d['high'], q)} |"
    )
