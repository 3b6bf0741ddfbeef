"""`fixedhead sweep`: the paper's head, embedding-size and head-size sweeps at CPU scale.

Three experiments, each a list of points (a model configuration) trained with several seeds on
one shared tokenizer and data set (prepared once), scored by held-out perplexity with the
preset's objective and, for the masked presets, fine-tuned on SST-2. Presets: ``cpu-mlm`` (the
default: the BERT claims with the masked-LM recipe), ``cpu-clm`` (the LM1B claims as causal LMs),
``cpu`` (the original 300-step masked sweep, whose models stay near the unigram plateau).

* ``heads`` (paper Fig. 3a): at a fixed hidden size d, standard heads (d_p = d/h) against a fixed
  head size d_p, for a growing number of heads h;
* ``embedding`` (Fig. 1 and 2): standard models of growing d against fixed-head models at the
  smallest d with more heads, compared at equal parameter count;
* ``head_size`` (Table 2B): a fixed number of heads with a growing head size d_p.

Points that are the same architecture (a fixed head size equal to d/h *is* the standard layer)
are trained once and shared between series. Every (model, seed) pair is one run directory
``OUT/runs/<key>-s<seed>``; a sweep that is interrupted resumes without redoing finished runs
(pretraining: ``metrics.json`` with the same settings; fine-tuning: ``finetune_metrics.json``).
Results accumulate in ``OUT/sweep.json`` after every run; :func:`fixedhead.studies.sweep.report.write_report`
turns it into markdown and plots.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

from ...data.glue import majority_class_accuracy
from ...data.lm import prepare_data, unigram_perplexity
from ...model.architectures import build_config, check_objective_for, head_size_label
from ...model.sizes import parameter_count
from ...runs import load_json_file
from ...training.finetune import FINETUNE_FILE, finetune, finetune_settings_record
from ...training.identity import settings_differences
from ...training.pretrain import train_or_reuse
from ..kit import core
from ..kit.learning_rate import choose_on_validation, parse_rates, selection_record, with_validation_split
from ..kit.stats import CLAIMS_RULE, LEGACY_RULE, rule_text
from .presets import (
    EXPERIMENTS,
    SweepPreset,
    as_architecture,
    as_mup,
    get_sweep_preset,
    only_models,
    plan_runs,
    run_key,
)

SWEEP_FILE = "sweep.json"
#: what a sweep (and its report) writes in its folder besides sweep.json
OWNED = ("runs", "report.md", ".report.md.*", "*.png")


def check_same_tokenizer(state: dict, tokenizer_sha256: str | None, state_file: Path) -> None:
    """Refuse to merge results of runs trained with another tokenizer (recorded in a sweep file's
    meta or its runs) with this invocation's: per-token perplexities of two vocabularies do not
    compare, and a seed fixes the embedding rows, not which token owns each row. Sweep files from
    before tokenizers were recorded pass; their runs are checked one by one when reused."""
    recorded = {(state.get("meta", {}).get("data_info") or {}).get("tokenizer_sha256")}
    recorded |= {(r.get("reproducibility") or {}).get("tokenizer_sha256") for r in state.get("runs", {}).values()}
    other = sorted(recorded - {None, tokenizer_sha256})
    if tokenizer_sha256 and other:
        raise FileExistsError(
            f"{state_file} holds runs trained with another tokenizer ({', '.join(t[:12] for t in other)}) than this "
            f"invocation's ({tokenizer_sha256[:12]}); their per-token results do not compare with these. Choose "
            f"another --output-dir, or remove that folder to re-run the sweep with this tokenizer"
        )


def run_sweep(
    preset: str | SweepPreset = "cpu-mlm",
    output_dir: str | Path | None = None,
    quick: bool = False,
    corpus: str | None = None,
    seeds: list[int] | None = None,
    experiments: list[str] | None = None,
    max_steps: int | None = None,
    finetune_task: str | None = None,
    skip_finetune: bool = False,
    overwrite: bool = False,
    keep_checkpoints: bool = False,
    progress: bool = True,
    cache_dir=None,
    command: str | None = None,
    learning_rates: list[float] | None = None,
    max_extensions: int = 3,
    architecture: str | None = None,
    mup_base_head_dim: int | None = None,
    models: list[str] | None = None,
) -> dict:
    """Run (or resume) a sweep; write ``OUT/sweep.json`` after every run; return its content.

    Each run: pretraining with the preset's objective (:func:`fixedhead.training.pretrain.pretrain`) and, unless
    ``skip_finetune``, fine-tuning on ``finetune_task`` (default the preset's, SST-2) with its
    dev score recorded next to the held-out perplexity.

    ``learning_rates``: a grid over which each model (point) chooses its own rate with the first
    seed on a validation split of the training documents (:mod:`fixedhead.studies.kit.learning_rate`);
    every seed then trains at that rate. The tuning runs go to ``OUT/runs/KEY-lrRATE-sSEED`` and
    their validation losses to ``sweep.json``'s ``tuning``; ``runs`` holds the chosen rate's runs.

    ``architecture``: train every point as this model family (:mod:`fixedhead.model.architectures`;
    ``"llama"``: transformers' ``LlamaForCausalLM``, causal presets only, run folders ``KEY-llama``);
    default: the preset's. ``mup_base_head_dim``: train every point under the μP-style
    parametrization based at this head size (:func:`as_mup`; fixedhead models only), run folders
    ``KEY-mupK``. ``models``: train only the preset's points of these models, named by their keys
    under the preset's own architecture and parametrization (``d128-h32-dp4``, ``d128-h32-dp32-fixed``).

    Raises:
        FileNotFoundError: the corpus or GLUE data is missing.
        ValueError: an unknown preset / experiment / task / architecture / model key, or a model the architecture
            cannot build or train (a masked Llama model, a Llama model under μP).
        FileExistsError: a run directory holds a run with other settings (without ``overwrite``), or
            the folder holds a sweep of other models at the same points (another architecture or
            parametrization), whose report would mix the two.
    """
    p = get_sweep_preset(preset, quick) if isinstance(preset, str) else preset
    name = preset if isinstance(preset, str) else "custom"
    data_settings = replace(p.data, corpus=corpus) if corpus else p.data
    if learning_rates is not None:
        learning_rates = parse_rates(learning_rates)
        data_settings = with_validation_split(data_settings)  # rates are chosen on text no model trains on
    p = replace(p, seeds=core.seeds_override(seeds, p.seeds))
    points = only_models(p, models, name, experiments).points if models is not None else p.points
    if architecture is not None:
        p = as_architecture(p, architecture)
    if mup_base_head_dim is not None:
        p = as_mup(p, mup_base_head_dim)
    whole, p = p, replace(p, points=points)  # the whole preset's points: what may already stand in the folder
    train = replace(p.train, progress=progress)
    if max_steps is not None:
        steps = core.steps_override("max_steps", max_steps, train.max_steps)
        train = replace(train, max_steps=steps, save_steps=steps, eval_steps=max(1, steps // 2))
    if finetune_task and p.finetune is None:
        raise ValueError(f"sweep preset {name!r} has no fine-tuning, so finetune_task={finetune_task!r} does not apply")
    task = finetune_task or p.finetune_task
    ft = None if skip_finetune or p.finetune is None else replace(p.finetune, progress=False)
    majority = None  # the majority-class rate fine-tuned runs are read against
    if ft is not None:
        # an unknown task or no dev file fails here, before hours of pretraining
        majority = majority_class_accuracy(task, max_examples=ft.max_dev_examples)
    runs_plan = plan_runs(p, experiments)
    for _, fields, _ in runs_plan:  # every model buildable and trainable before any slow work
        check_objective_for(build_config({**fields, "vocab_size": data_settings.vocab_size}), train.objective)

    # a new or empty folder, or an earlier sweep's
    out = core.claim(core.output_folder(output_dir, "sweep", preset, quick), SWEEP_FILE, OWNED, "sweep")
    state_file = out / SWEEP_FILE
    previous = load_json_file(state_file) if state_file.is_file() else {}  # a damaged one is named, not dropped
    prev_meta = previous.get("meta", {})
    if ft is None:  # a resume that skips fine-tuning keeps the rate its fine-tuned runs were read against
        majority = prev_meta.get("majority_class_accuracy")
    if prev_meta.get("data"):  # results computed on other data would not be comparable
        diffs = settings_differences({"data": prev_meta["data"]}, {"data": data_settings.record()})
        if diffs:
            raise FileExistsError(
                f"{state_file} holds a sweep on other data ({'; '.join(diffs[:4])}); choose another --output-dir"
            )

    # one model per point: runs of another architecture or parametrization would meet these in one
    # report (a point's x need not be unique: the embedding experiment's fixed models share d, one per h)
    now: dict[tuple, set[str]] = {}
    for pt in whole.points:
        now.setdefault((pt.experiment, pt.series, pt.x), set()).add(run_key({**whole.common, **pt.model}))
    clash = [
        (q["key"], sorted(now[xy]))
        for q in previous.get("points", [])
        if (xy := (q["experiment"], q["series"], q["x"])) in now and q["key"] not in now[xy]
    ]
    if clash:
        raise FileExistsError(
            f"{state_file} holds a sweep of other models ({clash[0][0]} where this call trains "
            f"{' or '.join(clash[0][1])}: another architecture or parametrization); choose another --output-dir"
        )
    selection = None
    if learning_rates:
        selection = selection_record(learning_rates, max_extensions, p.seeds[0], data_settings.validation_fraction)
    # every model's rate is chosen once, with one seed on one grid: an invocation with another
    # grid or first seed would mix choices made differently (or re-choose after results are in)
    old, new = (
        {k: c.get(k) for k in ("grid", "max_extensions", "seed")} if c else None
        for c in (prev_meta.get("learning_rate_selection"), selection)
    )
    if (previous.get("runs") or previous.get("tuning")) and old != new:
        raise FileExistsError(
            f"{state_file} chose learning rates as {old or 'one shared rate'}, this call as "
            f"{new or 'one shared rate'} (grid, extensions, first seed); pass the same --learning-rates, "
            "--max-extensions and first of --seeds, or choose another --output-dir"
        )
    t_start = time.time()
    data = prepare_data(data_settings, cache_dir=cache_dir, progress=progress)
    check_same_tokenizer(previous, data.info["tokenizer_sha256"], state_file)
    vocab = len(data.tokenizer)
    core.claim(out, SWEEP_FILE, OWNED, "sweep", create=True)
    # the rule fixed when the sweep began: a resumed sweep keeps it (one that predates the record, its p < 0.05)
    rule = prev_meta.get("verdict") or (LEGACY_RULE if previous.get("runs") else CLAIMS_RULE)
    description = p.description
    if learning_rates:  # the recipe's one rate is not what the models train at
        description = description.replace(f" at lr {train.learning_rate:g}", " at each model's own rate")
    meta = core.start_meta(
        preset,
        description,
        command,  # every invocation that wrote here: a resumed sweep, or several workers sharing the plan
        previous,
        "sweep",
        quick=quick,
        data=data_settings.record(),
        data_info=dict(data.info),
        train=asdict(train),
        finetune=asdict(ft) if ft else None,
        finetune_task=task if ft else None,
        seeds=list(p.seeds),
        experiments=list(experiments or EXPERIMENTS),
        objective=train.objective,
        # the rule the report judges every paper claim by, recorded before any training
        verdict_rule=rule_text(rule),
        verdict=dict(rule),
        unigram_perplexity=unigram_perplexity(data, train.eval_seed, train.objective),
        **({"majority_class_accuracy": majority} if majority is not None else {}),
        **({"learning_rate_selection": selection} if selection else {}),
    )
    points = [
        asdict(pt) | {"key": run_key({**p.common, **pt.model})}
        for pt in p.points
        if not experiments or pt.experiment in experiments
    ]
    runs: dict[str, dict] = {}
    tuning: dict[str, dict] = dict(previous.get("tuning", {}))

    def say(text: str) -> None:
        if progress:
            print(text, flush=True)

    def drop_checkpoints(run_dir: Path):
        # a finished run is reused from its metrics; its Trainer checkpoints only take disk
        for ckpt in () if keep_checkpoints else run_dir.glob("checkpoint-*"):
            shutil.rmtree(ckpt, ignore_errors=True)

    def save():
        # one worker at a time: two workers merging at once would each drop the other's newest run
        with core.one_writer(state_file):
            # the results file is a merge of everything finished in this folder: what other workers
            # or earlier invocations (other seeds, other experiments) recorded, plus this invocation's
            other = load_json_file(state_file) if state_file.is_file() else {}
            check_same_tokenizer(other, data.info["tokenizer_sha256"], state_file)  # a worker on another machine
            runs.update(
                {k: v for k, v in other.get("runs", {}).items() if k not in runs and (out / "runs" / k).is_dir()}
            )
            other_meta = other.get("meta", {})
            meta["commands"] = list(dict.fromkeys(other_meta.get("commands", []) + meta["commands"]))
            meta["first_started"] = min(other_meta.get("first_started", meta["first_started"]), meta["first_started"])
            seeds = set(other_meta.get("seeds", [])) | set(meta["seeds"]) | {r["seed"] for r in runs.values()}
            meta["seeds"] = sorted(seeds)
            experiments = set(other_meta.get("experiments", [])) | set(meta["experiments"])
            meta["experiments"] = [e for e in EXPERIMENTS if e in experiments]
            seen = {(q["experiment"], q["series"], q["x"], q["key"]) for q in points}
            points.extend(
                q for q in other.get("points", []) if (q["experiment"], q["series"], q["x"], q["key"]) not in seen
            )
            tuning.update({k: v for k, v in other.get("tuning", {}).items() if k not in tuning})
            state = {"meta": meta, "points": points, "runs": dict(sorted(runs.items()))}
            if tuning:
                state["tuning"] = dict(sorted(tuning.items()))
            core.save_state(state_file, state, runs.values(), other_meta)

    def tune(key, config) -> float:
        """The point's rate: each rate of the grid with the first seed, scored on the validation split."""
        seed = p.seeds[0]

        def train_at(lr):
            say(f"  {key}: lr {lr:g} (seed {seed}, choosing the rate)")
            settings, run_dir = replace(train, seed=seed, learning_rate=lr), out / "runs" / core.run_key(key, lr, seed)
            result = train_or_reuse(config, data, run_dir, settings, overwrite)
            drop_checkpoints(run_dir)
            return result

        tuning[key] = choose_on_validation(train_at, learning_rates, max_extensions)
        save()
        return tuning[key]["chosen"]

    save()  # written first: it marks the folder as this sweep's
    for i, (key, fields, seed) in enumerate(runs_plan, 1):
        config = build_config({**fields, "vocab_size": vocab, "pad_token_id": data.tokenizer.pad_token_id})
        lr = train.learning_rate
        if learning_rates and key in tuning:
            lr = tuning[key]["chosen"]
        elif learning_rates:
            choosing = core.try_lock(out / "runs" / f"{key}-rate")  # one worker trains a model's grid
            if choosing is None:
                say(f"  another worker is choosing {key}'s rate; skipping its runs for now")
                continue
            try:
                lr = tune(key, config)
            finally:
                choosing.unlink(missing_ok=True)
        name = core.run_key(key, lr if learning_rates else None, seed)
        run_dir = out / "runs" / name
        say(
            f"\n[{i}/{len(runs_plan)}] {key} seed {seed}: d={config.hidden_size}, h={config.num_attention_heads}, "
            f"d_p={head_size_label(config)}, {parameter_count(config):,} parameters "
            f"({time.time() - t_start:.0f} s into this invocation)"
        )
        lock = core.try_lock(run_dir)
        if lock is None:
            say("  another worker is on this run; skipping it")
            continue
        t0 = time.time()
        result = train_or_reuse(config, data, run_dir, replace(train, seed=seed, learning_rate=lr), overwrite)
        drop_checkpoints(run_dir)
        entry = {k: v for k, v in result.items() if k != "train_curve"} | {"key": key, "seed": seed}
        if learning_rates:
            entry["learning_rate"] = lr
        if ft is not None:
            ft_dir, ft_seeded = run_dir / f"finetune-{task}", replace(ft, seed=seed)
            # fine-tuning settings changed since an earlier invocation: redo only the fine-tuning
            stale = (ft_dir / FINETUNE_FILE).is_file() and load_json_file(ft_dir / FINETUNE_FILE).get(
                "fingerprint"
            ) != finetune_settings_record(run_dir, task, ft_seeded)
            ft_result = finetune(run_dir, task, ft_dir, ft_seeded, overwrite=overwrite or stale)
            entry["finetune"] = {k: v for k, v in ft_result.items() if k != "fingerprint"}
            say(
                f"  held-out perplexity {result['heldout_perplexity']:.2f}; {task} dev "
                f"{ft_result['metric']} {ft_result['score']:.4f} ({time.time() - t0:.0f} s)"
            )
        runs[name] = entry
        lock.unlink(missing_ok=True)
        save()
    save()
    say(
        f"\nsweep finished: {len(runs)} runs in {out}; {SWEEP_FILE} written "
        f"({meta['total_seconds']:.0f} s of wall time in all invocations)"
    )
    return {"meta": meta, "points": points, "runs": runs}
