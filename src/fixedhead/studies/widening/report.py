"""`fixedhead widen-experiment`'s summary and rendering: one row per arm, arm B against arm A
(:func:`fixedhead.studies.kit.stats.pooled_verdict`), the table, the plot and the report."""

from __future__ import annotations

import math
from pathlib import Path

from ...plotting import pyplot, save_figure
from ..kit import render
from ..kit.learning_rate import plot_learning_rates, selection_markdown
from ..kit.stats import RULE_STDS, mean_std, pm, pooled_verdict

REPORT_FILE = "report.md"
PLOT_FILE = "widening.png"

#: the questions of the report: (B, A, what B against A asks)
COMPARISONS = [
    ("wide-all", "as-is", "does widening every layer's heads help?"),
    ("wide-early", "as-is", "does widening only the early layers help?"),
    ("wide-late", "as-is", "does widening only the late layers help?"),
    ("wide-early", "wide-late", "early or late layers (equal parameters)?"),
    ("ffn-matched", "as-is", "do the same extra parameters in the feed-forward layers help?"),
    ("wide-all", "ffn-matched", "heads or feed-forward, at (nearly) equal parameters?"),
]


def _arm_runs(state: dict, arm: str) -> list[dict]:
    """The arm's result runs: the study's seeds, at the arm's chosen rate where arms chose one (none
    before the arm has chosen)."""
    seeds = state["meta"]["seeds"]
    tuned = "tuning" in state
    chosen = state.get("tuning", {}).get(arm, {}).get("chosen")
    runs = [r for r in state["runs"].values() if r["arm"] == arm and r["seed"] in seeds]
    return sorted((r for r in runs if not tuned or r.get("learning_rate") == chosen), key=lambda r: r["seed"])


def summarise(state: dict) -> list[dict]:
    """One row per arm: sizes, parameters, FLOPs, held-out loss and perplexity (mean ± std over
    seeds), nats below the unigram reference, per-seed losses."""
    unigram = math.log(state["unigram_perplexity"] or math.nan)  # none before the base has run
    rows = []
    as_is = _arm_runs(state, "as-is")
    as_is_by_seed = {r["seed"]: r["heldout_loss"] for r in as_is}
    for arm in state["meta"]["arms"]:
        rs = _arm_runs(state, arm["name"])
        rows.append({"arm": arm["name"], "description": arm["description"], "runs": len(rs)})
        if not rs:
            continue
        first, losses = rs[0], [r["heldout_loss"] for r in rs]
        m, s = mean_std(losses)
        ppl_m, ppl_s = mean_std([r["heldout_perplexity"] for r in rs])
        rows[-1].update(
            seeds=[r["seed"] for r in rs],
            layer_head_dims=first["layer_head_dims"],
            intermediate_size=first["intermediate_size"],
            parameters=first["parameters"],
            extra_parameters=first["parameters"] - as_is[0]["parameters"] if as_is else None,
            flops=first["flops"],
            flops_ratio=first["flops"] / as_is[0]["flops"] if as_is else None,
            loss_mean=m,
            loss_std=s,
            ppl_mean=ppl_m,
            ppl_std=ppl_s,
            below_unigram=unigram - m,
            losses=losses,
            # descriptive, not the verdict rule: the same seed means the same batches in every arm
            paired_differences=[r["heldout_loss"] - as_is_by_seed[r["seed"]] for r in rs if r["seed"] in as_is_by_seed],
            accuracy_mean=mean_std([r["heldout_accuracy"] for r in rs])[0],
            start_max_logit_change=max(r["start_max_logit_change"] for r in rs),
            train_seconds_mean=mean_std([r["train_seconds"] for r in rs])[0],
        )
    return rows


def comparisons(state: dict) -> list[dict]:
    """:data:`COMPARISONS` with :func:`~.stats.pooled_verdict` applied (only pairs whose arms both ran)."""
    out = []
    for b, a, question in COMPARISONS:  # an arm a one-layer base lacks has no runs
        la = [r["heldout_loss"] for r in _arm_runs(state, a)]
        lb = [r["heldout_loss"] for r in _arm_runs(state, b)]
        if la and lb:
            out.append({"b": b, "a": a, "question": question, **pooled_verdict(la, lb)})
    return out


def _results_table(state: dict) -> render.Table:
    """The base and the arms (mean ± std over seeds, per-seed losses)."""
    meta, base, unigram = state["meta"], state.get("base") or {}, state["unigram_perplexity"]
    model, base_steps = meta["settings"]["model"], meta["settings"]["base"]["max_steps"]
    rows = []
    if base:
        rows.append(
            [f"base ({base_steps} steps)", base["head_dim"], model["intermediate_size"], f"{base['parameters']:,}", "–"]
            + [
                f"{base['flops']:.3g} (base training)",
                f"{base['heldout_loss']:.4f}",
                f"{base['heldout_perplexity']:.1f}",
            ]
            + [f"{math.log(unigram) - base['heldout_loss']:.3f}", "–", "–"]
        )
    for r in summarise(state):
        rows.append(
            [r["arm"], "not run", *[""] * 9]
            if not r["runs"]
            else [r["arm"], r["layer_head_dims"], r["intermediate_size"], f"{r['parameters']:,}"]
            + [f"{r['extra_parameters']:+,}", f"{r['flops']:.3g} ({r['flops_ratio']:.3f})"]
            + [pm(r["loss_mean"], r["loss_std"], 4), pm(r["ppl_mean"], r["ppl_std"], 1), f"{r['below_unigram']:.3f}"]
            + [", ".join(f"{x:.4f}" for x in r["losses"]), ", ".join(f"{x:+.4f}" for x in r["paired_differences"])]
        )
    header = ["arm", "d_p per layer", "FFN", "parameters", "extra", "continuation FLOPs (× as-is)", "held-out loss"]
    return render.Table([*header, "perplexity", "below unigram", "losses per seed", "− as-is, same seed"], rows)


def write_plots(state: dict, out: Path) -> None:
    """``widening.png`` and, where arms chose their rates, ``learning_rates.png`` in ``out`` (the kit writes
    ``report.md`` and ``results.json``)."""
    plot(state, out / PLOT_FILE)
    if state.get("tuning"):
        fraction = state["meta"]["learning_rate_selection"]["validation_fraction"]
        plot_learning_rates({"models": state["tuning"], "validation_fraction": fraction}, out / "learning_rates.png")


def plot(state: dict, path: Path) -> None:
    """Left: each arm's held-out loss minus the mean of *as-is* (each seed a dot, mean ± std a bar).
    Right: each arm's training loss minus *as-is*'s on the same batches (same seed), mean over seeds."""
    plt = pyplot()
    rows = [r for r in summarise(state) if r["runs"]]
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
        diffs = []  # per seed: the training loss minus as-is's at each step both logged
        for run in _arm_runs(state, r["arm"]):
            if (ref := reference.get(run["seed"])) is not None:
                diffs.append({s: v - ref[s] for s, v in dict(map(tuple, run["train_curve"])).items() if s in ref})
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
    cont, base_recipe, model = settings["continuation"], settings["base"], settings["model"]
    rows, comps = summarise(state), comparisons(state)
    unigram = state["unigram_perplexity"] or math.nan  # none before the base has run
    info, narrow = meta["data_info"], model["hidden_size"] // model["num_attention_heads"]
    setup = [
        f"- data: {Path(settings['data']['corpus']).name}, {info['train_documents']} training "
        f"documents ({info['train_sequences']:,} sequences of n = {meta['n']}), held out: "
        f"{'; '.join(info['heldout_documents'])} ({info['heldout_sequences']:,} "
        f"sequences, every next token scored); WordPiece vocabulary {info['vocab_size']:,}"
        if info
        else f"- data: {Path(settings['data']['corpus']).name} (not prepared yet: the base has not run)",
        f"- base: a causal LM with standard heads, d = {model['hidden_size']}, h = {model['num_attention_heads']}, "
        f"d_p = d/h = {narrow}, {model['num_hidden_layers']} layers, "
        f"FFN {model['intermediate_size']}, dropout {model.get('hidden_dropout_prob', 0.1)}; "
        f"{base_recipe['max_steps']} steps × {base_recipe['batch_size']} sequences, AdamW lr "
        f"{base_recipe['learning_rate']}, warm-up {base_recipe['warmup_ratio']:.0%} then linear decay, seed "
        f"{base_recipe['seed']}",
        f"- every continuation: {cont['max_steps']} more steps × {cont['batch_size']} sequences "
        f"({meta['continuation_tokens']:,} tokens) from the base's weights with a fresh optimizer and the same "
        f"recipe (lr {'each arm its own (below)' if state.get('tuning') else cont['learning_rate']}, warm-up "
        f"{cont['warmup_ratio']:.0%} then linear decay)",
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
    ]
    start = max((r.get("start_max_logit_change", 0.0) for r in rows if r["runs"]), default=0.0)
    verdicts = [
        ("question", "{question}"),
        ("B vs A", "{b} vs {a}"),
        ("mean(A) − mean(B), nats", "{difference:+.4f}"),
        ("threshold", "{threshold:.4f}"),
        ("verdict for B", "**{verdict}**"),
    ]
    main = next((c for c in comps if c["b"] == "wide-all" and c["a"] == "as-is"), None)
    as_is = next((r for r in rows if r["arm"] == "as-is" and r["runs"]), None)
    gain = base and as_is and base["heldout_loss"] - as_is["loss_mean"]
    sentence = (
        main
        and as_is
        and base
        and (
            f"**In one sentence:** widening every layer's heads from d_p = {narrow} to {meta['wide_head_dim']} before "
            f"{cont['max_steps']} more steps gives "
            + {
                "lower loss": "a measurably lower held-out loss than continuing as is",
                "higher loss": "a measurably higher held-out loss than continuing as is",
                "no measurable difference": "no measurable difference in held-out loss from continuing as is",
            }.get(main["verdict"], "an undecided result against continuing as is (one seed)")
            + f" (as-is − wide-all = {main['difference']:+.4f} nats; threshold {main['threshold']:.4f}); the "
            f"continuation itself lowered the loss by {gain:.4f} nats from the base."
        )
    )
    results_note = (
        "Held-out loss per next token (nats) and perplexity, mean ± std over seeds; the unigram reference "
        f"(training-set word frequencies, no context) on the same tokens is ppl {unigram:.1f} (loss "
        f"{math.log(unigram):.4f}), and *below unigram* is its loss minus the model's. FLOPs: training FLOPs of the "
        f"continuation ({meta['continuation_tokens']:,} tokens; `fixedhead.model.sizes.training_flops`)."
    )
    return render.markdown(
        render.Report(
            "Does widening the heads of a trained standard-head model help?",
            [f"{meta['description']}.", render.Figure(PLOT_FILE, "held-out loss per arm and training curves")],
            [
                render.what_was_run(
                    meta,
                    setup,
                    render.Table(
                        ["arm", "what changes at the start"], [[a["name"], a["description"]] for a in meta["arms"]]
                    ),
                    "Every widened starting model computes the base's function: the largest change of any logit on 16 "
                    f"held-out sequences was {start:.1e}.",
                    f"**Verdict rule** (fixed before the run): arm B against arm A is *lower loss* if mean loss(A) − "
                    f"mean loss(B) > {RULE_STDS:g} × the pooled standard deviation √((s_A² + s_B²)/2) over seeds, "
                    f"*higher loss* if it is < −{RULE_STDS:g} × that, and *no measurable difference* otherwise.",
                ),
                render.Section(
                    "Results",
                    [
                        results_note,
                        _results_table(state),
                        "The last column is each seed's loss minus *as-is*'s with the same seed (the same batches): a "
                        "description of the pairs, not part of the verdict rule, which compares the arms' means and "
                        "spreads.",
                    ],
                ),
                state.get("tuning") and selection_markdown(meta["learning_rate_selection"], state["tuning"], "arm"),
                render.Section("Verdicts", [render.Table(verdicts, comps), sentence]),
                render.Section("What is and is not matched", [MATCHED]),
            ],
        )
    )


MATCHED = [
    "- Tokens and steps: every arm trains on the same number of tokens, in the same order for a given seed.",
    "- Parameters: *wide-early* and *wide-late* have exactly the same count; *ffn-matched* differs from "
    "*wide-all* by the few parameters a whole feed-forward unit cannot split (see the table); *as-is* has "
    "the fewest. There is no parameter-matched control for the one-layer arms.",
    "- FLOPs: the widened and ffn-matched arms cost more per token than *as-is*; the ratios are in the "
    "table. They count matrix products only, the output layer over the whole vocabulary included.",
]
