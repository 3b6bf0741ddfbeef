"""`fixedhead compare`: standard vs fixed head size, trained and scored on the same real text.

The default preset ``cpu`` (``make run``): three causal LMs on the same tokenizer, data and step budget,
at n = 64 tokens —

* ``standard``: d=128, h=16, so d_p = d/h = 8, far below n (the bottleneck regime, Section 3);
* ``fixed``: the same d and h with d_p = 32 (Section 4), the threshold of a causal head ⌈(n − 1)/2⌉
  (:func:`fixedhead.theory.min_head_dim` with ``causal=True``);
* ``standard-wide``: a standard model widened to the fixed model's parameter count (the paper's
  Fig. 1/2 question: is the fixed model better than a bigger standard one?).

``cpu-mlm`` asks it of masked LMs (n = 32, d_p = n), ``cpu-llama`` (or ``--architecture llama``) of
Llama-style decoders; ``tiny`` is a smoke test.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ...checks import check_fields
from ...data import DataSettings
from ...data.lm import unigram_perplexity
from ...model.architectures import (
    build_config,
    check_objective_for,
    head_size_label,
    is_fixed_head,
)
from ...model.sizes import parameter_count
from ...runs import staged_outputs
from ...theory import causal_threshold
from ...training.pretrain import train_or_reuse
from ...training.settings import TrainSettings
from ..kit import core, render
from ..kit.learning_rate import (
    RULE,
    choose_on_validation,
    parse_rates,
    plot_learning_rates,
    selection_markdown,
    selection_record,
    with_validation_split,
)
from ..kit.recipes import RECIPES, get_recipe
from ..kit.study import Point, Study


@dataclass
class Comparison:
    """What a comparison trains before a run's own overrides (seed, steps, a rate grid): data and training
    settings shared by all models, each model's config fields, each model's own rate."""

    description: str
    data: DataSettings
    train: TrainSettings
    models: dict[str, dict] = field(default_factory=dict)
    #: name of a standard model to widen until it matches ``match_to``'s parameter count
    widen: str | None = None
    match_to: str | None = None
    #: each model's own learning rate (chosen on a validation split by ``--learning-rates``); a
    #: model not named trains at the recipe's
    learning_rates: dict[str, float] = field(default_factory=dict)


#: the three models of a comparison: standard d_p = d/h, fixed d_p, and the standard one widened to the
#: fixed one's parameter count
MODELS = ("standard", "fixed", "standard-wide")
#: the names of :data:`PRESETS`
PRESET_NAMES = ("cpu", "cpu-llama", "cpu-mup", "cpu-mlm", "tiny")
#: the options a preset gives a value (None in a run's options: the preset's)
PRESET_FIELDS = (
    "recipe",
    "hidden_size",
    "num_attention_heads",
    "head_dim",
    "parametrization",
    "architecture",
    "model_learning_rates",
)


def _as(architecture: str) -> str:
    return "" if architecture == "fixedhead" else ", as Llama-style decoders (transformers' LlamaForCausalLM)"


def _why(head_dim: int, n: int, objective: str) -> str:
    """Where the fixed head size sits against the paper's threshold for ``n`` tokens, from the numbers."""
    if objective == "clm" and head_dim == causal_threshold(n):
        return " (the causal threshold ceil((n-1)/2))"
    return " (= n)" if head_dim == n else ""


def comparison(o: CompareOptions) -> Comparison:
    """The :class:`Comparison` of the resolved options ``o``: standard, fixed and widened models of one
    recipe; with ``parametrization="mup"``, μP based at the standard model. With each model's own rate the
    models train without the validation split too, so each trains exactly as when its rate was chosen."""
    r = get_recipe(o.recipe)
    d, h, mup = o.hidden_size, o.num_attention_heads, o.parametrization == "mup"
    extra = dict(parametrization="mup", mup_base_head_dim=d // h, mup_base_num_attention_heads=h) if mup else {}
    if o.architecture not in (None, "fixedhead"):
        extra["architecture"] = o.architecture
    rates = dict(zip(MODELS, o.model_learning_rates, strict=False))
    n = r.data.max_seq_length
    return Comparison(
        description=f"{r.describe(rate=False)}: d={d}, {h} heads, standard d_p={d // h} vs fixed d_p={o.head_dim}"
        f"{_why(o.head_dim, n, r.train.objective)} vs a parameter-matched wider standard model"
        f"{f', all μP-style (base d_p={d // h}, {h} heads)' if mup else ''}{_as(o.architecture or 'fixedhead')}; "
        f"{Path(r.data.corpus).name}",
        data=with_validation_split(r.data) if rates else r.data,
        train=r.train,
        learning_rates=rates,
        models={
            name: r.model_fields(hidden_size=d, num_attention_heads=h, head_dim=head_dim, **extra)
            for name, head_dim in zip(MODELS, (None, o.head_dim, None), strict=True)
        },
        widen="standard-wide",
        match_to="fixed",
    )


OUTPUT_FILES = ("results.csv", "learning_curves.png", "learning_rates.png")


def widened_ffn(base: dict, d: int) -> int:
    """The feed-forward width of ``base`` widened to hidden size ``d``: the base's ratio f/d kept (4 when unset)."""
    ratio = (base.get("intermediate_size") or 4 * base["hidden_size"]) / base["hidden_size"]
    return round(ratio * d)


def match_hidden_size(base: dict, target_params: int, vocab_size: int, step: int | None = None) -> int:
    """Smallest standard hidden size (a multiple of the head count, FFN at the base's ratio f/d) whose parameter
    count reaches ``target_params``. A Llama model's d/h stays even: rotary positions rotate pairs."""
    heads = base["num_attention_heads"]
    step = step or heads * (2 if base.get("architecture") == "llama" else 1)
    d = base["hidden_size"]
    while True:
        cfg = build_config(
            {**base, "hidden_size": d, "intermediate_size": widened_ffn(base, d), "vocab_size": vocab_size}
        )
        if parameter_count(cfg) >= target_params or d > 64 * base["hidden_size"]:
            return d
        d += step


@dataclass(frozen=True)
class CompareOptions:
    """What ``fixedhead compare`` trains: a preset (:data:`PRESETS`: recipe, sizes, rates) and what a run changes
    of it; a field left None takes the preset's value."""

    preset: str = field(default="cpu", metadata={"choices": PRESET_NAMES})
    """the options to start from (cpu: make run's; cpu-mlm: masked LMs at fixed d_p = n; cpu-llama: Llama
    decoders; cpu-mup: μP-style; tiny: a smoke test); the options given override it"""
    recipe: str | None = field(default=None, metadata={"choices": tuple(RECIPES)})
    """the data and training recipe of every model"""
    hidden_size: int | None = field(default=None, metadata={"check": "positive"})
    """d of the standard and fixed models"""
    num_attention_heads: int | None = field(default=None, metadata={"check": "positive"})
    """h of every model"""
    head_dim: int | None = field(default=None, metadata={"check": "positive"})
    """the fixed model's head size d_p"""
    parametrization: str | None = field(default=None, metadata={"choices": ("standard", "mup")})
    """mup: every model μP-style, based at the standard model (d_p = d/h, h heads)"""
    model_learning_rates: tuple[float, ...] = field(default=None, metadata={"check": "positive_float"})
    """each model's own rate (standard, fixed, standard-wide), chosen beforehand on the validation split, which
    the models then train without (None: the preset's, kept only for the models it chose them for; given
    empty: none, every model at the recipe's rate)"""
    seed: int | None = field(default=None, metadata={"check": "non_negative"})
    """one seed for every model: its initialisation and data order (None: the recipe's)"""
    steps: int | None = field(default=None, metadata={"check": "positive"})
    """training steps of every model (None: the recipe's)"""
    batch_size: int | None = field(default=None, metadata={"check": "positive"})
    """sequences per step of every model (None: the recipe's)"""
    learning_rate: float | None = field(default=None, metadata={"check": "positive_float"})
    """one peak learning rate for every model (None: each model's own, else the recipe's)"""
    objective: str | None = field(default=None, metadata={"choices": ("mlm", "clm")})
    """train every model as a masked or causal LM (None: the recipe's)"""
    architecture: str | None = field(default=None, metadata={"choices": ("fixedhead", "llama")})
    """train every model as this family (llama: transformers' LlamaForCausalLM, causal only)"""
    corpus: str | None = None
    """another corpus: a .txt/.jsonl(.gz) file, a directory, or a Hugging Face dataset name"""
    models: tuple[str, ...] = ()
    """train only these models (standard, fixed, standard-wide; empty: all; standard-wide is still sized
    against fixed)"""
    learning_rates: tuple[float, ...] = ()
    """a grid each model chooses its own rate from on a validation split (empty: no choice)"""
    max_extensions: int = field(default=3, metadata={"check": "non_negative"})
    """how often the rate grid grows past an edge"""

    def __post_init__(self):
        check_fields(self)
        if unknown := sorted(set(self.models) - set(MODELS)):
            raise ValueError(f"no model {', '.join(map(repr, unknown))} in a comparison: it has {', '.join(MODELS)}")
        if self.model_learning_rates is not None and len(self.model_learning_rates) not in (0, len(MODELS)):
            raise ValueError(
                f"model_learning_rates = {list(self.model_learning_rates)}: give one rate per model "
                f"({', '.join(MODELS)})"
            )
        if self.learning_rates:
            parse_rates(self.learning_rates)
            if self.learning_rate is not None:
                raise ValueError(
                    f"learning_rate = {self.learning_rate!r} and a learning-rate grid were both given: the grid "
                    "chooses each model's rate; pass one of them"
                )


_CPU = CompareOptions(
    recipe="cpu-clm", hidden_size=128, num_attention_heads=16, head_dim=causal_threshold(64), model_learning_rates=()
)
#: the named options ``--preset NAME`` starts from (the options given override them); the rates of cpu and
#: cpu-mup: `fixedhead compare --learning-rates 5e-4,1e-3,2e-3,4e-3` (docs/results/make-run-lr, docs/results/mup)
PRESETS = {
    "cpu": replace(_CPU, model_learning_rates=(2e-3, 2e-3, 2e-3)),
    "cpu-llama": replace(_CPU, preset="cpu-llama", architecture="llama"),
    "cpu-mup": replace(_CPU, preset="cpu-mup", parametrization="mup", model_learning_rates=(2e-3, 2e-3, 1e-3)),
    "cpu-mlm": replace(_CPU, preset="cpu-mlm", recipe="cpu-mlm", head_dim=32),
    "tiny": CompareOptions(
        preset="tiny", recipe="tiny", hidden_size=32, num_attention_heads=8, head_dim=16, model_learning_rates=()
    ),
}
#: the options that make the models a preset chose its own rates for (another value of one: other models)
RATED_FOR = ("recipe", "hidden_size", "num_attention_heads", "head_dim", "parametrization", "architecture", "objective")


def rated_for_others(o: CompareOptions) -> list[str]:
    """``FIELD=VALUE`` of each option of :data:`RATED_FOR` ``o`` gives another value than its preset, whose own
    rates were chosen for the preset's models (the objective: another than the recipe's)."""
    preset = core.lookup(PRESETS, o.preset, "compare")
    objective = get_recipe(o.recipe or preset.recipe).train.objective
    return [
        f"{k}={getattr(o, k)!r}"
        for k in RATED_FOR
        if getattr(o, k) not in (None, objective if k == "objective" else getattr(preset, k))
    ]


def resolve(o: CompareOptions) -> CompareOptions:
    """``o`` with each field of :data:`PRESET_FIELDS` it leaves None at its preset's value; the preset's own
    rates only for its own models (else, with no rate given, every model trains at the recipe's rate).
    ValueError for an unknown preset or a bad value a preset gave (naming the preset)."""
    if o.model_learning_rates is None and not (o.learning_rate or o.learning_rates) and rated_for_others(o):
        o = replace(o, model_learning_rates=())  # the preset's rates were chosen for other models
    filled = core.filled_by_preset(PRESETS, o, PRESET_FIELDS, "compare")
    with core.naming_preset(o.preset, filled):
        return replace(o, **filled)


@dataclass
class Spec:
    """A comparison resolved from its options: settings, each model's config fields (the widened one sized
    later, from the trained tokenizer), each model's rate and the description."""

    comparison: Comparison
    data: DataSettings
    train: TrainSettings
    configs: dict[str, dict]
    rates: dict[str, float]
    grid: list[float] | None
    description: str
    options: CompareOptions


def spec(o: CompareOptions, base: Comparison | None = None) -> Spec:
    """The :class:`Spec` of ``o`` (its preset's fields filled in: :func:`resolve`), or of ``base`` with ``o``'s
    overrides (seq-len's and qk-v's)."""
    if base is None:
        o = resolve(o)
    p = base or comparison(o)
    data_settings = replace(p.data, corpus=o.corpus) if o.corpus else p.data
    grid = parse_rates(o.learning_rates) if o.learning_rates else None
    if grid:
        data_settings = with_validation_split(data_settings)  # rates are chosen on text no model trains on
    overrides = dict(max_steps=o.steps, batch_size=o.batch_size, seed=o.seed, learning_rate=o.learning_rate)
    train = replace(p.train, **{k: v for k, v in overrides.items() if v is not None})
    description = p.description
    if (train.max_steps, train.batch_size) != (p.train.max_steps, p.train.batch_size):  # the text names the preset's
        description += f" (here {train.max_steps} steps of batch {train.batch_size}, overriding the preset's)"
    if o.objective is not None and o.objective != train.objective:  # the masking rate is the masked objective's
        description += f" (trained as {o.objective} instead of the preset's {train.objective}: same sizes and recipe)"
        train = replace(train, objective=o.objective, mlm_probability=0.15)
    if grid:
        description += (
            f"; each model at the best rate of the grid {', '.join(f'{x:g}' for x in grid)} on a validation split"
        )
    elif o.learning_rate is None and p.learning_rates:
        own = ", ".join(f"{name} {lr:g}" for name, lr in p.learning_rates.items())
        description += f"; each model at its own learning rate ({own}), chosen on a validation split"
    else:
        description += f"; learning rate {train.learning_rate:g}"
        others = rated_for_others(o) if base is None and PRESETS[o.preset].model_learning_rates else []
        if others and o.learning_rate is None:
            description += f" (not preset {o.preset}'s own rates, chosen for its models: here {', '.join(others)})"
    configs = {name: dict(fields) for name, fields in p.models.items()}
    own = p.learning_rates if o.learning_rate is None else {}  # without a grid: a given rate, else each model's own
    rates = {name: own.get(name, train.learning_rate) for name in configs}
    return Spec(p, data_settings, train, configs, rates, grid, description, o)


def sized_fields(s: Spec, name: str, vocab: int) -> dict:
    """Model ``name``'s config fields, the widened model sized to its reference's parameter count at this
    vocabulary (:func:`match_hidden_size`)."""
    fields = dict(s.configs[name])
    p = s.comparison
    if name == p.widen and p.match_to:
        target = parameter_count(build_config({**s.configs[p.match_to], "vocab_size": vocab}))
        d = match_hidden_size(fields, target, vocab)
        fields.update(hidden_size=d, intermediate_size=widened_ffn(fields, d))
    return fields


def train_model(
    s: Spec, name: str, data, out: Path, max_extensions: int = 3, overwrite: bool = False, progress: bool = True
) -> dict:
    """Train (or reuse) model ``name`` in ``out/NAME``, or with a rate grid at every rate in
    ``out/lr-grid/NAME-lrRATE``, keeping the best on the validation split. Returns its pretraining result
    with ``name``, ``fields``, ``run`` (its folder inside ``out``), ``learning_rate`` and, with a grid,
    ``tuning``."""
    fields = sized_fields(s, name, len(data.tokenizer))
    config = build_config({**fields, "vocab_size": len(data.tokenizer), "pad_token_id": data.tokenizer.pad_token_id})
    train = replace(s.train, progress=progress)
    if progress:
        print(
            f"\n{name} ({config.model_type}): d={config.hidden_size}, h={config.num_attention_heads}, "
            f"d_p={head_size_label(config)} ({'fixed' if is_fixed_head(config) else 'standard'}), "
            f"{parameter_count(config):,} parameters, {train.max_steps} steps",
            flush=True,
        )
    if s.grid is None:
        lr = s.rates[name]
        result = train_or_reuse(config, data, out / name, replace(train, learning_rate=lr), overwrite)
        own = {"learning_rate": lr} if s.comparison.learning_rates else {}
        return {**result, "name": name, "fields": fields, "run": name, **own}
    runs = {}

    def train_at(lr):
        run_dir = out / "lr-grid" / core.run_key(name, lr)
        if progress:
            print(f"{name} at lr {lr:g} ({run_dir})", flush=True)
        runs[lr] = train_or_reuse(config, data, run_dir, replace(train, learning_rate=lr), overwrite)
        return runs[lr]

    choice = choose_on_validation(train_at, s.grid, max_extensions)
    best = choice["chosen"]
    if progress:
        edge = "" if choice["bracketed"] else " (at an edge of the grid)"
        print(f"{name}: lr {best:g} chosen on the validation split{edge}")
    tuning = {**choice, "heldout_loss": {f"{lr:g}": runs[lr]["heldout_loss"] for lr in sorted(runs)}}
    run = f"lr-grid/{core.run_key(name, best)}"
    return {**runs[best], "name": name, "fields": fields, "run": run, "learning_rate": best, "tuning": tuning}


def state_of(s: Spec, results, meta: dict | None = None) -> dict:
    """What the table, report and figures read: ``meta`` and ``results`` (one per model, in plan order)."""
    o = s.options
    # a result recorded before the choice had one record shape keeps it under "selection"
    results = [{"tuning": r["selection"], **r} if "selection" in r else r for r in results]
    first = results[0] if results else {}
    computed = {
        "description": s.description,
        "objective": s.train.objective,
        "unigram_perplexity": first.get("unigram_perplexity"),
        "data": s.data.record(),
        "data_info": first.get("data_info", {}),
        "train": asdict(s.train),
        "plan": {
            "models": {r["name"]: r["fields"] for r in results},
            "seed": s.train.seed,
            **(
                {"grid": s.grid, "max_extensions": o.max_extensions, "rule": RULE}
                if s.grid
                else {"learning_rates": s.rates}
            ),
        },
    }
    if s.grid:
        selection = {r["name"]: r["tuning"] for r in results if "tuning" in r}
        computed["learning_rate_selection"] = selection_record(
            s.grid, o.max_extensions, s.train.seed, s.data.validation_fraction, models=selection
        )
    return {"meta": computed | (meta or {}), "results": results}


def report_markdown(state: dict) -> str:
    """The comparison's report: the description, what was run, the table, the samples and the rates."""
    meta, results = state["meta"], state["results"]
    samples = [[r["name"], f"{prompt} …", text] for r in results for prompt, text in r.get("samples", {}).items()]
    selection = meta.get("learning_rate_selection")
    return (
        render.markdown(
            render.Report(
                "Standard against fixed head size (`fixedhead compare`)",
                [f"{meta['description']}.", render.Figure("learning_curves.png", "learning curves")],
                [
                    render.what_was_run(meta),
                    render.Section("Held-out scores", [format_table(results, meta.get("unigram_perplexity"))]),
                    samples
                    and render.Section(
                        "What the models say (sampled continuations)",
                        [render.Table(["model", "prompt", "continuation"], samples)],
                    ),
                    selection
                    and selection_markdown(selection, {r["name"]: r["tuning"] for r in results if "tuning" in r}),
                ],
            )
        ).rstrip()
        + "\n"
    )


def summarise(state: dict) -> list[dict]:
    """One row per model: its name, sizes, rate and held-out scores (the table's columns)."""
    return [
        {k: r.get(k) for k, _, _ in _columns(state["results"])} | {"heldout_loss": r["heldout_loss"]}
        for r in state["results"]
    ]


def write_files(state: dict, out: Path) -> None:
    """``results.csv``, ``learning_curves.png`` and, where models chose their rates, ``learning_rates.png``."""
    write_results(state["results"], out, state["meta"])


class CompareStudy(Study):
    """The comparison on the kit (:mod:`fixedhead.studies.kit.study`): one point per model of the preset,
    each trained (or, with a rate grid, trained at every rate and the best kept) in ``FOLDER/MODEL``."""

    name = "compare"
    help = "train standard vs fixed-head models on the same text and compare (make run)"
    Options = CompareOptions
    quick = CompareOptions(preset="tiny")
    files = (*OUTPUT_FILES, *MODELS, "lr-grid")
    points_only = ("models", "corpus")
    summarise = staticmethod(summarise)
    report = staticmethod(report_markdown)
    write_files = staticmethod(write_files)

    def state(self, s, results, record=None):
        return state_of(s, results, record and record["meta"])

    def resolve(self, o):
        s = spec(o)  # the recipe's seed, steps and batch written out: giving them is the same comparison
        written = dict(seed=s.train.seed, steps=s.train.max_steps, batch_size=s.train.batch_size)
        return replace(s, options=replace(s.options, **written))

    def describe(self, s):
        return s.description

    def check(self, s):
        preset = PRESETS[s.options.preset]  # a value the preset gave is named as the preset's
        given = {k: getattr(preset, k) for k in PRESET_FIELDS if getattr(s.options, k) == getattr(preset, k)}
        with core.naming_preset(s.options.preset, given):
            for fields in s.configs.values():  # every model buildable and trainable before any slow work
                check_objective_for(build_config({**fields, "vocab_size": s.data.vocab_size}), s.train.objective)

    def plan(self, s):
        return [Point(name) for name in MODELS if not s.options.models or name in s.options.models]

    def plan_record(self, s):
        widen, match = s.comparison.widen, s.comparison.match_to
        sized = {
            "hidden_size": f"the smallest whose parameters reach {match}'s, once the tokenizer is trained",
            "intermediate_size": "the same ratio to hidden_size as written here",
        }
        return {
            "models": {
                name: s.configs[name] | (sized if name == widen else {})
                for name in s.configs
                if not s.options.models or name in s.options.models
            },
            "rates": {"grid": s.grid, "max_extensions": s.options.max_extensions} if s.grid else s.rates,
            "pairing": "every model trains on the same batches in the same order (one seed) and is scored on "
            "the same held-out tokens",
        }

    def run(self, s, point, folder, done, progress):
        data = self.data(s.data, progress)
        result = train_model(s, point.key, data, folder, s.options.max_extensions, self.overwriting, progress)
        if s.train.objective == "clm":  # what a causal model says: the sensible-output check of the README
            result["samples"] = continuations(folder / result["run"], seed=s.train.seed)
        return result | {
            "unigram_perplexity": unigram_perplexity(data, s.train.eval_seed, s.train.objective),
            "data_info": data.info,
        }


#: prompts continued by every causal model of a comparison (public-domain style, not from the books)
SAMPLE_PROMPTS = ("it was a dark and stormy night, and", "the king said to his son that")


def continuations(run_dir, prompts=SAMPLE_PROMPTS, max_new_tokens: int = 24, seed: int = 0) -> dict[str, str]:
    """``{prompt: continuation}`` sampled by a causal run (top-k 40, temperature 0.8, seeded), stopping where
    its learned positions end; ValueError for a prompt that already fills them."""
    from transformers import pipeline, set_seed

    generate = pipeline("text-generation", model=str(run_dir), device="cpu")
    room = generate.model.config.max_position_embeddings
    samples = {}
    for prompt in prompts:
        set_seed(seed)
        length = len(generate.tokenizer(prompt)["input_ids"])
        if length >= room:
            raise ValueError(f"prompt {prompt[:40]!r} is {length} tokens, no room left in n = {room} positions")
        # max_length (the generation config's own field) rather than max_new_tokens: no warning about both
        out = generate(
            prompt,
            max_length=min(room, length + max_new_tokens),
            do_sample=True,
            top_k=40,
            temperature=0.8,
            return_full_text=False,
        )
        samples[prompt] = " ".join(out[0]["generated_text"].split())
    return samples


TABLE_COLUMNS = [
    ("name", "model", "{}"),
    ("hidden_size", "d", "{}"),
    ("num_attention_heads", "h", "{}"),
    ("head_dim", "d_p", "{}"),
    ("parameters", "params", "{:,}"),
    ("training_tokens", "train tokens", "{:,}"),
    ("heldout_perplexity", "held-out ppl", "{:.2f}"),
    # bits per character: tokenizer-independent (None or absent in results from before it was measured)
    ("heldout_bits_per_character", "bits/char", "{:.3f}"),
    ("heldout_accuracy", "top-1 acc", "{:.4f}"),
    ("train_seconds", "wall s", "{:.0f}"),
]


#: columns an older results file may lack: shown as a dash in the table, left empty in results.csv
OPTIONAL_COLUMNS = ("heldout_bits_per_character",)


def _columns(results: list[dict]) -> list[tuple[str, str, str]]:
    """The table's columns; a learning-rate column where models trained at their own rates."""
    columns = list(TABLE_COLUMNS)
    if any("learning_rate" in r for r in results):
        columns.insert(columns.index(("training_tokens", "train tokens", "{:,}")), ("learning_rate", "lr", "{:g}"))
    return columns


def _cell(r: dict, key: str, fmt: str) -> str:
    value = r.get(key) if key in OPTIONAL_COLUMNS else r[key]
    return "-" if value is None else fmt.format(value)


def format_table(results: list[dict], unigram_perplexity: float | None = None) -> str:
    """The comparison's table (markdown, one row per model); with the unigram reference, a column of how
    far below it each model's held-out loss is (nats) and a closing line naming it."""
    columns = _columns(results)
    results = [dict(r) for r in results]
    if unigram_perplexity:
        columns.insert(-1, ("below_unigram", "below unigram", "{:.2f}"))
        for r in results:
            r["below_unigram"] = math.log(unigram_perplexity) - r["heldout_loss"]
    rows = [[_cell(r, key, fmt) for key, _, fmt in columns] for r in results]
    lines = render.table([h for _, h, _ in columns], rows)
    if unigram_perplexity:
        objective = results[0].get("objective", "mlm") if results else "mlm"
        scored = "masked tokens" if objective == "mlm" else "next tokens"
        lines += [
            "",
            f"Unigram reference (training-set word frequencies, no context) on the same held-out {scored}: "
            f"ppl {unigram_perplexity:.1f}; *below unigram* is its log minus the model's loss, in nats.",
        ]
    return "\n".join(lines)


def write_results(results: list[dict], out: Path, meta: dict) -> None:
    """results.csv (the table), learning_curves.png and, where models chose their rates,
    learning_rates.png, written together or not at all (see :func:`fixedhead.runs.staged_outputs`)."""
    with staged_outputs(out) as stage:
        keys = [k for k, _, _ in _columns(results)] + ["heldout_loss", "fixed_head", "num_hidden_layers"]
        render.write_csv(stage("results.csv"), keys, results)
        render.plot_learning_curves(results, stage("learning_curves.png"), meta.get("description", ""))
        if "learning_rate_selection" in meta:
            plot_learning_rates(meta["learning_rate_selection"], stage("learning_rates.png"))
