"""`fixedhead compare`: standard vs fixed head size, trained and scored on the same real text.

The default preset ``cpu`` is CPU-sized (the README's ``make run``): three causal (left-to-right)
language models on the same tokenizer, data and step budget, at n = 64 tokens —

* ``standard``: hidden d=128 with h=16 heads, so d_p = d/h = 8, far below n (the paper's
  bottleneck regime, Section 3);
* ``fixed``: the same d and h with a fixed head size d_p = 32, the paper's fix (Section 4) at the
  threshold of a causal head, ⌈(n − 1)/2⌉ = 32 (:func:`fixedhead.theory.min_head_dim` with
  ``causal=True``: a causal head's logits are free above the diagonal, so generic causal
  attention needs about half the rank of bidirectional attention);
* ``standard-wide``: a standard model whose hidden size is chosen to match the fixed model's
  parameter count (the paper's Fig. 1/2 question: is the fixed model better than simply making
  the standard one bigger?).

``cpu-mlm`` is the same question for masked LMs (n = 32, fixed d_p = n, the masked-LM recipe of
``benchmarks/bench_tokens_to_quality.py``); ``cpu-llama`` the ``cpu`` question for Llama-style
decoders (transformers' ``LlamaForCausalLM``: pre-norm, rotary, SwiGLU), and ``architecture="llama"``
(``--architecture llama``) asks it of any preset's models; ``tiny`` a seconds-long smoke test. A causal LM is
used by default because on a CPU budget it is the objective that leaves the word-frequency plateau
(docs/performance.md, "Tokens to quality").
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
    check_architecture,
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
from ..kit.recipes import get_recipe
from ..kit.study import Point, Study


@dataclass
class ComparePreset:
    """Data and training settings shared by all models, and each model's config fields."""

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


def _preset(
    recipe: str,
    d: int,
    h: int,
    fixed_head_dim: int,
    why: str,
    mup: bool = False,
    architecture: str = "fixedhead",
    rates: dict | None = None,
) -> ComparePreset:
    """Three models of one recipe: standard d_p = d/h, fixed d_p, and a standard model widened to
    the fixed one's parameter count; with ``mup``, all three under the μP-style parametrization
    (:mod:`fixedhead.model.parametrization`) based at the standard model (d_p = d/h, h heads), where
    it is the standard parametrization; ``architecture``: see :mod:`fixedhead.model.architectures`.
    ``rates``: each model's own learning rate, chosen by ``--learning-rates`` on the validation
    split, which the models then train without too (so each trains exactly as when its rate was chosen)."""
    r = get_recipe(recipe)
    extra = dict(parametrization="mup", mup_base_head_dim=d // h, mup_base_num_attention_heads=h) if mup else {}
    if architecture != "fixedhead":
        extra["architecture"] = architecture
    recipe_text = r.describe(rate=False)  # spec names the rate (shared, each model's own, a grid)
    return ComparePreset(
        description=f"{recipe_text}: d={d}, {h} heads, standard d_p={d // h} vs fixed d_p={fixed_head_dim} ({why}) "
        f"vs a parameter-matched wider standard model"
        f"{f', all μP-style (base d_p={d // h}, {h} heads)' if mup else ''}{_as(architecture)}; "
        f"{Path(r.data.corpus).name}",
        data=with_validation_split(r.data) if rates else r.data,
        train=r.train,
        learning_rates=dict(rates or {}),
        models={
            name: r.model_fields(hidden_size=d, num_attention_heads=h, head_dim=head_dim, **extra)
            for name, head_dim in (("standard", None), ("fixed", fixed_head_dim), ("standard-wide", None))
        },
        widen="standard-wide",
        match_to="fixed",
    )


def _as(architecture: str) -> str:
    return "" if architecture == "fixedhead" else ", as Llama-style decoders (transformers' LlamaForCausalLM)"


def _cpu_clm(why: str = "the causal threshold ceil((n-1)/2)", **kw) -> ComparePreset:
    """The ``cpu-clm`` recipe's models at n = 64: d=128, h=16, fixed d_p at the causal threshold."""
    return _preset("cpu-clm", 128, 16, causal_threshold(64), why, **kw)


COMPARE_PRESETS = {
    # each model's rate: `fixedhead compare --learning-rates 5e-4,1e-3,2e-3,4e-3` (docs/results/make-run-lr)
    "cpu": lambda: _cpu_clm(rates={"standard": 2e-3, "fixed": 2e-3, "standard-wide": 2e-3}),
    "cpu-llama": lambda: _cpu_clm(architecture="llama"),
    # standard: μP based at it is the standard parametrization (make-run-lr's 2e-3); fixed: docs/results/mup
    "cpu-mup": lambda: _cpu_clm(
        "the causal threshold", mup=True, rates={"standard": 2e-3, "fixed": 2e-3, "standard-wide": 1e-3}
    ),
    "cpu-mlm": lambda: _preset("cpu-mlm", 128, 16, 32, "= n"),
    "tiny": lambda: _preset("tiny", 32, 8, 16, "a smoke test"),
}


OUTPUT_FILES = ("results.csv", "learning_curves.png", "learning_rates.png")


def get_compare_preset(name: str) -> ComparePreset:
    """Raises ValueError listing the known preset names."""
    return core.pick(COMPARE_PRESETS, name, "compare")


def widened_ffn(base: dict, d: int) -> int:
    """The feed-forward width of ``base`` widened to hidden size ``d``: the base's ratio f/d kept (4 when unset)."""
    ratio = (base.get("intermediate_size") or 4 * base["hidden_size"]) / base["hidden_size"]
    return round(ratio * d)


def match_hidden_size(base: dict, target_params: int, vocab_size: int, step: int | None = None) -> int:
    """Smallest standard hidden size (a multiple of the head count, FFN at the base's ratio f/d) whose parameter
    count reaches ``target_params`` (:func:`~fixedhead.model.sizes.parameter_count` of the
    fields' architecture: fixedhead's without pooler, as the MLM model has none). A Llama model's
    d/h stays even (a multiple of 2h): rotary positions rotate pairs of coordinates."""
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
    """What ``fixedhead compare`` trains: a preset (data, recipe, models) and what a run changes of it."""

    preset: str = field(default="cpu", metadata={"choices": tuple(COMPARE_PRESETS)})
    """the data, recipe and models (COMPARE_PRESETS: cpu is make run's)"""
    seed: int | None = field(default=None, metadata={"check": "non_negative"})
    """one seed for every model: its initialisation and data order (None: the recipe's)"""
    steps: int | None = field(default=None, metadata={"check": "positive"})
    """training steps of every model (None: the preset's)"""
    batch_size: int | None = field(default=None, metadata={"check": "positive"})
    """sequences per step of every model (None: the preset's)"""
    learning_rate: float | None = field(default=None, metadata={"check": "positive_float"})
    """one peak learning rate for every model (None: the preset's, each model's own where it names them)"""
    objective: str | None = field(default=None, metadata={"choices": ("mlm", "clm")})
    """train every model as a masked or causal LM (None: the preset's)"""
    architecture: str | None = field(default=None, metadata={"choices": ("fixedhead", "llama")})
    """train every model as this family (llama: transformers' LlamaForCausalLM, causal only; None: each model's)"""
    corpus: str | None = None
    """another corpus: a .txt/.jsonl(.gz) file, a directory, or a Hugging Face dataset name"""
    models: tuple[str, ...] = ()
    """train only these of the preset's models (empty: all; the widened one is still sized against its reference)"""
    learning_rates: tuple[float, ...] = ()
    """a grid each model chooses its own rate from on a validation split (empty: no choice)"""
    max_extensions: int = field(default=3, metadata={"check": "non_negative"})
    """how often the rate grid grows past an edge"""

    def __post_init__(self):
        check_fields(self)
        p = get_compare_preset(self.preset)  # refused by name
        unknown = sorted(set(self.models) - set(p.models))
        if unknown:
            raise ValueError(f"no model {', '.join(map(repr, unknown))} in this preset: it has {', '.join(p.models)}")
        if self.learning_rates:
            parse_rates(self.learning_rates)
            if self.learning_rate is not None:
                raise ValueError(
                    f"learning_rate = {self.learning_rate!r} and a learning-rate grid were both given: the grid "
                    "chooses each model's rate; pass one of them"
                )


@dataclass
class Spec:
    """A comparison resolved from its options: the data and training settings, each model's config
    fields (the widened one not yet sized: that needs the trained tokenizer), each model's rate (or the
    grid's), and the description."""

    preset: ComparePreset
    data: DataSettings
    train: TrainSettings
    configs: dict[str, dict]
    rates: dict[str, float]
    grid: list[float] | None
    description: str


def spec(o: CompareOptions, preset: ComparePreset | None = None) -> Spec:
    """The :class:`Spec` of ``o`` (of ``preset`` instead of ``o.preset`` where given: seq-len's)."""
    p = preset or get_compare_preset(o.preset)
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
    configs = {name: dict(fields) for name, fields in p.models.items()}
    if o.architecture is not None and any(
        f.get("architecture", "fixedhead") != o.architecture for f in configs.values()
    ):
        description += _as(check_architecture(o.architecture))
        for fields in configs.values():
            fields["architecture"] = o.architecture
    own = p.learning_rates if o.learning_rate is None else {}  # without a grid: a given rate, else each model's own
    rates = {name: own.get(name, train.learning_rate) for name in configs}
    return Spec(p, data_settings, train, configs, rates, grid, description)


def sized_fields(s: Spec, name: str, vocab: int) -> dict:
    """Model ``name``'s config fields, the widened model sized to its reference's parameter count at this
    vocabulary (:func:`match_hidden_size`)."""
    fields = dict(s.configs[name])
    p = s.preset
    if name == p.widen and p.match_to:
        target = parameter_count(build_config({**s.configs[p.match_to], "vocab_size": vocab}))
        d = match_hidden_size(fields, target, vocab)
        fields.update(hidden_size=d, intermediate_size=widened_ffn(fields, d))
    return fields


def train_model(
    s: Spec, name: str, data, out: Path, max_extensions: int = 3, overwrite: bool = False, progress: bool = True
) -> dict:
    """Train (or reuse) model ``name`` of the spec ``s`` in ``out/NAME``, or, with a rate grid, at every rate of it
    in ``out/lr-grid/NAME-lrRATE`` keeping the best on the validation split. Returns its result
    (:func:`fixedhead.training.pretrain`) with ``name``, ``fields`` (its config fields), ``run`` (its folder
    inside ``out``), ``learning_rate`` where models have their own, and ``tuning`` with a grid (the choice's record,
    :func:`~fixedhead.studies.kit.learning_rate.choose_on_validation`, with each rate's held-out loss)."""
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
        own = {"learning_rate": lr} if s.preset.learning_rates else {}
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


def state_of(o: CompareOptions, results, meta: dict | None = None) -> dict:
    """What the table, report and figures read: ``meta`` (description, data, training settings, the plan,
    the unigram reference, the rate grid's record; a results file written before the kit keeps its own)
    and ``results`` (one per model, in plan order)."""
    s = spec(o)
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
    lines = render.head(
        "Standard against fixed head size (`fixedhead compare`)", meta, [], "![learning curves](learning_curves.png)"
    )
    lines += ["", "## Held-out scores", "", *format_table(results, meta.get("unigram_perplexity")).splitlines(), ""]
    samples = [(r["name"], prompt, text) for r in results for prompt, text in r.get("samples", {}).items()]
    if samples:
        lines += ["## What the models say (sampled continuations)", ""]
        lines += render.table(["model", "prompt", "continuation"], [[n, f"{p} …", t] for n, p, t in samples]) + [""]
    if "learning_rate_selection" in meta:
        models = {r["name"]: r["tuning"] for r in results if "tuning" in r}
        lines += selection_markdown(meta["learning_rate_selection"], models, "model")
    return "\n".join(lines).rstrip() + "\n"


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
    files = (*OUTPUT_FILES, *COMPARE_PRESETS["cpu"]().models, "lr-grid")
    points_only = ("models", "corpus")
    summarise = staticmethod(summarise)
    report = staticmethod(report_markdown)
    write_files = staticmethod(write_files)

    def state(self, o, results, record=None):
        return state_of(o, results, record and record["meta"])

    def resolve(self, o):
        train = spec(o).train
        return replace(o, seed=train.seed, steps=train.max_steps, batch_size=train.batch_size)

    def describe(self, o):
        return spec(o).description

    def check(self, o):
        s = spec(o)
        for fields in s.configs.values():  # every model buildable and trainable before any slow work
            check_objective_for(build_config({**fields, "vocab_size": s.data.vocab_size}), s.train.objective)

    def plan(self, o):
        return [Point(name) for name in get_compare_preset(o.preset).models if not o.models or name in o.models]

    def plan_record(self, o):
        s = spec(o)
        widen, match = s.preset.widen, s.preset.match_to
        sized = {
            "hidden_size": f"the smallest whose parameters reach {match}'s, once the tokenizer is trained",
            "intermediate_size": "the same ratio to hidden_size as written here",
        }
        return {
            "models": {
                name: s.configs[name] | (sized if name == widen else {})
                for name in s.configs
                if not o.models or name in o.models
            },
            "rates": {"grid": s.grid, "max_extensions": o.max_extensions} if s.grid else s.rates,
            "pairing": "every model trains on the same batches in the same order (one seed) and is scored on "
            "the same held-out tokens",
        }

    def run(self, o, point, folder, done, progress):
        s = spec(o)
        data = self.data(s.data, progress)
        result = train_model(s, point.key, data, folder, o.max_extensions, self.overwriting, progress)
        if s.train.objective == "clm":  # what a causal model says: the sensible-output check of the README
            result["samples"] = continuations(folder / result["run"], seed=s.train.seed)
        return result | {
            "unigram_perplexity": unigram_perplexity(data, s.train.eval_seed, s.train.objective),
            "data_info": data.info,
        }


#: prompts continued by every causal model of a comparison (public-domain style, not from the books)
SAMPLE_PROMPTS = ("it was a dark and stormy night, and", "the king said to his son that")


def continuations(run_dir, prompts=SAMPLE_PROMPTS, max_new_tokens: int = 24, seed: int = 0) -> dict[str, str]:
    """Sampled continuations of ``prompts`` by a causal run, through transformers'
    ``pipeline("text-generation")`` (top-k 40, temperature 0.8, seeded; only the new text):
    ``{prompt: continuation}``. A continuation stops where the model's learned positions end
    (``max_position_embeddings``).

    Raises:
        ValueError: a prompt that already fills the learned positions.
    """
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
