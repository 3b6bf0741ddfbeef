"""`fixedhead widen-experiment`: does widening the heads of a trained standard-head model help?

Bhojanapalli et al. (ICML 2020) fix the head size d_p independently of d and h. A model already
trained with standard heads (d_p = d/h, far below the sequence length n) can be grown to larger
heads exactly (:func:`fixedhead.widen_heads`: same function, new weights that learn). This
experiment asks whether that is worth doing: it trains one standard-head causal LM (the *base*),
then continues it for the same number of extra steps, with the same recipe and data, in several
*arms*:

* ``as-is``: the base model unchanged;
* ``wide-all``: every layer's heads widened to ``wide_head_dim`` (default: the generic causal
  threshold ⌈(n − 1)/2⌉ of :mod:`fixedhead.theory`, 16 for n = 32: the smallest head that can
  represent a generic causal attention pattern on n tokens exactly);
* ``wide-early`` / ``wide-late``: only the first / only the last half of the layers widened (the
  same parameter count as each other);
* ``ffn-matched``: the heads kept, every feed-forward layer widened instead (exactly, by the same
  scheme: new input rows random, new output columns zero) to the parameter count of ``wide-all``
  as nearly as whole units allow: is it the head size or just the added parameters?

Each arm is continued from ``seeds`` seeds; seed s sets the continuation's data order (the same
for every arm, so arms are compared on the same batches) and the new random weights of the
widened models. The base is one run (its own seed), so the spread over seeds is the continuation's
noise given that base, not the noise of training a base.

With a learning-rate grid (``learning_rates``) each arm's continuation first trains at every rate
of the grid with the first seed and keeps the rate of lowest loss on a validation split of the
training documents (:mod:`fixedhead.studies.kit.learning_rate`; the base then trains without that split
too); every seed then continues at its arm's rate, and only those runs are results.

Every run is scored on every next token of the same held-out books, beside the unigram reference.
Arm B against arm A is judged by :func:`fixedhead.studies.kit.stats.pooled_verdict` (fixed before the
committed run). The runs (``base/``, ``start/ARM-sSEED/``, ``continue/ARM-sSEED/``) stay in the
output folder with ``results.json`` (rewritten atomically after each run, so an interrupted
experiment resumes), ``report.md`` and ``widening.png``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from ...checks import non_negative_int
from ...data import DataSettings, prepare_data
from ...data.lm import unigram_perplexity
from ...model.configuration import FixedHeadConfig
from ...model.sizes import count_parameters, training_flops
from ...runs import METRICS_FILE, PRETRAIN_FILE, open_run
from ...theory import causal_threshold
from ...training.evaluate import load_run
from ...training.identity import same_corpus_path, with_later_defaults
from ...training.pretrain import lm_config, pretrain, train_or_reuse
from ...training.settings import TrainSettings
from ..kit import core
from ..kit.learning_rate import (
    check_first_seed,
    choose_on_validation,
    parse_rates,
    selection_record,
    with_validation_split,
)
from ..kit.recipes import get_recipe
from ..kit.stats import RULE_STDS
from .arms import make_arms, max_logit_change, write_start
from .report import PLOT_FILE, REPORT_FILE, format_table, write_outputs

RESULTS_FILE = "results.json"
OWNED = (REPORT_FILE, PLOT_FILE, "learning_rates.png", "base", "start", "continue")


# ----------------------------------------------------------------------------------- design
@dataclass
class WideningPreset:
    """The data, the base model, the two training recipes, the wide head size and the seeds.

    ``model`` holds :class:`~fixedhead.model.configuration.FixedHeadConfig` fields of a standard-head
    model (``head_dim=None``); ``base`` trains it from scratch; ``continuation`` is every arm's
    recipe (its ``seed`` is replaced by each of ``seeds``). Both must use ``objective="clm"``.
    """

    data: DataSettings
    model: dict
    base: TrainSettings
    continuation: TrainSettings
    seeds: tuple[int, ...]
    wide_head_dim: int | None = None  # None: the generic causal threshold for n
    smoke: str = ""  # said first in the description of a preset whose numbers mean nothing

    @property
    def description(self) -> str:
        """The base model and the steps, written from the fields."""
        m, d, h = self.model, self.model["hidden_size"], self.model["num_attention_heads"]
        return (
            f"{self.smoke}a standard-head causal LM (d = {d}, h = {h}, d_p = {d // h}, {m['num_hidden_layers']} "
            f"layers, FFN {m['intermediate_size']}, n = {self.data.max_seq_length}, vocabulary "
            f"{self.data.vocab_size:,}, no dropout; {Path(self.data.corpus).name}), {self.base.max_steps} steps, "
            f"then {self.continuation.max_steps} more steps per arm"
        )


def base_and_continuation(base_steps: int, steps: int, batch: int, lr: float, logging: tuple[int, int]):
    """The base's and every continuation's causal-LM training settings: no Trainer evaluation (the
    held-out set is scored once, at the end) and no checkpoints (a run takes minutes)."""
    return tuple(
        TrainSettings(
            batch_size=batch,
            max_steps=n,
            learning_rate=lr,
            objective="clm",
            logging_steps=every,
            eval_steps=n + 1,
            save_steps=n + 1,
            report_to=[],
        )
        for n, every in zip((base_steps, steps), logging, strict=True)
    )


def _preset(recipe: str, d: int, h: int, steps: tuple[int, int], batch: int, lr: float, logging, seeds, smoke=""):
    """The recipe's data and a standard-head model of it with 2 layers, trained as a causal LM."""
    r = get_recipe(recipe)
    model = r.model_fields(hidden_size=d, num_attention_heads=h, head_dim=None, num_hidden_layers=2)
    base, cont = base_and_continuation(*steps, batch, lr, logging)
    return WideningPreset(data=r.data, model=model, base=base, continuation=cont, seeds=seeds, smoke=smoke)


WIDENING_PRESETS = {
    # the masked recipe's data and sizes at n = 32, as the committed run was made
    "cpu": lambda: _preset("cpu-mlm", 128, 16, (400, 100), 128, 1e-3, (25, 10), (1, 2, 3)),
    "tiny": lambda: _preset("tiny", 32, 8, (20, 10), 16, 2e-3, (5, 5), (1,), "a smoke test (numbers mean nothing): "),
}


def get_widening_preset(name: str) -> WideningPreset:
    """Raises ValueError listing the known presets."""
    return core.pick(WIDENING_PRESETS, name, "widen-experiment")


# ------------------------------------------------------------------------------------ runner
def settings_record(p: WideningPreset, wide_head_dim: int, selection: dict | None = None) -> dict:
    """The settings record stored runs are reused under: data, model, both recipes (seeds aside),
    wide size and, where arms choose their rates, the grid ``selection`` (through JSON, as
    results.json reads it back)."""

    def recipe(t):
        return {k: v for k, v in asdict(t).items() if k not in ("seed", "progress")}

    record = {
        "data": p.data.record(),
        "model": p.model,
        "base": {**recipe(p.base), "seed": p.base.seed},
        "continuation": recipe(p.continuation),
        "wide_head_dim": wide_head_dim,
        **({"learning_rate_selection": selection} if selection else {}),
    }
    return json.loads(json.dumps(record, default=str))


def same_settings(saved: dict | None, settings: dict) -> bool:
    """A saved settings record against the current one, training fields added since compared at
    their old default (:func:`fixedhead.training.identity.with_later_defaults`) and the corpus by
    :func:`~fixedhead.training.identity.same_corpus_path` (a moved checkout still matches)."""

    def normal(f):
        return {k: with_later_defaults(v) if k in ("base", "continuation") else v for k, v in f.items()}

    if not isinstance(saved, dict):
        return False
    old, now = normal(saved), normal(settings)
    old_corpus, now_corpus = (old.get("data") or {}).get("corpus"), (now.get("data") or {}).get("corpus")
    if same_corpus_path(old_corpus, now_corpus):  # each run's corpus text is compared by digest on reuse
        old = {**old, "data": {**old["data"], "corpus": now_corpus}}
    return old == now


def run_widening(
    preset: str | WideningPreset = "cpu",
    output_dir: str | Path | None = None,
    seeds: list[int] | None = None,
    base_steps: int | None = None,
    steps: int | None = None,
    wide_head_dim: int | None = None,
    corpus: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    cache_dir=None,
    command: str | None = None,
    learning_rates: str | list[float] | None = None,
    max_extensions: int = 3,
) -> dict:
    """Train the base, continue it in every arm for every seed (or reuse finished runs); write the
    results, the report and the plot.

    Args:
        preset: a name from :data:`WIDENING_PRESETS` or a :class:`WideningPreset`.
        output_dir: a new or empty folder, or an earlier output of this experiment (default
            ``runs/widen-experiment-PRESET``).
        seeds: continuation seeds (default: the preset's); runs of other seeds already in the
            folder are kept in ``results.json`` but only these are reported.
        base_steps, steps: override the base's and each continuation's training steps.
        wide_head_dim: the widened head size (default: the preset's, else ⌈(n − 1)/2⌉).
        corpus: another corpus path (the same text, e.g. moved).
        overwrite: delete this experiment's earlier runs and results in the folder first.
        learning_rates: a grid (``"5e-4,1e-3,2e-3,4e-3"`` or numbers): each arm's continuation rate
            is chosen on a validation split with the first seed (runs ``ARM-lrX-sSEED``); None: the
            preset's one rate for every arm (runs ``ARM-sSEED``).
        max_extensions: rates added past an edge of the grid at most.

    Returns:
        The content of ``results.json``: ``meta``, ``unigram_perplexity``, ``base``, ``runs`` and,
        with a grid, ``tuning`` (each arm's validation loss per rate and its chosen rate).

    Raises:
        ValueError: bad seeds, steps, sizes, rates or extensions, or a preset that is not a causal
            standard-head model.
        FileExistsError: the folder holds other files, or runs of other settings (without
            ``overwrite``), or arms that chose their rates with another first seed.
    """
    p = copy.deepcopy(get_widening_preset(preset) if isinstance(preset, str) else preset)
    p.seeds = core.seeds_override(seeds, p.seeds)
    if corpus is not None:
        p.data = replace(p.data, corpus=corpus)
    for name, option, override in (("base", "base_steps", base_steps), ("continuation", "steps", steps)):
        t = getattr(p, name)
        if t.objective != "clm":
            raise ValueError(f"the {name} recipe must use objective='clm', got {t.objective!r}")
        if override is not None:  # no evaluation or checkpoint inside the run, as in the presets
            n_steps = core.steps_override(option, override, t.max_steps)
            setattr(p, name, replace(t, max_steps=n_steps, eval_steps=n_steps + 1, save_steps=n_steps + 1))
    n = p.data.max_seq_length
    wide = wide_head_dim if wide_head_dim is not None else (p.wide_head_dim or causal_threshold(n))
    probe = FixedHeadConfig(**p.model, vocab_size=p.data.vocab_size)
    if probe.is_fixed_head:
        raise ValueError(f"the base model must have standard heads (head_dim=None), got {probe.head_dim!r}")
    make_arms(probe, wide)  # refuses a bad wide size before anything is written
    non_negative_int("max_extensions", max_extensions)
    rates = grid = None
    if learning_rates is not None:
        rates = parse_rates(learning_rates)
        p.data = with_validation_split(p.data)  # rates are chosen on text no run trains on
        grid = {"grid": rates, "max_extensions": max_extensions, "validation_fraction": p.data.validation_fraction}

    out = core.output_folder(output_dir, "widen-experiment", preset)
    out = core.claim(out, RESULTS_FILE, OWNED, "widen-experiment")
    state_file = out / RESULTS_FILE
    previous, meta = core.resume(
        state_file,
        preset,
        p.description,
        command,
        settings_record(p, wide, grid),  # seeds may change; the first is checked below
        "data, model, recipes, wide head size or learning-rate grid",
        same_settings,
        overwrite,
        study="widen-experiment",
        seeds=list(p.seeds),
        n=n,
        wide_head_dim=wide,
        causal_threshold=causal_threshold(n),
        rule={"stds": RULE_STDS},
        continuation_tokens=p.continuation.max_steps * p.continuation.batch_size * n,
    )
    if grid:
        check_first_seed(previous, p.seeds[0], state_file, "arms")
        meta["learning_rate_selection"] = selection_record(**grid, seed=p.seeds[0])
    data = prepare_data(p.data, cache_dir=cache_dir, progress=progress)  # a bad corpus leaves nothing behind
    out = core.claim(out, RESULTS_FILE, OWNED, "widen-experiment", create=True, overwrite=overwrite)
    config = lm_config(FixedHeadConfig(**p.model, vocab_size=len(data.tokenizer)), data.tokenizer, "clm")
    arms = make_arms(config, wide)
    meta["arms"] = [asdict(a) for a in arms]
    meta["data_info"] = {k: v for k, v in data.info.items() if k != "prepare_seconds"}
    state = {
        "meta": meta,
        "unigram_perplexity": unigram_perplexity(data, p.base.eval_seed, "clm"),
        "base": previous.get("base"),
        "runs": previous.get("runs", {}),
    }

    def save():
        core.save_state(state_file, state, ([state["base"]] if state["base"] else []) + list(state["runs"].values()))

    save()  # the marker first: an interrupted experiment's folder is recognised as its own

    base_dir = out / "base"
    if progress:
        continuations = len(arms) * (len(p.seeds) + (len(rates) - 1 if rates else 0))
        print(
            f"\n[base] {base_dir}: d={config.hidden_size}, h={config.num_attention_heads}, "
            f"d_p={config.head_size_label}, {count_parameters(config, pooler=False):,} parameters, "
            f"{p.base.max_steps} steps; then {continuations}+ continuations of {p.continuation.max_steps} steps",
            flush=True,
        )
    base = train_or_reuse(config, data, base_dir, replace(p.base, progress=progress))
    state["base"] = {
        **{k: v for k, v in base.items() if k != "eval_curve"},
        "flops": training_flops(config, base["training_tokens"], n),
    }
    save()
    if progress:
        print(f"[base] held-out loss {base['heldout_loss']:.4f} (ppl {base['heldout_perplexity']:.1f})", flush=True)

    base_model = load_run(base_dir)[0].eval()

    def continue_arm(arm, seed: int, lr: float | None) -> dict:
        """One continuation (reused when finished): ``lr`` None is the preset's rate."""
        key = core.run_key(arm.name, lr, seed)
        run_dir = out / "continue" / key
        if key in state["runs"] and (run_dir / METRICS_FILE).is_file():
            return state["runs"][key]
        if arm.head_dim is None and arm.intermediate_size is None:
            start, change = base_dir, 0.0
        else:
            start = out / "start" / core.run_key(arm.name, seed=seed)  # the same start at every rate
            write_start(base_dir, arm, seed, start)
            change = max_logit_change(base_model, start, data.heldout[:16])
        train = replace(
            p.continuation,
            seed=seed,
            progress=progress,
            learning_rate=p.continuation.learning_rate if lr is None else lr,
        )
        result = pretrain(None, data, run_dir, train, resume=(run_dir / PRETRAIN_FILE).is_file(), init_from=start)
        run_config = open_run(run_dir).config
        state["runs"][key] = {
            **{k: v for k, v in result.items() if k not in ("eval_curve", "init_from")},
            # the start as a path inside the output folder (results.json stays true when the folder moves)
            "init_from": {
                "path": start.relative_to(out).as_posix(),
                **{k: v for k, v in result["init_from"].items() if k != "path"},
            },
            "arm": arm.name,
            "seed": seed,
            "learning_rate": train.learning_rate,
            "layer_head_dims": run_config.layer_head_dims,
            "intermediate_size": run_config.intermediate_size,
            "flops": training_flops(run_config, result["training_tokens"], n),
            "start_max_logit_change": change,
        }
        save()
        if progress:
            print(
                f"{key}: d_p {run_config.layer_head_dims}, FFN {run_config.intermediate_size}, "
                f"{result['parameters']:,} parameters; held-out loss {result['heldout_loss']:.4f} "
                f"(ppl {result['heldout_perplexity']:.1f}); start max |Δlogits| {change:.1e}; "
                f"{result['train_seconds']:.0f} s",
                flush=True,
            )
        return state["runs"][key]

    if rates is not None:
        names = {arm.name for arm in arms}
        state["tuning"] = {k: v for k, v in previous.get("tuning", {}).items() if k in names}
        for arm in arms:
            # rates recorded before (a rerun) are not trained again, a diverged one included
            done = state["tuning"].get(arm.name, {}).get("validation_loss")
            state["tuning"][arm.name] = choose_on_validation(
                partial(continue_arm, arm, p.seeds[0]), rates, max_extensions, done
            )
            save()
    for arm, seed in core.seed_major(arms, p.seeds):  # a cut-short study has whole seeds
        continue_arm(arm, seed, state["tuning"][arm.name]["chosen"] if rates else None)
    save()
    write_outputs(state, out)
    if progress:
        print()
        print(format_table(state))
    return state
