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

Every run is scored on every next token of the same held-out books, beside the unigram reference.
Arm B against arm A is judged by :func:`fixedhead.studies.stats.pooled_verdict` (fixed before the
committed run). The runs (``base/``, ``start/ARM-sSEED/``, ``continue/ARM-sSEED/``) stay in the
output folder with ``results.json`` (rewritten atomically after each run, so an interrupted
experiment resumes), ``report.md`` and ``widening.png``.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..data import DataSettings, prepare_data
from ..data.lm import unigram_perplexity
from ..model.configuration import FixedHeadConfig
from ..model.flops import training_flops
from ..model.modeling import count_parameters
from ..plotting import pyplot, save_figure
from ..runs import METRICS_FILE, PRETRAIN_FILE, open_run, write_text_atomic
from ..theory import causal_threshold
from ..training.evaluate import load_run
from ..training.pretrain import lm_config, pretrain, same_corpus_path, train_or_reuse, with_later_defaults
from ..training.settings import TrainSettings
from . import core, render
from .recipes import get_recipe
from .stats import RULE_STDS, mean_std, pm, pooled_verdict
from .widening_arms import make_arms, max_logit_change, write_start

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
PLOT_FILE = "widening.png"
OWNED = (REPORT_FILE, PLOT_FILE, "base", "start", "continue")


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


#: the questions of the report: (B, A, what B against A asks)
COMPARISONS = [
    ("wide-all", "as-is", "does widening every layer's heads help?"),
    ("wide-early", "as-is", "does widening only the early layers help?"),
    ("wide-late", "as-is", "does widening only the late layers help?"),
    ("wide-early", "wide-late", "early or late layers (equal parameters)?"),
    ("ffn-matched", "as-is", "do the same extra parameters in the feed-forward layers help?"),
    ("wide-all", "ffn-matched", "heads or feed-forward, at (nearly) equal parameters?"),
]


# ------------------------------------------------------------------------------------ runner
def settings_record(p: WideningPreset, wide_head_dim: int) -> dict:
    """The settings record stored runs are reused under: data, model, both recipes (seeds aside),
    wide size (through JSON, as results.json reads it back)."""

    def recipe(t):
        return {k: v for k, v in asdict(t).items() if k not in ("seed", "progress")}

    record = {
        "data": p.data.record(),
        "model": p.model,
        "base": {**recipe(p.base), "seed": p.base.seed},
        "continuation": recipe(p.continuation),
        "wide_head_dim": wide_head_dim,
    }
    return json.loads(json.dumps(record, default=str))


def same_settings(saved: dict | None, settings: dict) -> bool:
    """A saved settings record against the current one, training fields added since compared at
    their old default (:func:`fixedhead.training.pretrain.with_later_defaults`) and the corpus by
    :func:`~fixedhead.training.pretrain.same_corpus_path` (a moved checkout still matches)."""

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
    output_dir: str | Path = "runs/widen-experiment",
    seeds: list[int] | None = None,
    base_steps: int | None = None,
    steps: int | None = None,
    wide_head_dim: int | None = None,
    corpus: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    cache_dir=None,
    command: str | None = None,
) -> dict:
    """Train the base, continue it in every arm for every seed (or reuse finished runs); write the
    results, the report and the plot.

    Args:
        preset: a name from :data:`WIDENING_PRESETS` or a :class:`WideningPreset`.
        output_dir: a new or empty folder, or an earlier output of this experiment.
        seeds: continuation seeds (default: the preset's); runs of other seeds already in the
            folder are kept in ``results.json`` but only these are reported.
        base_steps, steps: override the base's and each continuation's training steps.
        wide_head_dim: the widened head size (default: the preset's, else ⌈(n − 1)/2⌉).
        corpus: another corpus path (the same text, e.g. moved).
        overwrite: delete this experiment's earlier runs and results in the folder first.

    Returns:
        The content of ``results.json``: ``meta``, ``unigram_perplexity``, ``base`` and ``runs``.

    Raises:
        ValueError: bad seeds, steps or sizes, or a preset that is not a causal standard-head model.
        FileExistsError: the folder holds other files, or runs of other settings (without ``overwrite``).
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

    out = core.claim(Path(output_dir), RESULTS_FILE, OWNED, "widen-experiment")
    state_file = out / RESULTS_FILE
    what = "data, model, recipes or wide head size"
    previous, meta = core.resume(
        state_file,
        preset,
        p.description,
        command,
        settings_record(p, wide),
        what,
        same_settings,
        overwrite,
        seeds=list(p.seeds),
        n=n,
        wide_head_dim=wide,
        causal_threshold=causal_threshold(n),
        rule={"stds": RULE_STDS},
        continuation_tokens=p.continuation.max_steps * p.continuation.batch_size * n,
    )
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
    plan = core.seed_major(arms, p.seeds)
    if progress:
        print(
            f"\n[base] {base_dir}: d={config.hidden_size}, h={config.num_attention_heads}, "
            f"d_p={config.head_size_label}, {count_parameters(config, pooler=False):,} parameters, "
            f"{p.base.max_steps} steps; then {len(plan)} continuations of {p.continuation.max_steps} steps",
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

    def done(arm, seed):
        return (
            f"{arm.name}-s{seed}" in state["runs"]
            and (out / "continue" / f"{arm.name}-s{seed}" / METRICS_FILE).is_file()
        )

    for i, arm, seed in core.pending(plan, done):
        key = f"{arm.name}-s{seed}"
        run_dir = out / "continue" / key
        if arm.head_dim is None and arm.intermediate_size is None:
            start, change = base_dir, 0.0
        else:
            start = out / "start" / key
            write_start(base_dir, arm, seed, start)
            change = max_logit_change(base_model, start, data.heldout[:16])
        train = replace(p.continuation, seed=seed, progress=progress)
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
            "layer_head_dims": run_config.layer_head_dims,
            "intermediate_size": run_config.intermediate_size,
            "flops": training_flops(run_config, result["training_tokens"], n),
            "start_max_logit_change": change,
        }
        save()
        if progress:
            print(
                f"[{i}/{len(plan)}] {key}: d_p {run_config.layer_head_dims}, FFN {run_config.intermediate_size}, "
                f"{result['parameters']:,} parameters; held-out loss {result['heldout_loss']:.4f} "
                f"(ppl {result['heldout_perplexity']:.1f}); start max |Δlogits| {change:.1e}; "
                f"{result['train_seconds']:.0f} s",
                flush=True,
            )
    save()
    write_outputs(state, out)
    if progress:
        print()
        print(format_table(state))
    return state


# ----------------------------------------------------------------------------------- outputs
def _arm_runs(state: dict, arm: str) -> list[dict]:
    seeds = state["meta"]["seeds"]
    return sorted(
        (r for r in state["runs"].values() if r["arm"] == arm and r["seed"] in seeds), key=lambda r: r["seed"]
    )


def summarize(state: dict) -> list[dict]:
    """One row per arm: sizes, parameters, FLOPs, held-out loss and perplexity (mean ± std over
    seeds), nats below the unigram reference, per-seed losses."""
    unigram = math.log(state["unigram_perplexity"])
    rows = []
    as_is = _arm_runs(state, "as-is")
    as_is_by_seed = {r["seed"]: r["heldout_loss"] for r in as_is}
    for arm in state["meta"]["arms"]:
        rs = _arm_runs(state, arm["name"])
        if not rs:
            rows.append({"arm": arm["name"], "runs": 0, "description": arm["description"]})
            continue
        losses = [r["heldout_loss"] for r in rs]
        m, s = mean_std(losses)
        ppl_m, ppl_s = mean_std([r["heldout_perplexity"] for r in rs])
        rows.append(
            {
                "arm": arm["name"],
                "description": arm["description"],
                "runs": len(rs),
                "seeds": [r["seed"] for r in rs],
                "layer_head_dims": rs[0]["layer_head_dims"],
                "intermediate_size": rs[0]["intermediate_size"],
                "parameters": rs[0]["parameters"],
                "extra_parameters": rs[0]["parameters"] - as_is[0]["parameters"] if as_is else None,
                "flops": rs[0]["flops"],
                "flops_ratio": rs[0]["flops"] / as_is[0]["flops"] if as_is else None,
                "loss_mean": m,
                "loss_std": s,
                "ppl_mean": ppl_m,
                "ppl_std": ppl_s,
                "below_unigram": unigram - m,
                "losses": losses,
                # descriptive, not the verdict rule: the same seed means the same batches in every arm
                "paired_differences": [
                    r["heldout_loss"] - as_is_by_seed[r["seed"]] for r in rs if r["seed"] in as_is_by_seed
                ],
                "accuracy_mean": mean_std([r["heldout_accuracy"] for r in rs])[0],
                "start_max_logit_change": max(r["start_max_logit_change"] for r in rs),
                "train_seconds_mean": mean_std([r["train_seconds"] for r in rs])[0],
            }
        )
    return rows


def comparisons(state: dict) -> list[dict]:
    """:data:`COMPARISONS` with :func:`~.stats.pooled_verdict` applied (only pairs whose arms both ran)."""
    names = {a["name"] for a in state["meta"]["arms"]}
    out = []
    for b, a, question in COMPARISONS:
        if a not in names or b not in names:
            continue
        la = [r["heldout_loss"] for r in _arm_runs(state, a)]
        lb = [r["heldout_loss"] for r in _arm_runs(state, b)]
        if la and lb:
            out.append({"b": b, "a": a, "question": question, **pooled_verdict(la, lb)})
    return out


def _results_table(state: dict) -> list[str]:
    """The markdown table of the base and the arms (mean ± std over seeds, per-seed losses)."""
    meta, base, unigram = state["meta"], state.get("base") or {}, state["unigram_perplexity"]
    model, base_steps = meta["settings"]["model"], meta["settings"]["base"]["max_steps"]
    L = [
        "| arm | d_p per layer | FFN | parameters | extra | continuation FLOPs (× as-is) | held-out loss | "
        "perplexity | below unigram | losses per seed | − as-is, same seed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if base:
        L.append(
            f"| base ({base_steps} steps) | {base['head_dim']} | {model['intermediate_size']} | "
            f"{base['parameters']:,} | – | {base['flops']:.3g} (base training) | {base['heldout_loss']:.4f} | "
            f"{base['heldout_perplexity']:.1f} | {math.log(unigram) - base['heldout_loss']:.3f} | – | – |"
        )
    for r in summarize(state):
        if not r["runs"]:
            L.append(f"| {r['arm']} | not run | | | | | | | | | |")
            continue
        L.append(
            f"| {r['arm']} | {r['layer_head_dims']} | {r['intermediate_size']} | {r['parameters']:,} | "
            f"{r['extra_parameters']:+,} | {r['flops']:.3g} ({r['flops_ratio']:.3f}) | "
            f"{pm(r['loss_mean'], r['loss_std'], 4)} | {pm(r['ppl_mean'], r['ppl_std'], 1)} | "
            f"{r['below_unigram']:.3f} | {', '.join(f'{x:.4f}' for x in r['losses'])} | "
            f"{', '.join(f'{x:+.4f}' for x in r['paired_differences'])} |"
        )
    return L


def format_table(state: dict) -> str:
    """The arms (mean ± std over seeds) and the verdicts, for the terminal: the report's results table
    and one line per comparison."""
    verdicts = [
        f"{c['b']} vs {c['a']}: {c['a']} − {c['b']} = {c['difference']:+.4f} nats, "
        f"{RULE_STDS:g} x pooled std = {c['threshold']:.4f}: {c['verdict']}"
        for c in comparisons(state)
    ]
    return "\n".join(_results_table(state) + verdicts)


def write_outputs(state: dict, out: Path) -> None:
    """``report.md`` and ``widening.png`` in ``out`` (``results.json`` is written as runs finish)."""
    plot(state, out / PLOT_FILE)
    write_text_atomic(out / REPORT_FILE, report_markdown(state))


def plot(state: dict, path: Path) -> None:
    """Left: each arm's held-out loss minus the mean of *as-is* (each seed a dot, mean ± std a bar).
    Right: each arm's training loss minus *as-is*'s on the same batches (same seed), mean over seeds."""
    plt = pyplot()
    rows = [r for r in summarize(state) if r["runs"]]
    as_is = next((r for r in rows if r["arm"] == "as-is"), None)
    if as_is is None:
        return
    ref = as_is["loss_mean"]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    ax = axes[0]
    for i, r in enumerate(rows):
        c = colours[i % len(colours)]
        ax.scatter([i - 0.08] * len(r["losses"]), [x - ref for x in r["losses"]], color=c, s=16, alpha=0.7)
        std = r["loss_std"] if math.isfinite(r["loss_std"]) else 0.0
        ax.errorbar([i + 0.08], [r["loss_mean"] - ref], yerr=[std], color=c, marker="o", capsize=4)
    ax.axhline(0.0, color="gray", linewidth=1)
    ax.set_xticks(range(len(rows)), [f"{r['arm']}\n{r['parameters'] / 1e6:.3f}M" for r in rows], fontsize=8)
    ax.set_ylabel("held-out loss − as-is mean (nats; < 0 is better)")
    base = state.get("base") or {}
    ax.set_title(
        f"after the continuation (dots: seeds; bar: mean ± std)\nas-is {ref:.4f} nats"
        + (f"; the base before it {base['heldout_loss']:.4f}" if base else ""),
        fontsize=9,
    )
    ax = axes[1]
    reference = {r["seed"]: dict(map(tuple, r["train_curve"])) for r in _arm_runs(state, "as-is")}
    for i, r in enumerate(rows):
        if r["arm"] == "as-is":
            continue
        diffs = []
        for run in _arm_runs(state, r["arm"]):
            if run["seed"] in reference:
                curve = dict(map(tuple, run["train_curve"]))
                diffs.append(
                    {s: v - reference[run["seed"]][s] for s, v in curve.items() if s in reference[run["seed"]]}
                )
        steps = sorted(set.intersection(*(set(d) for d in diffs))) if diffs else []
        if steps:
            ax.plot(
                steps,
                [sum(d[s] for d in diffs) / len(diffs) for s in steps],
                color=colours[i % len(colours)],
                marker=".",
                label=r["arm"],
            )
    ax.axhline(0.0, color="gray", linewidth=1)
    ax.set_xlabel("continuation step")
    ax.set_ylabel("training loss − as-is's, same batches (nats)")
    ax.set_title("training loss against as-is during the continuation (mean over seeds)", fontsize=9)
    fig.suptitle(state["meta"]["description"], fontsize=8)
    save_figure(fig, path, [axes[1]])


def report_markdown(state: dict) -> str:
    """The markdown report: what was run, the rule, the table, the comparisons and the verdict."""
    meta, base = state["meta"], state.get("base") or {}
    settings = meta["settings"]
    cont, base_recipe = settings["continuation"], settings["base"]
    rows = summarize(state)
    comps = comparisons(state)
    unigram = state["unigram_perplexity"]
    n_done = sum(r["runs"] for r in rows)
    n_plan = len(meta["arms"]) * len(meta["seeds"])
    model = settings["model"]
    title = "Does widening the heads of a trained standard-head model help?"
    note = render.incomplete(n_done, n_plan, "continuations", finished=n_done >= n_plan and bool(base))
    L = render.head(title, meta, note, f"![held-out loss per arm and training curves]({PLOT_FILE})")
    L += [
        f"- data: {Path(settings['data']['corpus']).name}, {meta['data_info']['train_documents']} training "
        f"documents ({meta['data_info']['train_sequences']:,} sequences of n = {meta['n']}), held out: "
        f"{'; '.join(meta['data_info']['heldout_documents'])} ({meta['data_info']['heldout_sequences']:,} "
        f"sequences, every next token scored); WordPiece vocabulary {meta['data_info']['vocab_size']:,}",
        f"- base: a causal LM with standard heads, d = {model['hidden_size']}, h = {model['num_attention_heads']}, "
        f"d_p = d/h = {model['hidden_size'] // model['num_attention_heads']}, {model['num_hidden_layers']} layers, "
        f"FFN {model['intermediate_size']}, dropout {model.get('hidden_dropout_prob', 0.1)}; "
        f"{base_recipe['max_steps']} steps × {base_recipe['batch_size']} sequences, AdamW lr "
        f"{base_recipe['learning_rate']}, warm-up {base_recipe['warmup_ratio']:.0%} then linear decay, seed "
        f"{base_recipe['seed']}",
        f"- every continuation: {cont['max_steps']} more steps × {cont['batch_size']} sequences "
        f"({meta['continuation_tokens']:,} tokens) from the base's weights with a fresh optimizer and the same "
        f"recipe (lr {cont['learning_rate']}, warm-up {cont['warmup_ratio']:.0%} then linear decay)",
        f"- seeds {meta['seeds']}: seed s is the continuation's data order (the same batches in every arm) and "
        f"the new random weights of a widened model; the base is one run, so the spread over seeds is the "
        f"continuation's noise given this base",
        f"- wide head size d_p = {meta['wide_head_dim']}"
        + (
            f" = ⌈(n − 1)/2⌉, the generic causal threshold for n = {meta['n']} (docs/theory.md): a causal head "
            f"of this size can represent a generic causal attention pattern on {meta['n']} tokens exactly"
            if meta["wide_head_dim"] == meta["causal_threshold"]
            else f" (the generic causal threshold for n = {meta['n']} is {meta['causal_threshold']})"
        ),
        "",
        *render.table(["arm", "what changes at the start"], [[a["name"], a["description"]] for a in meta["arms"]]),
        "",
        "Every widened starting model computes the base's function: the largest change of any logit on 16 held-out "
        "sequences was "
        + f"{max((r.get('start_max_logit_change', 0.0) for r in rows if r['runs']), default=0.0):.1e}.",
        "",
        f"**Verdict rule** (fixed before the run): arm B against arm A is *lower loss* if mean loss(A) − mean "
        f"loss(B) > {RULE_STDS:g} × the pooled standard deviation √((s_A² + s_B²)/2) over seeds, *higher loss* if it "
        f"is < −{RULE_STDS:g} × that, and *no measurable difference* otherwise.",
        "",
        "## Results",
        "",
        f"Held-out loss per next token (nats) and perplexity, mean ± std over seeds; the unigram reference "
        f"(training-set word frequencies, no context) on the same tokens is ppl {unigram:.1f} (loss "
        f"{math.log(unigram):.4f}), and *below unigram* is its loss minus the model's. FLOPs: training FLOPs of "
        f"the continuation ({meta['continuation_tokens']:,} tokens; `fixedhead.model.flops.training_flops`).",
        "",
    ]
    L += _results_table(state)
    L += [
        "",
        "The last column is each seed's loss minus *as-is*'s with the same seed (the same batches): a "
        "description of the pairs, not part of the verdict rule, which compares the arms' means and spreads.",
        "",
        "## Verdicts",
        "",
        *render.table(
            ["question", "B vs A", "mean(A) − mean(B), nats", "threshold", "verdict for B"],
            [
                [
                    c["question"],
                    f"{c['b']} vs {c['a']}",
                    f"{c['difference']:+.4f}",
                    f"{c['threshold']:.4f}",
                    f"**{c['verdict']}**",
                ]
                for c in comps
            ],
        ),
        "",
    ]
    main = next((c for c in comps if c["b"] == "wide-all" and c["a"] == "as-is"), None)
    as_is = next((r for r in rows if r["arm"] == "as-is" and r["runs"]), None)
    if main and as_is and base:
        gain = base["heldout_loss"] - as_is["loss_mean"]
        L += [
            f"**In one sentence:** widening every layer's heads from d_p = "
            f"{model['hidden_size'] // model['num_attention_heads']} to {meta['wide_head_dim']} before "
            f"{cont['max_steps']} more steps gives "
            + {
                "lower loss": "a measurably lower held-out loss than continuing as is",
                "higher loss": "a measurably higher held-out loss than continuing as is",
                "no measurable difference": "no measurable difference in held-out loss from continuing as is",
            }.get(main["verdict"], "an undecided result against continuing as is (one seed)")
            + f" (as-is − wide-all = {main['difference']:+.4f} nats; threshold "
            f"{main['threshold']:.4f}); the continuation itself lowered the loss by {gain:.4f} nats from the base.",
            "",
        ]
    L += [
        "## What is and is not matched",
        "",
        "- Tokens and steps: every arm trains on the same number of tokens, in the same order for a given seed.",
        "- Parameters: *wide-early* and *wide-late* have exactly the same count; *ffn-matched* differs from "
        "*wide-all* by the few parameters a whole feed-forward unit cannot split (see the table); *as-is* has "
        "the fewest. There is no parameter-matched control for the one-layer arms.",
        "- FLOPs: the widened and ffn-matched arms cost more per token than *as-is*; the ratios are in the "
        "table. They count matrix products only, the output layer over the whole vocabulary included.",
        "",
    ]
    return "\n".join(L)
