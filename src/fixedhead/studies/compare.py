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
``benchmarks/bench_tokens_to_quality.py``); ``tiny`` a seconds-long smoke test. A causal LM is
used by default because on a CPU budget it is the objective that leaves the word-frequency plateau
(docs/performance.md, "Tokens to quality").
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..data import DEFAULT_CORPUS, DataSettings, prepare_data
from ..data.lm import unigram_perplexity
from ..model.configuration import FixedHeadConfig
from ..model.modeling import count_parameters
from ..plotting import pyplot, save_figure
from ..runs import METRICS_FILE, PRETRAIN_FILE, environment_info, load_json_file, staged_outputs
from ..theory import causal_threshold
from ..training.pretrain import (
    TrainSettings,
    data_differences,
    lm_config,
    pretrain,
    run_settings_record,
    same_run_settings,
)


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


def _common(n: int) -> dict:
    return dict(
        num_hidden_layers=2,
        intermediate_size=512,
        max_position_embeddings=n,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _models(common: dict, fixed_head_dim: int) -> dict[str, dict]:
    return {
        "standard": dict(common, hidden_size=128, num_attention_heads=16, head_dim=None),
        "fixed": dict(common, hidden_size=128, num_attention_heads=16, head_dim=fixed_head_dim),
        "standard-wide": dict(common, hidden_size=128, num_attention_heads=16, head_dim=None),
    }


def _cpu_preset(steps=700, batch=32) -> ComparePreset:
    """``make run``: causal LMs at n = 64 (a causal LM learns from every token, so on a CPU budget
    it leaves the word-frequency plateau where a masked LM does not; see docs/performance.md)."""
    n = 64
    return ComparePreset(
        description=f"causal LMs, d=128, 16 heads, n={n}: standard d_p=8 vs fixed d_p=32 (the causal threshold "
        f"ceil((n-1)/2)) vs a parameter-matched wider standard model; 2 layers, Gutenberg books",
        # 100k held-out tokens: a causal model scores every one with the full output layer
        data=DataSettings(corpus=str(DEFAULT_CORPUS), vocab_size=8192, max_seq_length=n, max_eval_tokens=100_000),
        train=TrainSettings(
            objective="clm",
            batch_size=batch,
            max_steps=steps,
            # at 2e-3 the standard model learns faster but the fixed one falls behind it from the
            # first evaluation (docs/experiments.md, causal section); at 1e-3 they track each other
            learning_rate=1e-3,
            eval_steps=max(1, steps // 4),
            save_steps=steps // 2,  # an interrupted model resumes from its halfway checkpoint
        ),
        models=_models(_common(n), causal_threshold(n)),
        widen="standard-wide",
        match_to="fixed",
    )


def _cpu_mlm_preset(steps=2800, batch=32) -> ComparePreset:
    """The masked comparison: the sizes of ``make run`` before it became causal (n = 32, fixed d_p =
    n), trained with the masked-LM recipe of benchmarks/bench_tokens_to_quality.py: 40% of the
    training tokens masked, batch 32, lr 2e-3 (held-out scoring masks 15%)."""
    n = 32
    return ComparePreset(
        description=f"masked LMs, d=128, 16 heads, n={n}: standard d_p=8 vs fixed d_p=n=32 vs a parameter-matched "
        f"wider standard model; 40% masking, batch 32; 2 layers, Gutenberg books",
        data=DataSettings(corpus=str(DEFAULT_CORPUS), vocab_size=8192, max_seq_length=n, max_eval_tokens=200_000),
        train=TrainSettings(
            batch_size=batch,
            max_steps=steps,
            learning_rate=2e-3,
            mlm_probability=0.4,
            eval_steps=max(1, steps // 7),
            save_steps=steps // 2,  # an interrupted model resumes from its halfway checkpoint
        ),
        models=_models(_common(n), n),
        widen="standard-wide",
        match_to="fixed",
    )


def _tiny_preset() -> ComparePreset:
    common = dict(
        num_hidden_layers=1,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ComparePreset(
        description="a seconds-long smoke test: d=32, 8 heads (d_p=4) vs fixed d_p=16",
        data=DataSettings(
            corpus=str(DEFAULT_CORPUS),
            vocab_size=500,
            max_seq_length=32,
            max_train_tokens=40_000,
            max_eval_tokens=4_000,
            tokenizer_max_chars=300_000,
        ),
        train=TrainSettings(
            batch_size=16, max_steps=20, learning_rate=2e-3, logging_steps=5, eval_steps=10, save_steps=20
        ),
        models={
            "standard": dict(common, hidden_size=32, num_attention_heads=8, head_dim=None),
            "fixed": dict(common, hidden_size=32, num_attention_heads=8, head_dim=16),
            "standard-wide": dict(common, hidden_size=32, num_attention_heads=8, head_dim=None),
        },
        widen="standard-wide",
        match_to="fixed",
    )


COMPARE_PRESETS = {"cpu": _cpu_preset, "cpu-mlm": _cpu_mlm_preset, "tiny": _tiny_preset}


def get_compare_preset(name: str) -> ComparePreset:
    """Raises ValueError listing the known preset names."""
    from ..model.paper_presets import lookup

    return lookup(COMPARE_PRESETS, name, "compare")()


def match_hidden_size(base: dict, target_params: int, vocab_size: int, step: int | None = None) -> int:
    """Smallest standard hidden size (a multiple of the head count, FFN kept at 4·d) whose parameter
    count reaches ``target_params`` (counted without pooler, as the MLM model has none)."""
    heads = base["num_attention_heads"]
    step = step or heads
    d = base["hidden_size"]
    while True:
        cfg = FixedHeadConfig(**{**base, "hidden_size": d, "intermediate_size": 4 * d, "vocab_size": vocab_size})
        if count_parameters(cfg, pooler=False) >= target_params or d > 64 * base["hidden_size"]:
            return d
        d += step


def run_compare(
    preset: str | ComparePreset = "cpu",
    output_dir: str | Path = "runs/compare",
    corpus: str | None = None,
    max_steps: int | None = None,
    learning_rate: float | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    overwrite: bool = False,
    cache_dir=None,
    progress: bool = True,
    objective: str | None = None,
) -> list[dict]:
    """Train and score every model of a compare preset; write results.json/.csv and learning_curves.png.

    Models whose run directory already holds finished metrics with the same settings are not
    retrained (an interrupted compare resumes where it stopped).

    Returns:
        one result dict per model (see :func:`fixedhead.training.pretrain`), in preset order.

    Raises:
        FileNotFoundError: the corpus is missing (the message says how to pass another).
        FileExistsError: ``output_dir`` holds runs with other settings (without ``overwrite``).
    """
    p = get_compare_preset(preset) if isinstance(preset, str) else preset
    data_settings = replace(p.data, corpus=corpus) if corpus else p.data
    train = p.train
    train = replace(train, max_steps=max_steps) if max_steps is not None else train  # validated by TrainSettings
    train = replace(train, batch_size=batch_size) if batch_size is not None else train
    train = replace(train, seed=seed) if seed is not None else train
    train = replace(train, learning_rate=learning_rate) if learning_rate is not None else train
    description = p.description
    if objective is not None and objective != train.objective:  # the masking rate is the masked objective's
        description += f" (trained as {objective} instead of the preset's {train.objective}: same sizes and recipe)"
        train = replace(train, objective=objective, mlm_probability=0.15)
    train = replace(train, progress=progress)
    out = Path(output_dir)
    check_compare_dir(out, list(p.models))
    t_start = time.time()
    data = prepare_data(data_settings, cache_dir=cache_dir, progress=progress)
    out.mkdir(parents=True, exist_ok=True)  # only once the data is good: a bad corpus leaves nothing behind
    vocab = len(data.tokenizer)

    configs = {name: dict(fields) for name, fields in p.models.items()}
    if p.widen and p.match_to:
        target = count_parameters(FixedHeadConfig(**configs[p.match_to], vocab_size=vocab), pooler=False)
        d = match_hidden_size(configs[p.widen], target, vocab)
        configs[p.widen].update(hidden_size=d, intermediate_size=4 * d)

    results = []
    for i, (name, fields) in enumerate(configs.items(), 1):
        config = FixedHeadConfig(**fields, vocab_size=vocab, pad_token_id=data.tokenizer.pad_token_id)
        run_dir = out / name
        if progress:
            print(
                f"\n[{i}/{len(configs)}] {name}: d={config.hidden_size}, h={config.num_attention_heads}, "
                f"d_p={config.head_size_label} ({'fixed' if config.is_fixed_head else 'standard'}), "
                f"{count_parameters(config, pooler=False):,} parameters, {train.max_steps} steps",
                flush=True,
            )
        results.append(train_or_reuse(config, data, run_dir, train, data_settings, overwrite, progress))
    if train.objective == "clm":  # what a causal model says: the sensible-output check of the README
        for r in results:
            r["samples"] = continuations(out / r["name"], seed=train.seed)
    meta = {
        "preset": preset if isinstance(preset, str) else "custom",
        "objective": train.objective,
        # the context-free reference on the same held-out tokens: how far below it the models are is
        # how much they learnt beyond word frequencies (see unigram_perplexity)
        "unigram_perplexity": unigram_perplexity(data, train.eval_seed, train.objective),
        "description": description,
        "data": asdict(data_settings),
        "data_info": data.info,
        "train": asdict(train),
        "total_seconds": round(time.time() - t_start, 1),
        **environment_info(),
    }
    write_results(results, out, meta)
    if progress:
        print()
        print(format_table(results, meta["unigram_perplexity"]))
        for r in results:
            for prompt, text in r.get("samples", {}).items():
                print(f"{r['name']:>14}: {prompt} | {text}")
        print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {out / 'learning_curves.png'}")
    return results


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


_COMPARE_FILES = {"results.json", "results.csv", "learning_curves.png"}


def check_compare_dir(out: Path, model_names: list[str]) -> None:
    """Refuse an output directory that holds anything but this job's own files.

    Allowed: a missing or empty directory, or one holding only ``results.*``,
    ``learning_curves.png`` and one subdirectory per model (an earlier or interrupted compare,
    which is then resumed). Raises FileExistsError naming what is in the way.
    """
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output directory {str(out)!r} is an existing file, not a directory")
    if not out.is_dir():
        return
    foreign = sorted(
        e.name
        for e in out.iterdir()
        if not (
            e.name in _COMPARE_FILES
            or (e.is_dir() and e.name in model_names)
            or any(e.name.startswith(f".{f}.") for f in _COMPARE_FILES)
        )  # a staged write cut short
    )
    if foreign:
        raise FileExistsError(
            f"{out} holds files that are not this compare's ({', '.join(foreign[:5])}"
            f"{' …' if len(foreign) > 5 else ''}); choose another --output-dir"
        )


def train_or_reuse(
    config,
    data,
    run_dir: Path,
    train: TrainSettings,
    data_settings: DataSettings,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Pretrain one model into ``run_dir``, or return its metrics if it already finished there.

    A run counts as finished when ``metrics.json`` exists and ``pretrain_settings.json`` records
    the same config, training and data settings; an unfinished run continues from its newest
    checkpoint (if any). This is what makes compare runs and sweeps resumable.
    """
    lm_config(config, data.tokenizer, train.objective)  # as pretrain fills it in, so fingerprints compare equal
    done = run_dir / METRICS_FILE
    if done.is_file() and not overwrite and _same_run(run_dir, config, train, data_settings, data.info):
        if progress:
            print(f"  already finished in {run_dir}; reusing its metrics", flush=True)
        return load_json_file(done)
    resume = not overwrite and (run_dir / PRETRAIN_FILE).is_file()  # an interrupted run continues
    return pretrain(config, data, run_dir, train, resume=resume, overwrite=overwrite)


def _same_run(run_dir: Path, config, train, data_settings, data_info: dict) -> bool:
    """Same config, training and data settings, the same corpus text (not just its path) and the
    same tokenizer (:func:`~fixedhead.training.pretrain.data_differences`)."""
    settings_file = run_dir / PRETRAIN_FILE
    if not settings_file.is_file():
        return False
    try:
        saved = load_json_file(settings_file)
    except ValueError:
        return False  # unreadable: retrain rather than trust it
    return same_run_settings(saved, run_settings_record(config, train, data_settings)) and not data_differences(
        run_dir, saved, data_info
    )


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


def _cell(r: dict, key: str, fmt: str) -> str:
    value = r.get(key) if key in OPTIONAL_COLUMNS else r[key]
    return "-" if value is None else fmt.format(value)


def format_table(results: list[dict], unigram_perplexity: float | None = None) -> str:
    """A plain-text table of the comparison (one row per model); with the unigram reference, a column
    of how far below it each model's held-out loss is (nats) and a closing line naming it."""
    import math

    columns = list(TABLE_COLUMNS)
    results = [dict(r) for r in results]
    if unigram_perplexity:
        columns.insert(-1, ("below_unigram", "below unigram", "{:.2f}"))
        for r in results:
            r["below_unigram"] = math.log(unigram_perplexity) - r["heldout_loss"]
    rows = [[_cell(r, key, fmt) for key, _, fmt in columns] for r in results]
    headers = [h for _, h, _ in columns]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    lines = [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]
    if unigram_perplexity:
        objective = results[0].get("objective", "mlm") if results else "mlm"
        scored = "masked tokens" if objective == "mlm" else "next tokens"
        lines.append(
            f"unigram reference (training-set word frequencies, no context) on the same held-out {scored}: "
            f"ppl {unigram_perplexity:.1f}; 'below unigram' is its log minus the model's loss, in nats"
        )
    return "\n".join(lines)


def write_results(results: list[dict], out: Path, meta: dict) -> None:
    """results.json (everything, curves included), results.csv (the table) and learning_curves.png,
    written together or not at all (see :func:`fixedhead.runs.staged_outputs`)."""
    with staged_outputs(out) as stage:
        stage("results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
        with open(stage("results.csv"), "w", newline="") as f:
            w = csv.writer(f)
            keys = [k for k, _, _ in TABLE_COLUMNS] + ["heldout_loss", "fixed_head", "num_hidden_layers"]
            w.writerow(keys)
            for r in results:
                w.writerow([r.get(k) if k in OPTIONAL_COLUMNS else r[k] for k in keys])
        plot_learning_curves(results, stage("learning_curves.png"), meta.get("description", ""))


def plot_learning_curves(results: list[dict], path: Path, title: str = "") -> None:
    """Training loss and held-out loss (fixed masking) against training tokens, one colour per model."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for r in results:
        tokens_per_step = r["tokens_per_step"]
        label = (
            f"{r['name']} (d={r['hidden_size']}, h={r['num_attention_heads']}, d_p={r['head_dim']}, "
            f"{r['parameters'] / 1e6:.2f}M)"
        )
        for ax, curve in ((axes[0], r["train_curve"]), (axes[1], r["eval_curve"])):
            if curve:
                steps, losses = zip(*curve, strict=True)
                ax.plot(
                    [s * tokens_per_step / 1e6 for s in steps],
                    losses,
                    marker="." if ax is axes[1] else None,
                    label=label,
                )
    causal = any(r.get("objective") == "clm" for r in results)
    what = "causal-LM loss per token" if causal else "MLM loss"
    axes[0].set_title(f"training {what}")
    axes[1].set_title(f"held-out {what}" + ("" if causal else " (fixed masking)"))
    for ax in axes:
        ax.set_xlabel("training tokens (millions)")
    axes[0].set_ylabel("cross-entropy (nats)")
    if title:
        import textwrap

        fig.suptitle("\n".join(textwrap.wrap(title, 140)), fontsize=9)
    axes[0].grid(alpha=0.3)
    save_figure(fig, path, [axes[1]])  # one legend, on the held-out panel
