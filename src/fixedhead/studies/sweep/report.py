"""A sweep's report: the markdown (:func:`report_markdown`: references, rates, the paper-claim table, each
experiment's points) and the figures (:func:`write_plots`) of a sweep's state. The claims and their verdict
rule live in :mod:`fixedhead.studies.sweep.claims`."""

from __future__ import annotations

import math
from pathlib import Path

from ...data.glue import majority_class_accuracy
from ...plotting import pyplot, save_figure
from ..kit import render
from ..kit.learning_rate import plot_learning_rates, selection_markdown
from ..kit.stats import pm, rule_text
from .claims import PointStats, claims, collect_points, power_sentence, verdict_rule

#: the figures a sweep's report links, each drawn where the sweep has what it shows
PLOT_FILES = ("heads.png", "params.png", "head_size.png", "finetune_vs_perplexity.png", "learning_rates.png")


def _nats_range(lo: float, hi: float) -> str:
    """``lo``..``hi`` nats below the reference, worded for ranges that are partly or wholly above it."""
    if lo >= 0:
        return f"{lo:.2f}–{hi:.2f} nats below it"
    if hi <= 0:
        return f"{-hi:.2f}–{-lo:.2f} nats above it"
    return f"from {-lo:.2f} nats above it to {hi:.2f} below"


# ------------------------------------------------------------------------------------ plots
_STYLE = {"standard": dict(color="tab:blue", marker="o"), "fixed": dict(color="tab:red", marker="s")}


def _errorbar(ax, pts, xs, what, label, series):
    ys = [q.mean(what) for q in pts]
    es = [q.std(what) if math.isfinite(q.std(what)) else 0.0 for q in pts]
    ax.errorbar(xs, ys, yerr=es, capsize=3, label=label, **_STYLE.get(series, {}))


def _figure(ref):
    """One panel with the unigram reference line (where there is one)."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    if ref:
        ax.axhline(ref, color="gray", linestyle="--", linewidth=1, label=f"unigram guess ({ref:.0f})")
    return fig, ax


def plot_heads(series, path, ref=None, lm="MLM"):
    fig, ax = _figure(ref)
    for kind in ("standard", "fixed"):
        pts = series.get(("heads", kind), [])
        if pts:
            dp = "d/h" if kind == "standard" else f"{pts[0].head_dim}"
            _errorbar(ax, pts, [q.x for q in pts], "ppl", f"{kind} (d_p = {dp})", kind)
    for q in series.get(("heads", "standard"), []):
        ax.annotate(
            f"d_p={q.head_dim}",
            (q.x, q.mean()),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=7,
            color=_STYLE["standard"]["color"],
        )
    ax.set_xscale("log", base=2)
    render.plain_ticks(ax, sorted({q.x for k in ("standard", "fixed") for q in series.get(("heads", k), [])}))
    ax.set_xlabel("number of heads h")
    ax.set_ylabel(f"held-out {lm} perplexity (mean ± std over seeds)")
    ax.set_title("perplexity vs heads at fixed d (paper Fig. 3a)", fontsize=10)
    save_figure(fig, path, [ax])


def plot_params(series, path, ref=None, lm="MLM"):
    fig, ax = _figure(ref)
    for kind in ("standard", "fixed"):
        pts = series.get(("embedding", kind), [])
        if pts:
            _errorbar(ax, pts, [q.params / 1e6 for q in pts], "ppl", f"{kind}", kind)
            for q in pts:
                lab = f"d={q.x}" if kind == "standard" else f"h={q.runs[0]['num_attention_heads']}"
                ax.annotate(lab, (q.params / 1e6, q.mean()), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel(f"parameters (millions, {lm} model)")
    ax.set_ylabel(f"held-out {lm} perplexity")
    ax.set_title("perplexity vs parameters: wider standard vs fixed head at small d (Fig. 1/2)", fontsize=9)
    save_figure(fig, path, [ax])


def plot_head_size(series, path):
    fig, axes = pyplot().subplots(1, 2, figsize=(9, 3.8))
    pts = series.get(("head_size", "fixed"), [])
    if pts:
        _errorbar(axes[0], pts, [q.x for q in pts], "ppl", "perplexity", "fixed")
        if any(q.values("ft") for q in pts):
            _errorbar(axes[1], pts, [q.x for q in pts], "ft", "fine-tuning", "fixed")
    for ax, lab in zip(axes, ("held-out MLM perplexity", "fine-tuning dev score"), strict=True):
        ax.set_xscale("log", base=2)
        render.plain_ticks(ax, [q.x for q in pts])
        ax.set_xlabel("head size d_p")
        ax.set_ylabel(lab)
    fig.suptitle("head size at a fixed number of heads (paper Table 2B)", fontsize=10)
    save_figure(fig, path, axes, legend=False)


def plot_finetune(state, path, task, majority=None, ref=None):
    fig, ax = pyplot().subplots(figsize=(6, 4))
    if majority is not None:
        ax.axhline(majority, color="gray", linestyle=":", linewidth=1, label=f"majority class ({majority:.3f})")
    if ref:
        ax.axvline(ref, color="gray", linestyle="--", linewidth=1, label=f"unigram-guess perplexity ({ref:.0f})")
    for kind in ("standard", "fixed"):
        rs = [r for r in state["runs"].values() if "finetune" in r and r["fixed_head"] == (kind == "fixed")]
        if rs:
            ax.scatter(
                [r["heldout_perplexity"] for r in rs],
                [r["finetune"]["score"] for r in rs],
                label=f"{kind} head size",
                s=18,
                **_STYLE[kind],
            )
    ax.set_xlabel("held-out MLM perplexity of the pretrained checkpoint")
    ax.set_ylabel(f"{task} dev score after fine-tuning")
    ax.set_title("fine-tuning score vs pretraining perplexity (every run)", fontsize=10)
    save_figure(fig, path, [ax])


# ----------------------------------------------------------------------------------- report
def points_table(pts: list[PointStats], xname: str, task: str | None) -> render.Table:
    """One experiment's points; ``task`` None (a sweep without fine-tuning) leaves out its column; the learning
    rate is a column where each model chose its own."""

    def bpc(q: PointStats) -> str:
        text, have = pm(q.mean("bpc"), q.std("bpc"), 3), len(q.values("bpc"))
        if 0 < have < len(q.runs):  # some seeds' results predate bits per character
            return f"{text.removesuffix(' (1 seed)')} ({have} of {len(q.runs)} seeds)"
        return text

    tuned = all("learning_rate" in q.runs[0] for q in pts)
    columns = [
        (xname, lambda q: q.x),
        *((h, lambda q, k=k: q.runs[0][k]) for h, k in (("d", "hidden_size"), ("h", "num_attention_heads"))),
        ("d_p", lambda q: q.runs[0]["head_dim"]),
        ("params", lambda q: f"{q.params / 1e6:.3f}M"),
        *([("lr", lambda q: f"{q.runs[0]['learning_rate']:g}")] if tuned else []),  # each model's own rate
        ("seeds", lambda q: len(q.runs)),
        ("held-out perplexity", lambda q: pm(q.mean(), q.std())),
        ("bits/char", bpc),
        *([(f"{task} dev", lambda q: pm(q.mean("ft"), q.std("ft"), 4))] if task else []),
        ("run", lambda q: f"`{q.key}`"),
    ]
    return render.Table(columns, pts)


def _majority_rate(meta: dict, task: str) -> float | None:
    """The majority-class dev accuracy the sweep recorded, else read from the dev labels now (None where absent:
    the report omits it)."""
    if "majority_class_accuracy" in meta:
        return meta["majority_class_accuracy"]
    try:
        return majority_class_accuracy(task)
    except FileNotFoundError:
        return None


def write_plots(state: dict, out: Path) -> None:
    """The sweep's figures in ``out``: each experiment's and fine-tuning's where the sweep has them, and the
    rate each model chose where it chose one (:data:`PLOT_FILES`)."""
    meta = state["meta"]
    causal = meta.get("objective") == "clm" or (meta.get("train") or {}).get("objective") == "clm"
    task, uni = meta.get("finetune_task") or "sst2", meta.get("unigram_perplexity")
    series, lm = collect_points(state), "causal-LM" if causal else "MLM"
    if any(series.get(("heads", kind)) for kind in ("standard", "fixed")):
        plot_heads(series, out / "heads.png", uni, lm)
    if any(series.get(("embedding", kind)) for kind in ("standard", "fixed")):
        plot_params(series, out / "params.png", uni, lm)
    if series.get(("head_size", "fixed")):
        plot_head_size(series, out / "head_size.png")
    if any("finetune" in r for r in state["runs"].values()):
        plot_finetune(state, out / "finetune_vs_perplexity.png", task, _majority_rate(meta, task), uni)
    if tuning := state.get("tuning"):
        fraction = meta["learning_rate_selection"]["validation_fraction"]
        plot_learning_rates({"models": tuning, "validation_fraction": fraction}, out / "learning_rates.png")


def report_markdown(state: dict) -> str:
    """The sweep's report: what was run, the references (unigram guess, majority class), the rates chosen, the
    paper-claim table and each experiment's points."""
    meta = state["meta"]
    causal = (meta.get("objective") or (meta.get("train") or {}).get("objective")) == "clm"
    task = meta.get("finetune_task") or "sst2"
    series = collect_points(state)
    uni = meta.get("unigram_perplexity")  # the unigram guess's perplexity: the plots' and the text's reference
    ft_runs = [r for r in state["runs"].values() if "finetune" in r]
    d, tr, ft = meta["data"], meta["train"], meta.get("finetune") or {}
    info = meta.get("data_info", {})
    setup = [
        f"- pretraining data: `{Path(d['corpus']).name}`, {info.get('documents')} documents, split by whole "
        f"document; {info.get('train_sequences', 0):,} training sequences of n={d['max_seq_length']} tokens "
        f"available, held-out: {len(info.get('heldout_documents', []))} books "
        f"({info.get('heldout_sequences', 0):,} sequences, "
        + ("every next token scored)" if causal else "scored with one fixed 15% masking)"),
        f"- tokenizer: WordPiece, vocabulary {info.get('vocab_size')}",
        f"- pretraining per run: {tr['max_steps']} steps × batch {tr['batch_size']} × {d['max_seq_length']} "
        f"tokens = {tr['max_steps'] * tr['batch_size'] * d['max_seq_length']:,} tokens, AdamW lr "
        + ("each model's own (below)" if state.get("tuning") else f"{tr['learning_rate']}")
        + f", warm-up {tr['warmup_ratio']}, {tr.get('lr_scheduler_type', 'linear')} decay, "
        "no dropout" + ("" if causal else f", {100 * tr.get('mlm_probability', 0.15):g}% of training tokens masked"),
        f"- objective: {'causal LM (FixedHeadForCausalLM, every next token predicted)' if causal else 'masked LM'}",
        f"- seeds: {meta['seeds']} (seed changes initialisation and data order; data split and held-out "
        f"scoring are fixed)",
    ]
    if ft:
        first = "" if ft.get("max_dev_examples") is None else f", first {ft['max_dev_examples']} dev examples"
        setup.append(
            f"- fine-tuning per run: GLUE {task}, {ft['max_train_examples']} training examples, "
            f"{ft['validation_size']} carved out of GLUE train for early stopping (every {ft['eval_steps']} "
            f"steps, patience {ft['patience']}, best checkpoint), ≤ {ft['max_steps']} steps × batch "
            f"{ft['batch_size']}, max length {ft['max_seq_length']}, lr {ft['learning_rate']}; score = GLUE "
            f"dev {task} (the test set here){first}"
        )
    scores = (
        f"Perplexity = exp(mean {'next-token' if causal else 'masked-token'} cross-entropy) on the held-out books; "
        "lower is better. Bits/char = the same cross-entropy in bits, summed, per character of the "
        + (
            "held-out text: it does not depend on the tokenizer. "
            if causal
            else "masked tokens’ text: it depends on the tokenizer only through which text is masked. "
        )
        + "Values are mean ± sample std over seeds."
    )
    unigram = None
    if uni:
        ppls = [r["heldout_perplexity"] for r in state["runs"].values()]
        unigram = (
            f"**Reference: a context-free unigram guess scores perplexity {uni:.1f}** on the same "
            f"{'next' if causal else 'masked'} tokens; the models here score {min(ppls):.1f}–{max(ppls):.1f}, "
            + _nats_range(math.log(uni / max(ppls)), math.log(uni / min(ppls)))
            + f" ({sum(p > uni for p in ppls)} of {len(ppls)} runs are above it). "
            + (
                "At this budget the models have learnt little beyond word frequencies, so there is little "
                "that attention, and so its head size, can show."
                if min(ppls) > 0.75 * uni
                else "The models use context well beyond word frequencies."
            )
        )
    majority, stuck_text = _majority_rate(meta, task), None
    if majority is not None and ft_runs and ft.get("max_dev_examples") is None:
        stuck = [r for r in ft_runs if abs(r["finetune"]["dev"].get("accuracy", -1) - majority) < 1e-9]
        stuck_text = (
            f"**Fine-tuning:** always answering the majority class scores {majority:.4f} on {task} dev; "
            f"{len(stuck)} of {len(ft_runs)} fine-tuning runs ended exactly there (the classifier never left "
            f"the majority class within its budget)"
            + (", which makes the fine-tuning column mostly noise. " if 2 * len(stuck) > len(ft_runs) else ". ")
            + f"The best run scores {max(r['finetune']['score'] for r in ft_runs):.4f}."
        )
    rule = (
        f"Verdict rule, recorded before training: {rule_text(verdict_rule(state))}; a significant difference in the "
        "paper's direction = agrees, in the other direction = does not agree, otherwise cannot tell at this scale. "
        + power_sentence(state)
    )
    table_task = task if ft_runs else None
    experiments = []
    for experiment, xname, title, figure in EXPERIMENTS:
        parts = [(kind, series[(experiment, kind)]) for kind in ("standard", "fixed") if series.get((experiment, kind))]
        blocks = [b for kind, pts in parts for b in (f"**{kind}**", points_table(pts, xname, table_task))]
        experiments.append(parts and render.Section(title, [figure, *blocks]))
    head_size = series.get(("head_size", "fixed"))
    return render.markdown(
        render.Report(
            f"Sweep report: {meta['preset']}{' (--quick)' if meta.get('quick') else ''}",
            [f"{meta['description']}."],
            [
                render.what_was_run(
                    meta,
                    setup,
                    scores,
                    unigram,
                    stuck_text,
                    several=" (workers sharing the plan, or resumed invocations)",
                    work="training + fine-tuning" if ft_runs else "training",
                    on="on ",
                    per_process=" per process",
                ),
                state.get("tuning") and selection_markdown(meta["learning_rate_selection"], state["tuning"]),
                render.Section(
                    "Paper claim → our measurement",
                    [
                        rule,
                        render.Table(
                            ["paper claim", "our measurement", "verdict"],
                            [[c, m, f"**{v}**"] for c, m, v in claims(state)],
                        ),
                    ],
                ),
                *experiments,
                head_size
                and render.Section(
                    "Head size at a fixed number of heads (paper Table 2B)",
                    ["![head size](head_size.png)", points_table(head_size, "d_p", table_task)],
                ),
                ft_runs
                and render.Section(
                    "Fine-tuning score against pretraining perplexity",
                    ["![fine-tuning vs perplexity](finetune_vs_perplexity.png)"],
                ),
            ],
        )
    )


#: each experiment's section: (experiment, its x, the title, the figure)
EXPERIMENTS = (
    ("heads", "h", "Heads at fixed hidden size (paper Fig. 3a)", "![perplexity vs heads](heads.png)"),
    (
        "embedding",
        "d",
        "Embedding size against parameter count (paper Fig. 1 and 2)",
        "![perplexity vs parameters](params.png)",
    ),
)
