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
(:mod:`fixedhead.studies.kit.learning_rate`), and the other seeds train at that rate. Every run is
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

import json
import math
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

from ...analysis import analyze_model, load_encoder
from ...checks import positive_float, positive_int
from ...data import prepare_data
from ...data.lm import unigram_perplexity
from ...model.architectures import build_config, check_objective_for
from ...model.sizes import non_embedding_parameters
from ...runs import load_json_file
from ...theory import causal_threshold
from ...training.pretrain import lm_config, train_or_reuse
from ..kit import core
from ..kit.learning_rate import RULE, choose_on_validation, parse_rates, with_validation_split
from ..kit.recipes import get_recipe
from .report import ALPHA, PLOT_FILE, RANK_PLOT_FILE, REPORT_FILE, write_outputs

RESULTS_FILE = "results.json"
OWNED = (REPORT_FILE, PLOT_FILE, RANK_PLOT_FILE, "runs")
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
    # than make run's 2e-3 at 700 steps, so the grid is centred higher. 60 runs, about 2.5 hours
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
    output_dir: str | Path | None = None,
    seeds: list[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    cache_dir=None,
    command: str | None = None,
    learning_rates: str | list[float] | None = None,
    corpus: str | None = None,
    architecture: str | None = None,
    families: list[str] | None = None,
) -> dict:
    """Train every point of the preset for every seed (finished runs are reused), choosing each
    point's learning rate on the validation split first (every run trains without that split);
    write ``results.json``, ``report.md`` and ``scaling.png``. ``corpus``: another corpus than the
    recipe's; ``architecture``: every model as this family (:mod:`fixedhead.model.architectures`,
    ``"llama"``: transformers' ``LlamaForCausalLM``, causal only); ``families``: train only these of
    the preset's families (the plan and report stay the whole preset's, so workers or sessions may
    split a study by family). Returns the results state.

    Raises:
        ValueError: bad seeds or rates, a family that is not the preset's.
        FileExistsError: the folder holds something else or runs of other settings (without ``overwrite``).
        FileNotFoundError: a missing corpus.
    """
    p = get_scaling_preset(preset) if isinstance(preset, str) else preset
    p = replace(p, seeds=core.seeds_override(seeds, p.seeds))
    if learning_rates is not None:
        p = replace(p, learning_rates=tuple(parse_rates(learning_rates)))
    if architecture is not None and architecture != "fixedhead":
        p = replace(p, model={**p.model, "architecture": architecture})
    if families is not None and (bad := core.first_unknown(families, p.families)) is not None:
        raise ValueError(f"family {bad!r} is not one of the scaling preset's: {', '.join(p.families)}")
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
    out = core.claim(core.output_folder(output_dir, "scaling", preset), RESULTS_FILE, OWNED, "scaling")
    previous, meta = core.resume(
        out / RESULTS_FILE,
        preset,
        describe(p),
        command,
        settings,
        "recipe, sizes, families or grid",
        None,
        overwrite,
        study="scaling",
    )
    # the plan is the whole study's: the seeds of every invocation, every family of the preset
    seeds = list(dict.fromkeys([*previous.get("meta", {}).get("plan", {}).get("seeds", []), *p.seeds]))
    if seeds[0] != p.seeds[0]:
        raise FileExistsError(
            f"{out / RESULTS_FILE} chose each point's rate with seed {seeds[0]}, this call with seed {p.seeds[0]}; "
            f"pass {seeds[0]} first in --seeds, or choose another --output-dir"
        )
    data = prepare_data(data_settings, cache_dir=cache_dir, progress=progress)
    out = core.claim(out, RESULTS_FILE, OWNED, "scaling", create=True, overwrite=overwrite)
    points = plan_points(p, train.objective, n, len(data.tokenizer), train.batch_size, recipe.layers)
    meta.update(
        plan={
            "points": [{k: v for k, v in pt.items() if k != "fields"} for pt in points],
            "seeds": seeds,
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
        with core.one_writer(out / RESULTS_FILE):
            other = load_json_file(out / RESULTS_FILE) if (out / RESULTS_FILE).is_file() else {}
            for part in ("runs", "tuning", "ranks"):
                state[part].update({k: v for k, v in other.get(part, {}).items() if k not in state[part]})
            core.save_state(out / RESULTS_FILE, state, state["runs"].values(), other.get("meta"))

    save()  # the plan before any training

    def train_point(pt, lr, seed):
        config = lm_config(build_config(pt["fields"]), data.tokenizer, train.objective)
        steps = pt["steps"]
        settings = replace(
            train, learning_rate=lr, seed=seed, max_steps=steps, eval_steps=max(1, steps // 4), save_steps=steps
        )
        run_dir = out / "runs" / core.run_key(pt["key"], lr, seed)
        if progress:
            print(f"{pt['key']} (N = {pt['non_embedding_parameters']:,}) lr {lr:g} seed {seed}: {run_dir}", flush=True)
        result = train_or_reuse(config, data, run_dir, settings, overwrite)
        row = {k: v for k, v in result.items() if k not in ("eval_curve", "train_curve", "reproducibility")}
        state["runs"][core.run_key(pt["key"], lr, seed)] = {
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
        if families is not None and pt["family"] not in families:
            continue
        lock = core.try_lock(out / "runs" / pt["key"])  # a point (its grid and seeds) is one worker's
        if lock is None:
            if progress:
                print(f"{pt['key']}: another worker is on this point; skipping it", flush=True)
            continue
        if p.learning_rates:
            at = partial(train_point, pt, seed=first)
            state["tuning"][pt["key"]] = choose_on_validation(at, p.learning_rates, p.max_extensions)
            best = state["tuning"][pt["key"]]["chosen"]
            save()
        else:
            best = train.learning_rate
            train_point(pt, best, first)
        for seed in rest:
            train_point(pt, best, seed)
        name = core.run_key(pt["key"], best, first)
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
        f"{recipe.describe().split(', ')[0]}, {recipe.layers} layer{'s' if recipe.layers != 1 else ''}, "
        f"n={recipe.data.max_seq_length}; families "
        f"{', '.join(p.families)}; sizes {sizes}; {p.tokens_per_parameter:g} tokens per non-embedding parameter "
        f"(at least {p.min_steps} steps{cap}); seeds {', '.join(map(str, p.seeds))}"
    )
