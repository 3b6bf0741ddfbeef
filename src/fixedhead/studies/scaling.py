"""`fixedhead scaling`: does head size matter as models grow? Loss against size and compute, per
head-size family.

The paper's Figure 1 plots performance against parameters for standard and fixed heads and claims
"better performance scaling" for the fixed ones. A claim about scaling is a claim about curves,
so this study trains each *family* at several sizes and fits one curve per family (Kaplan et al.
2020, "Scaling Laws for Neural Language Models", Section 3):

* ``standard``: d_p = d/h (the head shrinks as heads are added at a fixed d);
* ``threshold``: d_p fixed at the paper's threshold for the objective, n for a masked LM
  (Theorem 2) and ⌈(n − 1)/2⌉ for a causal one (:func:`fixedhead.theory.causal_threshold`);
* ``d_p=K``: a constant head size K (64 by default: modern practice, e.g. Llama, GPT-2).

Each size (d, h) is trained with ``tokens_per_parameter`` training tokens per non-embedding
parameter (Chinchilla's ~20 by default), at least ``min_steps`` and at most ``max_tokens``; each
(family, size) point chooses its own learning rate on a validation split with the first seed
(:mod:`fixedhead.studies.learning_rate`), and the other seeds train at that rate. Every run is
scored on the same held-out documents (loss in nats per token and bits per character).

Outputs in the study folder: ``results.json`` (the plan, written before any training, then one
row per run after each), ``report.md`` (the table, the fitted power laws L = a·X^(−b) against
non-embedding parameters N and training FLOPs C, their exponents over seeds, the compute
multiplier of each family against ``standard`` at each size, and the per-size loss differences
with Welch's test), and ``scaling.png``. Training FLOPs are Kaplan et al.'s estimate
C = 6·N·T + 6·l·n·i·T for T training tokens, l layers, context n and attention width i = h·d_p
(Section 2.1: forward 2N + 2·l·n·i per token, training 3× forward), the same formula for every
architecture.
"""

from __future__ import annotations

import fcntl
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..analysis import analyze_model, load_encoder
from ..checks import positive_float, positive_int
from ..data import prepare_data
from ..data.lm import unigram_perplexity
from ..model.architectures import build_config, check_objective_for, non_embedding_parameters
from ..plotting import pyplot, save_figure
from ..runs import load_json_file, write_text_atomic
from ..theory import causal_threshold
from ..training.evaluate import DivergedError
from ..training.pretrain import train_or_reuse
from . import core, render
from .learning_rate import DIVERGED, RULE, choose_rate, losses_record, parse_rates, with_validation_split
from .recipes import get_recipe
from .stats import holm, mean_std, pm, welch

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
PLOT_FILE = "scaling.png"
RANK_PLOT_FILE = "ranks.png"
OWNED = (REPORT_FILE, PLOT_FILE, RANK_PLOT_FILE, "runs")
#: a per-size difference counts at this Holm-corrected level (corrected over the sizes of a family)
ALPHA = 0.01
#: trained-rank diagnostics count directions carrying at least 1% of a head's largest singular value
#: (float32 resolution, 1e-5, fills every head's structural rank and says nothing), on this many
#: evenly spaced held-out windows
RANK_RTOL = 1e-2
RANK_WINDOWS = 16


@dataclass
class ScalingPreset:
    """The sizes, families, token rule, seeds and learning-rate grid of a scaling study."""

    recipe: str
    #: (d, h) per size at the recipe's depth; the FFN is 4d
    sizes: tuple[tuple[int, int], ...]
    families: tuple[str, ...] = ("standard", "threshold", "d_p=64")
    tokens_per_parameter: float = 20.0
    min_steps: int = 100
    max_tokens: int | None = None
    seeds: tuple[int, ...] = (0, 1)
    #: each point's grid (chosen on the validation split with the first seed); empty: the recipe's rate
    learning_rates: tuple[float, ...] = (5e-4, 1e-3, 2e-3, 4e-3)
    max_extensions: int = 2
    #: model fields every run shares beyond the recipe's (e.g. an architecture)
    model: dict = field(default_factory=dict)

    def __post_init__(self):
        if len(self.sizes) < 2:
            raise ValueError(f"a scaling study needs at least 2 sizes, got {list(self.sizes)}")
        for d, h in self.sizes:
            positive_int("hidden_size", d)
            positive_int("num_attention_heads", h)
            if d % h:
                raise ValueError(f"hidden_size {d} is not a multiple of num_attention_heads {h} (standard d_p = d/h)")
        for f in self.families:
            family_head_dim(f, "clm", 64)  # refuses an unknown family by name
        positive_float("tokens_per_parameter", self.tokens_per_parameter)
        positive_int("min_steps", self.min_steps)


SCALING_PRESETS = {
    # causal LMs at n = 64 with make run's recipe, standard d_p = 8; 4 sizes spanning ~9x in
    # non-embedding parameters; every run capped at 500k tokens (245 steps, fewer than 20 per
    # parameter at every size: L(N) at a fixed token budget). Short runs do best at higher rates
    # than make run's 2e-3 at 700 steps, so the grid is centred higher. 60 runs, about 80 minutes
    # on a 2-core CPU (step time is dominated by the 8,192-way output layer at these widths)
    "cpu": lambda: ScalingPreset(
        recipe="cpu-clm",
        sizes=((32, 4), (48, 6), (64, 8), (112, 14)),
        max_tokens=500_000,
        min_steps=200,
        learning_rates=(1e-3, 2e-3, 4e-3, 8e-3),
        max_extensions=1,
    ),
    # one GPU: n = 128 (the causal threshold is 64, so the threshold family is also modern practice's
    # d_p = 64), 4 layers, d = 128...512 with standard d_p = 16 (~14x in N), 20 tokens per parameter
    # up to 4M tokens; bf16. benchmarks/gpu_scaling.sh runs it as several workers sharing the GPU
    "gpu": lambda: ScalingPreset(
        recipe="gpu-clm",
        sizes=((128, 8), (256, 16), (384, 24), (512, 32)),
        families=("standard", "threshold"),
        max_tokens=4_000_000,
        min_steps=200,
        learning_rates=(5e-4, 1e-3, 2e-3, 4e-3),
        max_extensions=1,
    ),
    "tiny": lambda: ScalingPreset(
        recipe="tiny",
        sizes=((16, 2), (32, 4)),
        families=("standard", "threshold"),
        tokens_per_parameter=1.0,
        min_steps=4,
        max_tokens=2_000,
        seeds=(0, 1),
        learning_rates=(2e-3, 4e-3),
        max_extensions=0,
    ),
}


def get_scaling_preset(name: str) -> ScalingPreset:
    """Raises ValueError listing the known preset names."""
    return core.pick(SCALING_PRESETS, name, "scaling")


def family_head_dim(family: str, objective: str, n: int) -> int | None:
    """The head size d_p of a family's model of size (d, h): None (standard, d/h), the threshold
    for the objective at sequence length n, or the constant of ``"d_p=K"``.

    Raises:
        ValueError: an unknown family (the known ones named).
    """
    if family == "standard":
        return None
    if family == "threshold":
        return causal_threshold(n) if objective == "clm" else n
    if family.startswith("d_p=") and family[4:].isdigit() and int(family[4:]) > 0:
        return int(family[4:])
    raise ValueError(f"unknown head-size family {family!r}: use standard, threshold or d_p=K (e.g. d_p=64)")


def training_flops(n_params: int, tokens: int, layers: int, n: int, attention_width: int) -> float:
    """C = 6·N·T + 6·l·n·i·T (Kaplan et al. 2020, Section 2.1), in FLOPs."""
    return 6.0 * tokens * (n_params + layers * n * attention_width)


def plan_points(p: ScalingPreset, objective: str, n: int, vocab_size: int, batch_size: int, layers: int) -> list[dict]:
    """Every (family, size) point: its model fields, N, training steps and tokens, and FLOPs."""
    recipe = get_recipe(p.recipe)
    points = []
    for family in p.families:
        for d, h in p.sizes:
            head_dim = family_head_dim(family, objective, n)
            fields = recipe.model_fields(
                hidden_size=d, num_attention_heads=h, head_dim=head_dim, intermediate_size=4 * d, **p.model
            )
            config = build_config({**fields, "vocab_size": vocab_size})
            if objective == "clm" and config.model_type != "llama":
                config.is_decoder = True
            n_params = non_embedding_parameters(config)
            tokens_per_step = batch_size * n
            wanted = p.tokens_per_parameter * n_params
            if p.max_tokens is not None:
                wanted = min(wanted, p.max_tokens)
            steps = max(p.min_steps, math.ceil(wanted / tokens_per_step))
            width = h * (head_dim or d // h)
            points.append(
                {
                    "key": f"{family}-d{d}",
                    "family": family,
                    "hidden_size": d,
                    "num_attention_heads": h,
                    "head_dim": head_dim or d // h,
                    "fields": fields,
                    "non_embedding_parameters": n_params,
                    "steps": steps,
                    "tokens": steps * tokens_per_step,
                    "flops": training_flops(n_params, steps * tokens_per_step, layers, n, width),
                }
            )
    return points


def run_scaling(
    preset: str | ScalingPreset = "cpu",
    output_dir: str | Path = "runs/scaling",
    seeds: list[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    cache_dir=None,
    command: str | None = None,
    learning_rates: str | list[float] | None = None,
    corpus: str | None = None,
    architecture: str | None = None,
) -> dict:
    """Train every point of the preset for every seed (finished runs are reused), choosing each
    point's learning rate on the validation split first (every run trains without that split);
    write ``results.json``, ``report.md`` and ``scaling.png``. ``corpus``: another corpus than the
    recipe's; ``architecture``: every model as this family (:mod:`fixedhead.model.architectures`,
    ``"llama"``: transformers' ``LlamaForCausalLM``, causal only). Returns the results state.

    Raises:
        ValueError: bad seeds or rates; FileExistsError: the folder holds something else or runs of
        other settings (without ``overwrite``); FileNotFoundError: a missing corpus.
    """
    p = get_scaling_preset(preset) if isinstance(preset, str) else preset
    p = replace(p, seeds=core.seeds_override(seeds, p.seeds))
    if learning_rates is not None:
        p = replace(p, learning_rates=tuple(parse_rates(learning_rates)))
    if architecture is not None and architecture != "fixedhead":
        p = replace(p, model={**p.model, "architecture": architecture})
    recipe = get_recipe(p.recipe)
    data_settings = with_validation_split(replace(recipe.data, corpus=corpus) if corpus else recipe.data)
    train = replace(recipe.train, progress=progress)
    n = data_settings.max_seq_length
    probe = build_config(recipe.model_fields(hidden_size=p.sizes[0][0], num_attention_heads=p.sizes[0][1], **p.model))
    check_objective_for(probe, train.objective)  # a Llama model is causal: refused before any work
    settings = {
        "data": data_settings.record(),
        "train": {k: v for k, v in asdict(train).items() if k not in ("seed", "progress", "max_steps")},
        "preset": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(p).items() if k != "seeds"},
    }
    settings = json.loads(json.dumps(settings, default=str))
    out = core.claim(Path(output_dir), RESULTS_FILE, OWNED, "scaling")
    previous, meta = core.resume(
        out / RESULTS_FILE, preset, describe(p), command, settings, "recipe, sizes, families or grid", None, overwrite
    )
    data = prepare_data(data_settings, cache_dir=cache_dir, progress=progress)
    out = core.claim(out, RESULTS_FILE, OWNED, "scaling", create=True, overwrite=overwrite)
    points = plan_points(p, train.objective, n, len(data.tokenizer), train.batch_size, recipe.layers)
    meta.update(
        plan={
            "points": [{k: v for k, v in pt.items() if k != "fields"} for pt in points],
            "seeds": list(p.seeds),
            "learning_rates": list(p.learning_rates),
            "rate_rule": RULE,
            "verdict_rule": f"Welch's t-test per size on the seeds' held-out losses, Holm-corrected over "
            f"a family's sizes, p < {ALPHA}",
        },
        n=n,
        objective=train.objective,
        data_info={k: v for k, v in data.info.items() if k != "prepare_seconds"},
    )
    state = {
        "meta": meta,
        "unigram_perplexity": unigram_perplexity(data, train.eval_seed, train.objective),
        "tuning": previous.get("tuning", {}),
        "runs": previous.get("runs", {}),
        "ranks": previous.get("ranks", {}),
    }

    def save():
        # workers sharing the folder: merge what the others recorded, one writer at a time
        with open(out / f".{RESULTS_FILE}.lock", "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            other = load_json_file(out / RESULTS_FILE) if (out / RESULTS_FILE).is_file() else {}
            for part in ("runs", "tuning", "ranks"):
                state[part].update({k: v for k, v in other.get(part, {}).items() if k not in state[part]})
            core.save_state(out / RESULTS_FILE, state, state["runs"].values())

    save()  # the plan before any training
    from ..training.pretrain import lm_config

    def train_point(pt, lr, seed):
        config = lm_config(build_config(pt["fields"]), data.tokenizer, train.objective)
        steps = pt["steps"]
        settings = replace(
            train, learning_rate=lr, seed=seed, max_steps=steps, eval_steps=max(1, steps // 4), save_steps=steps
        )
        run_dir = out / "runs" / f"{pt['key']}-lr{lr:g}-s{seed}"
        if progress:
            print(f"{pt['key']} (N = {pt['non_embedding_parameters']:,}) lr {lr:g} seed {seed}: {run_dir}", flush=True)
        result = train_or_reuse(config, data, run_dir, settings, overwrite)
        row = {k: v for k, v in result.items() if k not in ("eval_curve", "train_curve", "reproducibility")}
        state["runs"][f"{pt['key']}-lr{lr:g}-s{seed}"] = {
            **row,
            "point": pt["key"],
            "family": pt["family"],
            "learning_rate": lr,
            "seed": seed,
            "non_embedding_parameters": pt["non_embedding_parameters"],
            "flops": pt["flops"],
        }
        save()
        return result

    first, rest = p.seeds[0], p.seeds[1:]
    windows = data.heldout[torch.linspace(0, len(data.heldout) - 1, min(RANK_WINDOWS, len(data.heldout))).long()]
    for pt in points:
        lock = core.try_lock(out / "runs" / pt["key"])  # a point (its grid and seeds) is one worker's
        if lock is None:
            if progress:
                print(f"{pt['key']}: another worker is on this point; skipping it", flush=True)
            continue
        if p.learning_rates:

            def at(lr, pt=pt):
                try:
                    return train_point(pt, lr, first)["validation_loss"]
                except DivergedError:
                    return DIVERGED

            best, losses, bracketed = choose_rate(at, p.learning_rates, p.max_extensions)
            state["tuning"][pt["key"]] = {
                "chosen": best,
                "bracketed": bracketed,
                "validation_loss": losses_record(losses),
            }
            save()
        else:
            best = train.learning_rate
            train_point(pt, best, first)
        for seed in rest:
            train_point(pt, best, seed)
        name = f"{pt['key']}-lr{best:g}-s{first}"
        if overwrite or state["ranks"].get(pt["key"], {}).get("run") != name:
            state["ranks"][pt["key"]] = {"run": name, **trained_ranks(out / "runs" / name, windows)}
        lock.unlink(missing_ok=True)
        save()
    save()
    write_outputs(state, out)
    return state


def trained_ranks(run_dir: Path, windows, rtol: float = RANK_RTOL) -> dict:
    """Does the low-rank bottleneck bind in a trained run? Its heads' ranks on ``windows``
    [num_windows, n]: :meth:`fixedhead.analysis.AttentionAnalysis.summary`."""
    model, _ = load_encoder(run_dir)
    return analyze_model(model, windows, rtol=rtol).summary()


def describe(p: ScalingPreset) -> str:
    recipe = get_recipe(p.recipe)
    sizes = ", ".join(f"d={d}/h={h}" for d, h in p.sizes)
    cap = f", at most {p.max_tokens:,}" if p.max_tokens else ""
    return (
        f"{recipe.describe().split(', ')[0]}, {recipe.layers} layers, n={recipe.data.max_seq_length}; families "
        f"{', '.join(p.families)}; sizes {sizes}; {p.tokens_per_parameter:g} tokens per non-embedding parameter "
        f"(at least {p.min_steps} steps{cap}); seeds {', '.join(map(str, p.seeds))}"
    )


# ------------------------------------------------------------------------------- summary
def chosen_rows(state: dict) -> dict[str, list[dict]]:
    """{point key: its runs at the chosen rate (the recipe's rate without a grid)}, seeds ascending."""
    rows = {}
    for r in state["runs"].values():
        chosen = state["tuning"].get(r["point"], {}).get("chosen", r["learning_rate"])
        if r["learning_rate"] == chosen:
            rows.setdefault(r["point"], []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in rows.items()}


def power_law(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) of the least-squares fit log y = log a − b·log x (L = a·X^(−b)). Raises ValueError
    with fewer than 2 distinct x."""
    import numpy as np

    if len(set(xs)) < 2:
        raise ValueError(f"a power law needs at least 2 distinct sizes, got {sorted(set(xs))}")
    slope, intercept = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(math.exp(intercept)), float(-slope)


def summarize(state: dict) -> dict:
    """Per family: its points (mean ± std loss over seeds, bits per character), power-law fits
    against N and C (all seeds pooled, and the exponent per seed), and against ``standard``:
    the per-size loss difference with Welch's p and the compute multiplier (the FLOPs the
    standard fit needs to reach the family's loss, over the family's FLOPs; > 1: the family is
    cheaper)."""
    rows = chosen_rows(state)
    points = {pt["key"]: pt for pt in state["meta"]["plan"]["points"]}
    families: dict[str, dict] = {}
    for key, pt in points.items():
        runs = rows.get(key, [])
        if not runs:
            continue
        losses = [r["heldout_loss"] for r in runs]
        bpc = [r["heldout_bits_per_character"] for r in runs if r.get("heldout_bits_per_character") is not None]
        f = families.setdefault(pt["family"], {"points": []})
        f["points"].append(
            {
                **{k: pt[k] for k in ("key", "hidden_size", "num_attention_heads", "head_dim")},
                **{k: pt[k] for k in ("non_embedding_parameters", "tokens", "flops")},
                "learning_rate": runs[0]["learning_rate"],
                "losses": losses,
                "seeds": [r["seed"] for r in runs],
                "loss": mean_std(losses),
                "bits_per_character": mean_std(bpc) if bpc else None,
            }
        )
    for f in families.values():
        pts = f["points"]
        if len({pt["non_embedding_parameters"] for pt in pts}) < 2:
            continue
        for axis, key in (("parameters", "non_embedding_parameters"), ("flops", "flops")):
            xs = [pt[key] for pt in pts for _ in pt["losses"]]
            ys = [loss for pt in pts for loss in pt["losses"]]
            a, b = power_law(xs, ys)
            per_seed = []
            for seed in sorted({s for pt in pts for s in pt["seeds"]}):
                sx = [pt[key] for pt in pts if seed in pt["seeds"]]
                sy = [pt["losses"][pt["seeds"].index(seed)] for pt in pts if seed in pt["seeds"]]
                if len(set(sx)) >= 2:
                    per_seed.append(power_law(sx, sy))
            f[f"fit_{axis}"] = {"a": a, "b": b, "per_seed": [{"a": sa, "b": sb} for sa, sb in per_seed]}
    base = families.get("standard")
    for name, f in families.items():
        if name == "standard" or base is None:
            continue
        by_size = {pt["hidden_size"]: pt for pt in base["points"]}
        fit = base.get("fit_flops")
        for pt in f["points"]:
            ref = by_size.get(pt["hidden_size"])
            if ref is None:
                continue
            delta, p = welch(ref["losses"], pt["losses"])
            pt["versus_standard"] = {"delta_loss": delta, "fraction": delta / ref["loss"][0], "p": p}
            if fit and fit["b"] > 0:
                needed = (fit["a"] / pt["loss"][0]) ** (1 / fit["b"])
                pt["versus_standard"]["compute_multiplier"] = needed / pt["flops"]
        compared = [pt["versus_standard"] for pt in f["points"] if "versus_standard" in pt]
        for vs, adjusted in zip(compared, holm([vs["p"] for vs in compared]), strict=True):
            vs["p_holm"] = adjusted
            vs["significant"] = adjusted < ALPHA
    return families


# ------------------------------------------------------------------------------- rendering
def report_markdown(state: dict) -> str:
    meta = state["meta"]
    families = summarize(state)
    planned = len(meta["plan"]["points"]) * len(meta["plan"]["seeds"])
    done = sum(len(v) for v in chosen_rows(state).values())
    lines = render.head(
        "Scaling: loss against size and compute, per head-size family",
        meta,
        [
            f"Each point chose its learning rate on a validation split with seed {meta['plan']['seeds'][0]} "
            f"(grid {', '.join(f'{x:g}' for x in meta['plan']['learning_rates']) or 'none: the recipe rate'}; "
            f"{meta['plan']['rate_rule']}); the other seeds train at that rate. Losses are held-out nats per "
            f"token (unigram reference {math.log(state['unigram_perplexity']):.3f}).",
            *render.incomplete(done, planned),
        ],
        f"![held-out loss against non-embedding parameters and training FLOPs]({PLOT_FILE})",
    )
    header = ["family", "d", "h", "d_p", "N (non-emb.)", "tokens", "FLOPs", "lr", "loss", "bits/char", "vs standard"]
    rows = []
    for name, f in families.items():
        for pt in f["points"]:
            vs = pt.get("versus_standard")
            vs_text = ""
            if vs:
                vs_text = f"{vs['delta_loss']:+.4f} ({100 * vs['fraction']:+.2f}%), Holm p = {vs['p_holm']:.2g}"
                if "compute_multiplier" in vs:
                    vs_text += f", ×{vs['compute_multiplier']:.2f} compute"
            bpc = pt["bits_per_character"]
            rows.append(
                [
                    name,
                    pt["hidden_size"],
                    pt["num_attention_heads"],
                    pt["head_dim"],
                    f"{pt['non_embedding_parameters']:,}",
                    f"{pt['tokens']:,}",
                    f"{pt['flops']:.2e}",
                    f"{pt['learning_rate']:g}",
                    pm(*pt["loss"], 4),
                    pm(*bpc, 3) if bpc else "",
                    vs_text,
                ]
            )
    lines += ["", "## Points", "", *render.table(header, rows), ""]
    lines += [
        "\"vs standard\": the family's mean loss minus the standard family's at the same d (negative: lower), as a",
        "fraction of the standard loss, Welch's p Holm-corrected over the family's sizes (a difference counts at",
        f"p < {ALPHA}; Kaplan et al. 2020 find shape effects within ~2% of loss), and the compute multiplier:",
        "the training FLOPs the standard family's fitted curve needs to reach this loss, over this point's FLOPs",
        "(> 1: this family reaches the loss more cheaply).",
        "",
        "## Power laws L = a·X^(−b)",
        "",
    ]
    fit_rows = []
    for name, f in families.items():
        for axis in ("parameters", "flops"):
            fit = f.get(f"fit_{axis}")
            if fit:
                bs = [s["b"] for s in fit["per_seed"]]
                fit_rows.append(
                    [
                        name,
                        "N" if axis == "parameters" else "C",
                        f"{fit['a']:.3g}",
                        f"{fit['b']:.4f}",
                        pm(*mean_std(bs), 4) if bs else "",
                    ]
                )
    lines += [*render.table(["family", "X", "a", "b (all seeds)", "b per seed"], fit_rows), ""]
    lines += rank_section(state)
    return "\n".join(lines) + "\n"


def rank_section(state: dict) -> list[str]:
    """The trained-rank table: per point, its logit rank against its ceiling and its patterns' rank."""
    ranks = state.get("ranks") or {}
    if not ranks:
        return []
    meta, points = state["meta"], state["meta"]["plan"]["points"]
    n, causal = meta["n"], meta["objective"] == "clm"
    need = causal_threshold(n) if causal else n
    first = next(iter(ranks.values()))
    rows = []
    for pt in points:
        r = ranks.get(pt["key"])
        if r is None:
            continue
        pattern = f"{r['pattern_rank']:.1f} ({r['pattern_rank_max']:.1f})" if r["pattern_rank"] is not None else ""
        rows.append(
            [
                pt["family"],
                pt["hidden_size"],
                pt["head_dim"],
                r["heads"],
                f"{r['logit_rank']:.1f} ({r['logit_rank_max']:.1f})",
                f"{100 * r['at_ceiling']:.0f}%",
                pattern,
            ]
        )
    header = ["family", "d", "d_p", "heads", "logit rank: mean (max)", "heads at ceiling", "pattern rank: mean (max)"]
    return [
        "## Do the heads sit at their rank ceiling?",
        "",
        f"![mean logit rank and heads at their ceiling against N]({RANK_PLOT_FILE})",
        "",
        f"Each point's seed-{meta['plan']['seeds'][0]} run at its chosen rate, on {first['windows']} evenly spaced "
        f"held-out windows of n = {n} tokens (`fixedhead.analysis`). Rank counts singular values above "
        f"{first['rtol']:g} of the largest (at float32 resolution every head fills its structural rank). "
        "\"logit rank\": of each head's n × n logits, a mean over heads of each head's mean over windows, "
        'and the largest head mean; "at ceiling": heads whose mean is within 0.5 of min(d_p, n); "pattern '
        'rank": the rank of the per-query centred log-attention'
        + (" (lower triangle)" if causal else "")
        + ", the head size its patterns need. The paper's argument: an arbitrary "
        + ("causal " if causal else "")
        + f"pattern over n = {n} tokens needs d_p ≥ {need}.",
        "",
        *render.table(header, rows),
        "",
    ]


def write_outputs(state: dict, out: Path) -> None:
    write_text_atomic(out / REPORT_FILE, report_markdown(state))
    plot(state, out / PLOT_FILE)
    if state.get("ranks"):
        plot_ranks(state, out / RANK_PLOT_FILE)


def plot_ranks(state: dict, path: Path) -> None:
    """Per family against N: the mean logit rank with each point's d_p (dashed), and the fraction
    of heads at their ceiling."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    by_family: dict[str, list] = {}
    for pt in state["meta"]["plan"]["points"]:
        if pt["key"] in state["ranks"]:
            by_family.setdefault(pt["family"], []).append((pt, state["ranks"][pt["key"]]))
    for name, pts in by_family.items():
        xs = [pt["non_embedding_parameters"] for pt, _ in pts]
        (line,) = axes[0].plot(xs, [r["logit_rank"] for _, r in pts], "o-", label=f"{name}: mean logit rank")
        axes[0].plot(xs, [pt["head_dim"] for pt, _ in pts], "--", color=line.get_color(), alpha=0.6)
        axes[1].plot(xs, [100 * r["at_ceiling"] for _, r in pts], "o-", color=line.get_color(), label=name)
    axes[0].set_ylabel("numerical logit rank (dashed: d_p)")
    axes[1].set_ylabel("heads at their rank ceiling (%)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("non-embedding parameters N")
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    fig.suptitle(state["meta"].get("description", "")[:120], fontsize=8)
    save_figure(fig, path)


def plot(state: dict, path: Path) -> None:
    """Held-out loss against non-embedding parameters and against training FLOPs (log-log), each
    family's seeds as points with its mean, fitted power law and the band of its per-seed fits."""
    import numpy as np

    plt = pyplot()
    families = summarize(state)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, axis, key, label in (
        (axes[0], "parameters", "non_embedding_parameters", "non-embedding parameters N"),
        (axes[1], "flops", "flops", "training FLOPs C"),
    ):
        for name, f in families.items():
            xs = [pt[key] for pt in f["points"]]
            (line,) = ax.plot(xs, [pt["loss"][0] for pt in f["points"]], "o", label=name)
            for pt in f["points"]:
                ax.plot([pt[key]] * len(pt["losses"]), pt["losses"], ".", color=line.get_color(), alpha=0.4)
            fit = f.get(f"fit_{axis}")
            if fit:
                grid = np.geomspace(min(xs), max(xs), 50)
                ax.plot(grid, fit["a"] * grid ** (-fit["b"]), "-", color=line.get_color())
                if len(fit["per_seed"]) >= 2:
                    curves = np.array([s["a"] * grid ** (-s["b"]) for s in fit["per_seed"]])
                    ax.fill_between(grid, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.15)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out loss (nats/token)")
        ax.legend()
    fig.suptitle(state["meta"].get("description", "")[:120], fontsize=8)
    save_figure(fig, path)
