"""`fixedhead sweep`: the paper's head, embedding-size and head-size sweeps at CPU scale.

Three experiments, each a list of points (model configurations) trained with several seeds on one
tokenizer and data set, scored by held-out perplexity and, for the masked presets, fine-tuned on SST-2:

* ``heads`` (paper Fig. 3a): at a fixed d, standard heads (d_p = d/h) against a fixed d_p, for growing h;
* ``embedding`` (Fig. 1 and 2): standard models of growing d against fixed-head models at the smallest d
  with more heads, at equal parameter count;
* ``head_size`` (Table 2B): a fixed number of heads with a growing d_p.

A fixed head size equal to d/h *is* the standard layer, so such points are trained once and shared. Each
run is ``OUT/runs/KEY-sSEED`` (``KEY-lrRATE-sSEED`` where each model chooses its rate).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ...checks import check_fields
from ...data.glue import MAIN_METRIC, get_glue_task, majority_class_accuracy
from ...data.lm import DataSettings, unigram_perplexity
from ...model.architectures import build_config, check_architecture, check_objective_for, head_size_label
from ...model.sizes import parameter_count
from ...runs import claim_output_dir, load_json_file, write_text_atomic
from ...training.finetune import FINETUNE_FILE, FinetuneSettings, finetune, finetune_settings_record
from ...training.pretrain import train_or_reuse
from ...training.settings import TrainSettings
from ..kit import core
from ..kit.learning_rate import (
    later_seed_needs,
    parse_rates,
    point_rate,
    selection_record,
    with_validation_split,
)
from ..kit.recipes import training_text, with_steps
from ..kit.stats import CLAIMS_RULE, rule_text
from ..kit.study import RESULTS_FILE, Point, Study, options_from_dict, record_state, regenerate
from .claims import claims
from .presets import (
    EXPERIMENTS,
    QUICK_PRESETS,
    SWEEP_PRESETS,
    SweepPreset,
    as_architecture,
    as_mup,
    get_sweep_preset,
    model_key,
    only_models,
    plan_runs,
    points_text,
)
from .report import PLOT_FILES, report_markdown, write_plots

#: the results file of a sweep written before the sweep ran on the kit (it still reads: :func:`load_sweep`)
LEGACY_FILE = "sweep.json"
#: what a point's result carries besides its training run's, on the first seed only (the data, read once)
_DATA_FIELDS = ("tuning", "data_info", "unigram_perplexity", "majority_class_accuracy")


@dataclass(frozen=True)
class SweepOptions:
    """What ``fixedhead sweep`` trains: a preset (its options :data:`PRESETS`, its points and recipe
    :data:`~fixedhead.studies.sweep.presets.SWEEP_PRESETS`) and what a run changes of it; a field left None takes
    the preset's value."""

    preset: str = field(default="cpu-mlm", metadata={"choices": tuple(SWEEP_PRESETS)})
    """the points, recipe and fine-tuning (cpu-mlm = the BERT claims with the masked-LM recipe,
    8 models x seeds 0-2, SST-2 fine-tuning; cpu-clm = the LM1B claims as causal LMs, 5 models x seeds 0-1;
    cpu = the original 300-step masked sweep; tiny, tiny-clm = --quick's)"""
    seeds: tuple[int, ...] = field(default=None, metadata={"check": "non_negative", "distinct": True, "nonempty": True})
    """seeds, paired across models (None: the preset's); with --learning-rates the first chooses each model's rate"""
    experiments: tuple[str, ...] = field(default=(), metadata={"choices": EXPERIMENTS})
    """train only these experiments' points (empty: every experiment of the preset)"""
    models: tuple[str, ...] = ()
    """train only these of the preset's models, by key (d128-h32-dp4, d128-h32-dp32-fixed; empty: all)"""
    steps: int | None = field(default=None, metadata={"check": "positive"})
    """training steps of every run (None: the preset's)"""
    corpus: str | None = None
    """the preset's corpus at another path, or another corpus (a .txt/.jsonl(.gz) file or a directory)"""
    finetune_task: str | None = field(default=None, metadata={"choices": tuple(MAIN_METRIC)})
    """the GLUE task each checkpoint is fine-tuned on (None: the preset's, sst2; the causal presets fine-tune none)"""
    finetune_seed: int | None = field(default=None, metadata={"check": "non_negative"})
    """the fine-tuning seed: the classifier head's initialisation and the data order (None: each checkpoint's
    pretraining seed)"""
    skip_finetune: bool = False
    """pretrain only"""
    architecture: str | None = field(default=None, metadata={"choices": ("fixedhead", "llama")})
    """train every model as this family (llama: transformers' LlamaForCausalLM, causal presets only; runs KEY-llama)"""
    mup_base_head_dim: int | None = field(default=None, metadata={"check": "positive"})
    """train every model under the μP-style parametrization based at this head size K (logits √K/d_p, the output
    projection's initialisation and rate × K/d_p; fixedhead models only; runs KEY-mupK)"""
    learning_rates: tuple[float, ...] = ()
    """a grid each model chooses its own rate from with the first seed, on a validation split (empty: the
    recipe's one rate)"""
    max_extensions: int = field(default=3, metadata={"check": "non_negative"})
    """how often the rate grid grows past an edge"""
    keep_checkpoints: bool = False
    """keep the Trainer checkpoints of finished runs (by default only the final model stays)"""

    def __post_init__(self):
        check_fields(self)
        get_sweep_preset(self.preset)  # refused by name
        if self.experiments and (bad := core.first_unknown(self.experiments, EXPERIMENTS)) is not None:
            raise ValueError(f"unknown experiment {bad!r}; known: {', '.join(EXPERIMENTS)}")
        if self.architecture is not None:
            check_architecture(self.architecture)
        if self.learning_rates:
            parse_rates(self.learning_rates)  # a grid of >= 2 positive rates, named when not


#: the named options ``--preset NAME`` starts from (the options given override them); what else each name trains
#: (data, recipe, points, fine-tuning) is :data:`~fixedhead.studies.sweep.presets.SWEEP_PRESETS`'s
PRESETS = {
    "cpu-mlm": SweepOptions(seeds=(0, 1, 2)),
    "cpu-clm": SweepOptions(preset="cpu-clm", seeds=(0, 1)),
    "cpu": SweepOptions(preset="cpu", seeds=(0, 1)),
    "tiny": SweepOptions(preset="tiny", seeds=(0, 1)),
    "tiny-clm": SweepOptions(preset="tiny-clm", seeds=(0, 1)),
}
#: the options a preset gives a value (None in a run's options: the preset's)
PRESET_FIELDS = ("seeds",)


def check_same_tokenizer(results, tokenizer_sha256: str, folder: Path) -> None:
    """Refuse (FileExistsError, naming both hashes) to add a run trained with this tokenizer to a folder whose
    finished ``results`` were trained with another (a tokenizer library that learns other merges): per-token
    results of two vocabularies do not compare."""
    recorded = {(r.get("reproducibility") or {}).get("tokenizer_sha256") for r in results}
    if other := sorted(recorded - {None, tokenizer_sha256}):
        raise FileExistsError(
            f"{folder} holds runs trained with another tokenizer ({', '.join(t[:12] for t in other)}) than this "
            f"invocation's ({tokenizer_sha256[:12]}); their per-token results do not compare with these. Choose "
            "another --output-dir, or remove that folder to run the sweep again with this tokenizer"
        )


#: held-out evaluations of a run whose length ``--steps`` sets (one checkpoint, at its end)
EVALUATIONS = 2


@dataclass(frozen=True)
class SweepSpec:
    """What the options train: ``preset`` (its points restricted and transformed as the options say),
    ``data``, ``train``, ``finetune`` (None: no fine-tuning) and ``task``."""

    preset: SweepPreset
    data: DataSettings
    train: TrainSettings
    finetune: FinetuneSettings | None
    task: str
    options: SweepOptions


def spec(o: SweepOptions) -> SweepSpec:
    """The :class:`SweepSpec` of ``o``; ValueError for a model key the preset's experiments do not have or a
    fine-tuning task for a preset without fine-tuning."""
    o = core.from_preset(PRESETS, o, PRESET_FIELDS, "sweep")
    p = get_sweep_preset(o.preset)
    present = {pt.experiment for pt in p.points}
    # a choice of experiments only where it is not all of the preset's (the resolved options name them all)
    experiments = list(o.experiments) if o.experiments and set(o.experiments) != present else None
    points = only_models(p, list(o.models), o.preset, experiments).points if o.models else p.points
    points = [pt for pt in points if not experiments or pt.experiment in experiments]
    if o.architecture is not None:
        p = as_architecture(p, o.architecture)
    if o.mup_base_head_dim is not None:
        p = as_mup(p, o.mup_base_head_dim)
    p = replace(p, points=points)
    data = replace(p.data, corpus=o.corpus) if o.corpus else p.data
    if o.learning_rates:
        data = with_validation_split(data)  # rates are chosen on text no model trains on
    train = p.train
    if o.steps is not None:
        train = with_steps(train, o.steps, EVALUATIONS, checkpoints=1)
    if o.finetune_task and p.finetune is None:
        raise ValueError(
            f"sweep preset {o.preset!r} has no fine-tuning, so --finetune-task {o.finetune_task!r} does not apply"
        )
    ft = None if o.skip_finetune or p.finetune is None else replace(p.finetune, progress=False)
    return SweepSpec(p, data, train, ft, o.finetune_task or p.finetune_task, o)


def state_of(s: SweepSpec, results, meta: dict | None = None) -> dict:
    """The sweep's state as its claims, report and plots read it: ``meta`` (a stored one's values win, so an
    older sweep reads as it was), ``points``, ``runs`` (``{run folder: result}``) and, where each model chose
    its rate, ``tuning`` (``{model key: the choice}``)."""
    o, results = s.options, list(results)
    first = next((r for r in results if "unigram_perplexity" in r), {})
    computed = {
        "preset": o.preset,
        "quick": o.preset in QUICK_PRESETS,
        "data": s.data.record(),
        "data_info": first.get("data_info", {}),
        "train": {k: v for k, v in asdict(s.train).items() if k != "progress"},
        "finetune": asdict(s.finetune) if s.finetune else None,
        "finetune_task": s.task if s.finetune else None,
        "seeds": list(o.seeds),
        "experiments": list(o.experiments or EXPERIMENTS),
        "objective": s.train.objective,
        "verdict_rule": rule_text(CLAIMS_RULE),
        "verdict": dict(CLAIMS_RULE),
        "unigram_perplexity": first.get("unigram_perplexity"),
    }
    if first.get("majority_class_accuracy") is not None:
        computed["majority_class_accuracy"] = first["majority_class_accuracy"]
    if o.learning_rates:
        computed["learning_rate_selection"] = selection_record(
            parse_rates(o.learning_rates), o.max_extensions, o.seeds[0], s.data.validation_fraction
        )
    state = {
        "meta": {**computed, **(meta or {})},
        "points": [asdict(pt) | {"key": model_key({**s.preset.common, **pt.model})} for pt in s.preset.points],
        "runs": {r["name"]: {k: v for k, v in r.items() if k not in _DATA_FIELDS} for r in results},
    }
    if tuning := {r["key"]: r["tuning"] for r in results if r.get("tuning")}:
        state["tuning"] = dict(sorted(tuning.items()))
    return state


def summarise(state: dict) -> dict:
    """The paper-claim table (:func:`fixedhead.studies.sweep.claims.claims`) and the count of finished runs."""
    rows = claims(state) if state["runs"] else []
    return {"runs": len(state["runs"]), "claims": [dict(claim=c, measurement=m, verdict=v) for c, m, v in rows]}


def describe(s: SweepSpec) -> str:
    """What the spec's runs train, written from it: the training settings and rate, the points
    (:func:`~fixedhead.studies.sweep.presets.points_text`) and the fine-tuning."""
    rate = " at each model's own rate" if s.options.learning_rates else f" at lr {s.train.learning_rate:g}"
    layers = s.preset.common.get("num_hidden_layers", 2)
    points = f"; {points_text(s.preset)}" if s.preset.points else ""
    if s.finetune is not None:
        points += f"; GLUE {s.task} fine-tuning at {s.finetune.max_seq_length} tokens"
    return f"{s.preset.smoke}{training_text(s.data, s.train, layers)}{rate} per run{points}"


class SweepStudy(Study):
    """One point per (model, seed), seed-major. With a rate grid a model's first seed chooses its rate, the
    other seeds train at it; every run is then fine-tuned where the preset fine-tunes."""

    name = "sweep"
    help = "the paper's head / embedding-size / head-size sweeps with seeds, fine-tuning and a paper-claim table"
    removed = {
        "--no-report": "the report is written at the end of every invocation (it says when the sweep is incomplete)"
    }
    default_dir = "runs/{name}-{preset}"
    Options = SweepOptions
    quick = SweepOptions(preset="tiny")
    quick_presets = ("tiny-clm",)
    files = ("runs", *PLOT_FILES, LEGACY_FILE)  # sweep.json: the record before the kit (its runs are reused)
    # not the corpus: another corpus's results do not compare with these (a point reused elsewhere checks it too)
    points_only = ("seeds", "experiments", "models", "keep_checkpoints")
    summarise = staticmethod(summarise)
    report = staticmethod(report_markdown)
    write_files = staticmethod(write_plots)

    def state(self, s, results, record=None):
        return state_of(s, results, record and record["meta"])

    def describe(self, s):
        return describe(s)

    def resolve(self, o):
        """The :class:`SweepSpec` of ``o`` with every default written out or dropped, so that giving it
        explicitly is the same sweep."""
        preset = get_sweep_preset(o.preset)
        present = {pt.experiment for pt in preset.points}
        experiments = [e for e in EXPERIMENTS if e in (o.experiments or present)]
        corpus = o.corpus
        if corpus is not None and Path(corpus).exists():
            corpus = str(Path(corpus).resolve())
            if Path(preset.data.corpus).exists() and str(Path(preset.data.corpus).resolve()) == corpus:
                corpus = None
        same = {
            "finetune_task": o.finetune_task in (None, preset.finetune_task) and preset.finetune is not None,
            "architecture": o.architecture in (None, preset.common.get("architecture", "fixedhead")),
        }
        return spec(
            replace(
                o,
                experiments=tuple(experiments),
                models=tuple(sorted(o.models)),
                corpus=corpus,
                finetune_task=None if same["finetune_task"] else o.finetune_task,
                architecture=None if same["architecture"] else o.architecture,
                max_extensions=o.max_extensions if o.learning_rates else SweepOptions.max_extensions,
            )
        )

    def first_seed(self, s):
        return s.options.seeds[0] if s.options.learning_rates else None

    def plan(self, s):
        o, first = s.options, s.options.seeds[0]

        def needs(key, seed):  # a later seed trains at the rate its first seed chose
            return later_seed_needs(o.learning_rates, seed, first, core.run_key(key, seed=first))

        return [
            Point(core.run_key(key, seed=seed), (key, fields, seed), needs(key, seed))
            for key, fields, seed in plan_runs(s.preset, o.seeds)
        ]

    def plan_record(self, s):
        return {
            "pairing": "by seed: every model of one seed trains on the same batches in the same order",
            "verdict_rule": rule_text(CLAIMS_RULE),
            **({"rates_chosen_with_seed": self.first_seed(s)} if s.options.learning_rates else {}),
        }

    def check(self, s):
        """Every model buildable and trainable with the objective, and the fine-tuning task's data present,
        before any slow work."""
        if s.preset.common.get("architecture") == "llama" and s.train.objective != "clm":
            causal = [name for name, make in SWEEP_PRESETS.items() if make().train.objective == "clm"]
            raise ValueError(
                f"--architecture llama trains causal LMs only, and sweep preset {s.options.preset!r} trains masked "
                f"LMs: pass a causal preset (--preset {' or '.join(causal)})"
            )
        if s.finetune is not None:
            get_glue_task(s.task)
            majority_class_accuracy(s.task, max_examples=s.finetune.max_dev_examples)  # no dev file: named here
        for _, fields, _ in plan_runs(s.preset, s.options.seeds[:1]):
            check_objective_for(build_config({**fields, "vocab_size": s.data.vocab_size}), s.train.objective)

    def run(self, s, point, folder, done, progress):
        key, fields, seed = point.spec
        o = s.options
        data = self.data(s.data, progress)
        check_same_tokenizer(done.values(), data.info["tokenizer_sha256"], folder)
        train = replace(s.train, progress=progress)
        config = build_config(
            {**fields, "vocab_size": len(data.tokenizer), "pad_token_id": data.tokenizer.pad_token_id}
        )
        rates, first = parse_rates(o.learning_rates) if o.learning_rates else None, o.seeds[0]

        trained: dict[float, dict] = {}  # this point's runs by rate (the chosen one is not trained twice)

        def train_at(lr):
            if lr in trained:
                return trained[lr]
            run_dir = folder / "runs" / core.run_key(key, lr if rates else None, seed)
            if progress:
                why = " (choosing the rate)" if rates and seed == first else ""
                print(
                    f"{run_dir.name}: d={config.hidden_size}, h={config.num_attention_heads}, d_p="
                    f"{head_size_label(config)}, {parameter_count(config):,} parameters{why}",
                    flush=True,
                )
            result = train_or_reuse(
                config, data, run_dir, replace(train, seed=seed, learning_rate=lr), self.overwriting
            )
            for ckpt in () if o.keep_checkpoints else run_dir.glob("checkpoint-*"):
                shutil.rmtree(ckpt, ignore_errors=True)  # a finished run is reused from its metrics
            trained[lr] = result
            return result

        first_result = done.get(core.run_key(key, seed=first))
        rate = point_rate(train_at, rates, seed, first, train.learning_rate, first_result, o.max_extensions)
        lr, tuning = rate["learning_rate"], rate.get("tuning")
        result = trained[lr]
        name = core.run_key(key, lr if rates else None, seed)
        entry = {k: v for k, v in result.items() if k != "train_curve"} | {"name": name, "key": key, "seed": seed}
        if rates:
            entry["learning_rate"] = lr
        if s.finetune is not None:
            ft_seed = seed if o.finetune_seed is None else o.finetune_seed
            run_dir, ft = folder / "runs" / name, replace(s.finetune, seed=ft_seed)
            ft_dir = run_dir / f"finetune-{s.task}"
            # fine-tuning settings changed since an earlier invocation: redo only the fine-tuning
            stale = (ft_dir / FINETUNE_FILE).is_file() and load_json_file(ft_dir / FINETUNE_FILE).get(
                "fingerprint"
            ) != finetune_settings_record(run_dir, s.task, ft)
            ft_result = finetune(run_dir, s.task, ft_dir, ft, overwrite=self.overwriting or stale)
            entry["finetune"] = {k: v for k, v in ft_result.items() if k != "fingerprint"}
        if seed == first:  # the data's facts, read once: the report's references
            entry |= {
                "tuning": tuning,
                "data_info": {k: v for k, v in data.info.items() if k != "prepare_seconds"},
                "unigram_perplexity": unigram_perplexity(data, train.eval_seed, train.objective),
            }
            if s.finetune is not None:
                entry["majority_class_accuracy"] = majority_class_accuracy(
                    s.task, max_examples=s.finetune.max_dev_examples
                )
        return entry


def load_sweep(folder: str | Path) -> dict:
    """The :func:`state_of` the sweep in ``folder``, from ``results.json`` (or an older ``sweep.json``).

    Raises:
        FileNotFoundError: no sweep results in ``folder``.
        ValueError: another study's results, or a damaged file.
    """
    folder = Path(folder)
    if (folder / RESULTS_FILE).is_file():
        stored = load_json_file(folder / RESULTS_FILE, "sweep results")
        if (study := stored.get("meta", {}).get("study")) != "sweep":
            raise ValueError(f"{folder / RESULTS_FILE} holds the results of `fixedhead {study}`, not of a sweep")
        study = SweepStudy()
        record, _ = regenerate(study, folder)
        return record_state(study, study.resolve(options_from_dict(SweepOptions, record["options"])), record)
    path = folder / LEGACY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} holds no sweep results ({RESULTS_FILE}): run `fixedhead sweep` first")
    state = load_json_file(path)  # a truncated or damaged file is named
    if not isinstance(state.get("runs"), dict) or not isinstance(state.get("meta"), dict):
        raise ValueError(f"{path} is not a sweep results file (no 'meta' and 'runs')")
    return state


def write_report(sweep_dir: str | Path, output_dir: str | Path | None = None) -> Path:
    """Write ``report.md`` and the plots of the sweep in ``sweep_dir`` into ``output_dir`` (default: the
    sweep's folder); return the report's path. Raises as :func:`load_sweep`, ValueError for a sweep with no
    finished run and FileExistsError for an ``output_dir`` holding another study's files."""
    state = load_sweep(sweep_dir)
    if not state.get("runs"):
        raise ValueError(f"{sweep_dir}: the sweep has no finished run yet; nothing to report")
    out = Path(output_dir) if output_dir else Path(sweep_dir)
    if out.resolve() != Path(sweep_dir).resolve():  # the sweep's own folder is the report's home
        # report.md: every study's marker
        claim_output_dir(out, ("report.md",), ("report.md", ".report.md.*", "*.png"), "report", exclusive=True)
    if (Path(sweep_dir) / RESULTS_FILE).is_file():  # on the kit: its report, with the kit's notes
        text = regenerate(SweepStudy(), Path(sweep_dir))[1]
    else:
        text = report_markdown(state)
    write_plots(state, out)
    report = out / "report.md"
    write_text_atomic(report, text)
    return report
