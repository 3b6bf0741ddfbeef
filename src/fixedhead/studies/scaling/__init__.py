"""`fixedhead scaling`: does head size matter as models grow? Loss against size and compute, per
head-size family.

The paper's Figure 1 claims "better performance scaling" for fixed heads; a claim about scaling is a
claim about curves, so each *family* trains at several sizes and gets one fitted curve (Kaplan et al.
2020, Section 3):

* ``standard``: d_p = d/h;
* ``threshold``: d_p at the paper's threshold, n for a masked LM (Theorem 2), ⌈(n − 1)/2⌉ for a causal one;
* ``d_p=K``: a constant head size K (64 by default, as Llama and GPT-2).

Each size trains on ``tokens_per_parameter`` tokens per non-embedding parameter (Chinchilla's ~20), within
``min_steps`` and ``max_tokens``, each point at its own rate. The report fits L = a·X^(−b) against
non-embedding parameters N and training FLOPs C = 6·N·T + 6·l·n·i·T (Kaplan et al. Section 2.1; T tokens,
l layers, context n, attention width i = h·d_p), with each family's compute multiplier against ``standard``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ...checks import check_fields
from ...data.lm import unigram_perplexity
from ...diagnostics.analysis import analyze_model, load_encoder
from ...model.architectures import build_config, check_architecture, check_objective_for
from ...model.sizes import non_embedding_parameters
from ...theory import causal_threshold
from ...training.pretrain import lm_config, train_or_reuse
from ..kit import core
from ..kit.learning_rate import RULE, later_seed_needs, parse_rates, point_rate, with_validation_split
from ..kit.recipes import RECIPES, get_recipe, objective_text, with_steps
from ..kit.study import Point, Study
from .report import ALPHA, PLOT_FILE, RANK_PLOT_FILE, report_markdown, summarise, write_plots

#: trained-rank diagnostics count directions carrying at least 1% of a head's largest singular value
#: (float32 resolution, 1e-5, fills every head's structural rank and says nothing), on this many
#: evenly spaced held-out windows
RANK_RTOL = 1e-2
RANK_WINDOWS = 16


def family_head_dim(family: str, objective: str, n: int) -> int | None:
    """The head size d_p of a family's model of size (d, h): None (standard), the threshold for the objective
    at length n, or the constant of ``"d_p=K"``; ValueError naming the known families."""
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


def plan_points(p: ScalingOptions, objective: str, n: int, vocab_size: int, batch_size: int, layers: int) -> list[dict]:
    """Every (family, size) point: its model fields, N, training steps and tokens, and FLOPs."""
    recipe = get_recipe(p.recipe)
    points = []
    for family in p.head_size_families:
        for d, h in p.sizes:
            head_dim = family_head_dim(family, objective, n)
            fields = recipe.model_fields(
                hidden_size=d, num_attention_heads=h, head_dim=head_dim, intermediate_size=4 * d, **model_fields(p)
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


#: the names of :data:`PRESETS`
PRESET_NAMES = ("cpu", "gpu", "tiny")


@dataclass(frozen=True)
class ScalingOptions:
    """What ``fixedhead scaling`` trains: a preset (:data:`PRESETS`: sizes, families, token rule, grid) and what a
    run changes of it; a field left None takes the preset's value."""

    preset: str = field(default="cpu", metadata={"choices": PRESET_NAMES})
    """the options to start from (cpu: 4 causal sizes on a CPU; gpu: one GPU's; tiny: a smoke test); the options
    given override it"""
    recipe: str | None = field(default=None, metadata={"choices": tuple(RECIPES)})
    """the data and training recipe of every run"""
    hidden_sizes: tuple[int, ...] = field(default=None, metadata={"check": "positive"})
    """d of each size (at least 2; the FFN is 4d)"""
    num_attention_heads: tuple[int, ...] = field(default=None, metadata={"check": "positive"})
    """h of each size, one per hidden size (standard d_p = d/h)"""
    head_size_families: tuple[str, ...] = field(default=None, metadata={"nonempty": True})
    """the head-size families: standard (d/h), threshold (the paper's for the objective), d_p=K"""
    tokens_per_parameter: float | None = field(default=None, metadata={"check": "positive_float"})
    """training tokens per non-embedding parameter of each run"""
    min_steps: int | None = field(default=None, metadata={"check": "positive"})
    """the fewest steps of a run"""
    max_tokens: int | None = field(default=None, metadata={"check": "positive"})
    """the most training tokens of a run"""
    seeds: tuple[int, ...] = field(default=None, metadata={"check": "non_negative", "distinct": True, "nonempty": True})
    """seeds, paired across points; the first chooses each point's rate"""
    learning_rates: tuple[float, ...] = field(default=None, metadata={"nonempty": True})
    """each point's grid, chosen on a validation split with the first seed"""
    max_extensions: int | None = field(default=None, metadata={"check": "non_negative"})
    """how often a point's grid grows past an edge"""
    corpus: str | None = None
    """another corpus than the recipe's (a .txt/.jsonl(.gz) file or a directory)"""
    architecture: str = field(default="fixedhead", metadata={"choices": ("fixedhead", "llama")})
    """every model as this family (llama: transformers' LlamaForCausalLM; causal recipes only)"""

    def __post_init__(self):
        check_fields(self)
        if self.preset not in PRESET_NAMES:
            raise ValueError(f"unknown scaling preset {self.preset!r}; known: {', '.join(PRESET_NAMES)}")
        if self.learning_rates:
            parse_rates(self.learning_rates)  # a grid of >= 2 positive rates, named when not
        for f in self.head_size_families or ():
            family_head_dim(f, "clm", 64)  # refuses an unknown family by name
        check_architecture(self.architecture)

    @property
    def sizes(self) -> tuple[tuple[int, int], ...]:
        """(d, h) of each size."""
        return tuple(zip(self.hidden_sizes, self.num_attention_heads, strict=True))


#: the named options ``--preset NAME`` starts from (the options given override them)
PRESETS = {
    # causal LMs at n = 64 with make run's recipe, standard d_p = 8; 4 sizes spanning ~9x in
    # non-embedding parameters; every run capped at 500k tokens (245 steps, fewer than 20 per
    # parameter at every size: L(N) at a fixed token budget). Short runs do best at higher rates
    # than make run's 2e-3 at 700 steps, so the grid is centred higher. 60 runs, about 2.5 hours
    # on a 2-core CPU (step time is dominated by the 8,192-way output layer at these widths)
    "cpu": ScalingOptions(
        recipe="cpu-clm",
        hidden_sizes=(32, 48, 64, 112),
        num_attention_heads=(4, 6, 8, 14),
        head_size_families=("standard", "threshold", "d_p=64"),
        tokens_per_parameter=20.0,
        max_tokens=500_000,
        min_steps=200,
        seeds=(0, 1),
        learning_rates=(1e-3, 2e-3, 4e-3, 8e-3),
        max_extensions=1,
    ),
    # one GPU: n = 128 (the causal threshold is 64, so the threshold family is also modern practice's
    # d_p = 64), 4 layers, d = 128...512 with standard d_p = 16 (~14x in N), 20 tokens per parameter
    # up to 4M tokens; bf16. benchmarks/gpu_scaling.sh runs it as several workers sharing the GPU
    "gpu": ScalingOptions(
        preset="gpu",
        recipe="gpu-clm",
        hidden_sizes=(128, 256, 384, 512),
        num_attention_heads=(8, 16, 24, 32),
        head_size_families=("standard", "threshold"),
        tokens_per_parameter=20.0,
        max_tokens=4_000_000,
        min_steps=200,
        seeds=(0, 1),
        learning_rates=(5e-4, 1e-3, 2e-3, 4e-3),
        max_extensions=1,
    ),
    "tiny": ScalingOptions(
        preset="tiny",
        recipe="tiny",
        hidden_sizes=(16, 32),
        num_attention_heads=(2, 4),
        head_size_families=("standard", "threshold"),
        tokens_per_parameter=1.0,
        min_steps=4,
        max_tokens=2_000,
        seeds=(0, 1),
        learning_rates=(2e-3, 4e-3),
        max_extensions=0,
    ),
}
#: the options a preset gives a value (None in a run's options: the preset's)
PRESET_FIELDS = (
    "recipe",
    "hidden_sizes",
    "num_attention_heads",
    "head_size_families",
    "tokens_per_parameter",
    "min_steps",
    "max_tokens",
    "seeds",
    "learning_rates",
    "max_extensions",
)


def spec(o: ScalingOptions) -> ScalingOptions:
    """``o`` with each field of :data:`PRESET_FIELDS` it leaves None at its preset's value; ValueError for fewer
    than 2 sizes, a missing head count, or a d that is not a multiple of its h."""
    filled = core.filled_by_preset(PRESETS, o, PRESET_FIELDS, "scaling")
    with core.naming_preset(o.preset, filled):
        p = replace(o, **filled)
        if len(p.hidden_sizes) != len(p.num_attention_heads):
            raise ValueError(
                f"hidden_sizes {list(p.hidden_sizes)} and num_attention_heads {list(p.num_attention_heads)}: give "
                "one head count per hidden size"
            )
        if len(p.sizes) < 2:
            raise ValueError(f"a scaling study needs at least 2 sizes, got {list(p.sizes)}")
        for d, h in p.sizes:
            if d % h:
                raise ValueError(f"hidden_size {d} is not a multiple of num_attention_heads {h} (standard d_p = d/h)")
    return p


def model_fields(p: ScalingOptions) -> dict:
    """Model fields every run shares beyond the recipe's (its architecture)."""
    return {} if p.architecture == "fixedhead" else {"architecture": p.architecture}


def points_of(p: ScalingOptions) -> list[dict]:
    """:func:`plan_points` at the recipe's sizes (the counts and FLOPs do not depend on the trained
    tokenizer's vocabulary: they leave the embeddings out)."""
    r = get_recipe(p.recipe)
    return plan_points(p, r.train.objective, r.data.max_seq_length, r.data.vocab_size, r.train.batch_size, r.layers)


#: held-out evaluations of a point's run, whose length its size sets (one checkpoint, at its end)
EVALUATIONS = 4

VERDICT_RULE = (
    f"Welch's t-test per size on the seeds' held-out losses, Holm-corrected over a family's sizes, p < {ALPHA}"
)


def _seconds(runs: dict) -> float:
    return round(sum(r.get("train_seconds", 0) for r in runs.values()), 1)


def data_settings(o: ScalingOptions):
    """The recipe's data (another corpus where the resolved options ``o`` name one), with the validation split
    every run trains without."""
    recipe = get_recipe(o.recipe)
    return with_validation_split(replace(recipe.data, corpus=o.corpus) if o.corpus else recipe.data)


def state_of(p: ScalingOptions, results, meta: dict | None = None) -> dict:
    """The study's state as its summary and report read it: ``meta``, ``unigram_perplexity``, ``tuning`` and
    ``ranks`` (per point, from its first seed) and every run at every rate."""
    recipe = get_recipe(p.recipe)
    results = list(results)
    firsts = [r for r in results if "ranks" in r]
    plan = {
        "points": [{k: v for k, v in pt.items() if k != "fields"} for pt in points_of(p)],
        "seeds": list(p.seeds),
        "learning_rates": list(p.learning_rates),
        "rate_rule": RULE,
        "verdict_rule": VERDICT_RULE,
    }
    return {
        "meta": {**(meta or {}), "plan": plan, "n": recipe.data.max_seq_length, "objective": recipe.train.objective},
        "unigram_perplexity": firsts[0]["unigram_perplexity"] if firsts else None,
        "tuning": {r["point"]: r["tuning"] for r in firsts if r.get("tuning")},
        "runs": {k: v for r in results for k, v in r["runs"].items()},
        "ranks": {r["point"]: r["ranks"] for r in firsts},
    }


def trained_ranks(run_dir: Path, windows, rtol: float = RANK_RTOL) -> dict:
    """Does the low-rank bottleneck bind in a trained run? Its heads' ranks on ``windows``
    [num_windows, n]: :meth:`fixedhead.diagnostics.analysis.AttentionAnalysis.summary`."""
    model, _ = load_encoder(run_dir)
    return analyze_model(model, windows, rtol=rtol).summary()


def describe(p: ScalingOptions) -> str:
    recipe = get_recipe(p.recipe)
    sizes = ", ".join(f"d={d}/h={h}" for d, h in p.sizes)
    cap = f", at most {p.max_tokens:,}" if p.max_tokens else ""
    return (
        f"{objective_text(recipe.train)}, {recipe.layers} layer{'s' if recipe.layers != 1 else ''}, "
        f"n={recipe.data.max_seq_length}; families {', '.join(p.head_size_families)}; sizes {sizes}; "
        f"{p.tokens_per_parameter:g} tokens per non-embedding parameter "
        f"(at least {p.min_steps} steps{cap}); seeds {', '.join(map(str, p.seeds))}"
    )


class ScalingStudy(Study):
    """The scaling study on the kit (:mod:`fixedhead.studies.kit.study`): one point per (family, size,
    seed), seed-major. A point's first seed chooses its rate on the grid (its grid runs in
    ``FOLDER/runs/POINT-lrRATE-s0``) and reads its heads' ranks; the other seeds train at that rate."""

    name = "scaling"
    help = (
        "does head size matter as models grow? each head-size family at several sizes, each point at its own "
        "learning rate, with seeds: loss against parameters and FLOPs, power-law fits, compute multipliers"
    )
    removed = {
        "--families": "workers that share one --output-dir split the study point by point "
        "(run the same command in each)"
    }
    default_dir = "runs/{name}-{preset}"
    Options = ScalingOptions
    quick = ScalingOptions(preset="tiny")
    files = (PLOT_FILE, RANK_PLOT_FILE, "runs")
    points_only = ("seeds", "corpus")
    summarise = staticmethod(summarise)
    report = staticmethod(report_markdown)
    write_files = staticmethod(write_plots)

    def state(self, o, results, record=None):
        return state_of(o, results, record and record["meta"])

    def describe(self, p):
        return describe(p)

    def resolve(self, o):
        return spec(o)

    def first_seed(self, p):
        return p.seeds[0] if p.learning_rates else None

    def plan(self, p):
        first = p.seeds[0]  # a later seed trains at the rate its first seed chose

        def needs(pt, s):
            return later_seed_needs(p.learning_rates, s, first, core.run_key(pt["key"], seed=first))

        return [
            Point(core.run_key(pt["key"], seed=s), (pt, s), needs(pt, s))
            for pt, s in core.seed_major(points_of(p), p.seeds)
        ]

    def plan_record(self, p):
        return {
            "pairing": "by seed: every point of one seed trains on the same batches in the same order",
            "rate_rule": RULE,
            "rates_chosen_with_seed": p.seeds[0],
            "verdict_rule": VERDICT_RULE,
        }

    def check(self, p):
        """Every model buildable and trainable (a Llama model is causal) before any slow work."""
        recipe = get_recipe(p.recipe)
        if p.architecture == "llama" and recipe.train.objective != "clm":
            causal = [name for name in RECIPES if get_recipe(name).train.objective == "clm"]
            raise ValueError(
                f"--architecture llama trains causal LMs only, and recipe {p.recipe!r} trains masked LMs: pass a "
                f"causal --recipe ({', '.join(causal)})"
            )
        size = dict(hidden_size=p.sizes[0][0], num_attention_heads=p.sizes[0][1])
        check_objective_for(build_config(recipe.model_fields(**size, **model_fields(p))), recipe.train.objective)

    def run(self, p, point, folder, done, progress):
        pt, seed = point.spec
        recipe = get_recipe(p.recipe)
        data = self.data(data_settings(p), progress)
        train = replace(recipe.train, progress=progress)
        runs: dict[str, dict] = {}

        def train_at(lr):
            config = lm_config(build_config(pt["fields"]), data.tokenizer, train.objective)
            steps = pt["steps"]
            settings = with_steps(replace(train, learning_rate=lr, seed=seed), steps, EVALUATIONS, checkpoints=1)
            key = core.run_key(pt["key"], lr, seed)
            if progress:
                print(f"{pt['key']} (N = {pt['non_embedding_parameters']:,}) lr {lr:g} seed {seed}", flush=True)
            result = train_or_reuse(config, data, folder / "runs" / key, settings, self.overwriting)
            row = {k: v for k, v in result.items() if k not in ("eval_curve", "train_curve", "reproducibility")}
            runs[key] = row | {
                "point": pt["key"],
                "family": pt["family"],
                "learning_rate": lr,
                "seed": seed,
                "non_embedding_parameters": pt["non_embedding_parameters"],
                "flops": pt["flops"],
            }
            return result

        out = {"point": pt["key"], "seed": seed}
        first = done.get(core.run_key(pt["key"], seed=p.seeds[0]))
        rate = point_rate(train_at, p.learning_rates, seed, p.seeds[0], train.learning_rate, first, p.max_extensions)
        if seed != p.seeds[0]:
            return out | rate | {"runs": runs, "train_seconds": _seconds(runs)}
        chosen = rate["learning_rate"]
        name = core.run_key(pt["key"], chosen, seed)
        windows = data.heldout[torch.linspace(0, len(data.heldout) - 1, min(RANK_WINDOWS, len(data.heldout))).long()]
        return out | {
            "learning_rate": chosen,
            "tuning": rate.get("tuning"),
            "runs": runs,
            "ranks": {"run": name, **trained_ranks(folder / "runs" / name, windows)},
            "unigram_perplexity": unigram_perplexity(data, train.eval_seed, train.objective),
            "data_info": {k: v for k, v in data.info.items() if k != "prepare_seconds"},
            "train_seconds": _seconds(runs),
        }
