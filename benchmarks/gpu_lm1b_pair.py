#!/usr/bin/env python
"""LM1B-style pair on one GPU: standard heads (h = 32, d_p = 8) against the paper's fixed head size
(h = 32, d_p = 32) at d = 256, n = 128, causal LM (the paper's Fig. 3a setting,
``lm1b-standard-d256-h32`` and ``lm1b-fixed-d256-h32-dp32``: 6 layers, FFN 1024), paired by seed,
each model at its own learning rate, with the rank intervention on every model it reports.

The study, in the order it runs (runs side by side as worker processes, ``--workers`` at a time):

1. **Rates.** Each model trains with the first seed at every rate of ``--learning-rates`` on the
   training split minus a validation split (5% of the training documents), and takes the rate with the
   lowest validation loss (:mod:`fixedhead.studies.kit.learning_rate`); a best rate at an edge of the grid
   adds one factor-2 step past it (once; the summary says when the optimum stays unbracketed).
2. **Seeds.** Every further seed trains at its model's rate. A seed gives both models the same
   batches in the same order, so the head-size gap (fixed − standard held-out loss) is paired by seed:
   mean, 95% t-interval, paired t-test, and the word :func:`fixedhead.studies.kit.stats.difference_word`
   gives it against ``--target`` nats.
3. **Rank intervention** (:func:`fixedhead.diagnostics.intervention.run_rank_curve`, all layers together) on each
   reported model: held-out loss when every head's logits are cut to rank k, k = 0 (uniform attention)
   to d_p, and the attention gain (uniform − full).

Every model trains on the same tokenizer, packed sequences and step budget and is scored on the same
held-out next tokens (the four held-out books); nothing is committed but the summary.
Prepared to fit about 8 minutes of an H100/H200-class GPU (data preparation included); on a CPU use
``--max-steps 3 --max-eval-tokens 5000 --seeds 0 1 --learning-rates 1e-3 2e-3`` to check it works.

Usage:
    python benchmarks/gpu_lm1b_pair.py --corpus ../shared/data/pretrain/gutenberg_en_books.jsonl.gz \
        --output-dir runs/gpu-lm1b-pair [--max-steps 2000] [--batch-size 64] [--seeds 0 1 2 3 4 5]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

MODELS = {"standard (d_p=8)": "lm1b-standard-d256-h32", "fixed (d_p=32)": "lm1b-fixed-d256-h32-dp32"}
SEQ = 128


def _settings(args, cuda: bool):
    from fixedhead.data import DataSettings
    from fixedhead.studies.kit.learning_rate import with_validation_split
    from fixedhead.training.pretrain import TrainSettings

    data = with_validation_split(
        DataSettings(
            corpus=args.corpus,
            vocab_size=args.vocab_size,
            max_seq_length=SEQ,
            max_train_tokens=args.max_steps * args.batch_size * SEQ + 1,
            max_eval_tokens=args.max_eval_tokens,
        )
    )
    train = TrainSettings(
        objective="clm",
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=1e-3,
        warmup_ratio=0.06,
        eval_steps=max(1, args.max_steps // 4),
        save_steps=args.max_steps,
        logging_steps=max(1, args.max_steps // 20),
        report_to=[],
        bf16=cuda,
        progress=False,
    )
    return data, train


_DATA = {}


def _init_worker(data) -> None:
    """Each worker process receives the prepared data once (tokenising it again costs ~30 s a process)."""
    import torch

    torch.set_num_threads(1)
    _DATA["data"] = data


def job(preset: str, seed: int, lr: float, run_dir: str, train_settings, intervene: dict | None) -> dict:
    """One worker's run: train (or reuse a finished run) and, with ``intervene``, the rank intervention."""
    import torch

    from fixedhead.diagnostics.intervention import run_rank_curve
    from fixedhead.model.paper_presets import get_preset
    from fixedhead.training.pretrain import train_or_reuse

    t0 = time.time()
    data = _DATA["data"]
    config = get_preset(preset).build_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config.vocab_size = len(data.tokenizer)
    r = train_or_reuse(config, data, run_dir, replace(train_settings, seed=seed, learning_rate=lr))
    out = {
        "preset": preset,
        "seed": seed,
        "learning_rate": lr,
        "heldout_loss": r["heldout_loss"],
        "validation_loss": r.get("validation_loss"),
        "parameters": r["parameters"],
        "training_tokens": r["training_tokens"],
        "train_seconds": time.time() - t0,
    }
    if intervene is not None:
        t1 = time.time()
        try:
            curve = run_rank_curve(
                run_dir,
                progress=False,
                per_layer=False,
                device="cuda" if torch.cuda.is_available() else "cpu",
                **intervene,
            )
            out["intervention"] = {
                k: curve[k] for k in ("full", "uniform", "attention_gain", "head_dims", "ranks", "scored_tokens")
            }
            out["intervention"]["all_layers"] = {str(k): v for k, v in curve["curves"]["all"].items()}
        except Exception as e:  # the trained model's result is kept; the failure is reported
            out["intervention_error"] = f"{type(e).__name__}: {e}"
        out["intervention_seconds"] = time.time() - t1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from fixedhead.data import DEFAULT_CORPUS

    p.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    p.add_argument("--output-dir", default="runs/gpu-lm1b-pair")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--learning-rates", type=float, nargs="+", default=[5e-4, 1e-3, 2e-3, 4e-3])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    p.add_argument(
        "--chosen-rates",
        type=float,
        nargs=2,
        metavar=("STANDARD", "FIXED"),
        help="continue a study: train --seeds at these rates (the ones its rate phase chose) with no rate phase; "
        "--from-log on both studies' runs.jsonl together then summarises all seeds",
    )
    p.add_argument("--vocab-size", type=int, default=32000, help="the paper's LM1B sub-word vocabulary (32k)")
    p.add_argument("--max-eval-tokens", type=int, default=500_000)
    p.add_argument(
        "--intervention-tokens", type=int, default=32_768, help="held-out tokens the rank intervention scores"
    )
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--target", type=float, default=0.02, help="nats: the smallest gap of interest")
    p.add_argument("--workers", type=int, default=16, help="runs side by side")
    p.add_argument(
        "--extend-before", type=float, default=300.0, help="seconds: extend an unbracketed grid only before this"
    )
    p.add_argument("--from-log", help="print the summary of a finished (or cut short) study from its runs.jsonl")
    args = p.parse_args(argv)
    if args.from_log:
        rows = [json.loads(line) for line in Path(args.from_log).read_text().splitlines() if line.strip()]
        print(summarise(rows, args.seeds, args.target)["text"])
        return 0

    import torch

    from fixedhead.data import prepare_data
    from fixedhead.data.lm import unigram_perplexity
    from fixedhead.runs import environment_info
    from fixedhead.studies.kit.learning_rate import best_rate, next_rate

    cuda = torch.cuda.is_available()
    t_start = time.time()
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"device: {torch.cuda.get_device_name(0) if cuda else 'CPU (no CUDA)'}; torch {torch.__version__}", flush=True
    )
    data_settings, train_settings = _settings(args, cuda)
    data = prepare_data(data_settings)  # fills the tokenizer cache before the workers start
    unigram = unigram_perplexity(data, 1234, "clm")
    print(f"data ready in {time.time() - t_start:.0f} s; unigram reference ppl {unigram:.1f}", flush=True)
    log = out_dir / "runs.jsonl"
    results: dict[tuple, dict] = {}
    first = args.seeds[0]
    intervene = {"max_eval_tokens": args.intervention_tokens, "ranks": args.ranks}

    def run_all(specs):
        """specs: (preset, seed, lr, intervene?) run side by side; each result logged as it ends."""
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(
            max_workers=min(args.workers, len(specs)), mp_context=ctx, initializer=_init_worker, initargs=(data,)
        ) as pool:
            futures = {
                pool.submit(
                    job,
                    preset,
                    seed,
                    lr,
                    str(out_dir / f"{preset}-lr{lr:g}-s{seed}"),
                    train_settings,
                    intervene if with_curve else None,
                ): (preset, seed, lr)
                for preset, seed, lr, with_curve in specs
            }
            for f in cf.as_completed(futures):
                r = f.result()
                results[futures[f]] = r
                with log.open("a") as fh:
                    fh.write(json.dumps(r) + "\n")
                extra = ""
                if "intervention" in r:
                    extra = f", attention gain {r['intervention']['attention_gain']:.3f} nats"
                print(
                    f"{r['preset']:>26} seed {r['seed']} lr {r['learning_rate']:g}: validation "
                    f"{r['validation_loss']:.4f}, held-out {r['heldout_loss']:.4f}{extra} "
                    f"({time.time() - t_start:.0f} s since start)",
                    flush=True,
                )

    # 1. each model's rate, chosen with the first seed on the validation split (or given: a study continued)
    if args.chosen_rates:
        grids = {preset: {lr: math.nan} for preset, lr in zip(MODELS.values(), args.chosen_rates, strict=True)}
    else:
        run_all([(preset, first, lr, False) for preset in MODELS.values() for lr in args.learning_rates])
        grids = {
            preset: {lr: results[(preset, first, lr)]["validation_loss"] for lr in args.learning_rates}
            for preset in MODELS.values()
        }
        extra = {preset: next_rate(g) for preset, g in grids.items()}
        if any(lr is not None for lr in extra.values()) and time.time() - t_start < args.extend_before:
            run_all([(preset, first, lr, False) for preset, lr in extra.items() if lr is not None])
            for preset, lr in extra.items():
                if lr is not None:
                    grids[preset][lr] = results[(preset, first, lr)]["validation_loss"]
    chosen = {preset: next(iter(g)) if args.chosen_rates else best_rate(g) for preset, g in grids.items()}
    print("chosen rates: " + ", ".join(f"{p} {lr:g}" for p, lr in chosen.items()), flush=True)

    # 2 and 3. every seed at its model's rate (the first seed's run is reused), each with the intervention
    run_all([(preset, seed, chosen[preset], True) for seed in args.seeds for preset in MODELS.values()])

    summary = summarise(list(results.values()), args.seeds, args.target)
    summary |= {
        "unigram_perplexity": unigram,
        "args": vars(args),
        "environment": environment_info(),
        "bf16": train_settings.bf16,
        "data": data_settings.record(),
    }
    print(
        f"\nunigram reference ppl {unigram:.1f} on the same held-out next tokens; {args.max_steps} steps x "
        f"{args.batch_size} x {SEQ} tokens = {args.max_steps * args.batch_size * SEQ / 1e6:.1f}M tokens per model; "
        f"bf16={train_settings.bf16}"
    )
    print(summary["text"])
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"total {time.time() - t_start:.0f} s")
    return 0


def summarise(rows: list[dict], seeds: list[int] | None = None, target: float = 0.02) -> dict:
    """The study's summary from its per-run records (``runs.jsonl``; a run logged twice counts once,
    the record with the intervention first): each model's rate (lowest validation loss of the first
    seed's grid), held-out loss per seed at that rate, the rank intervention averaged over seeds, and
    the paired head-size gap over the seeds both models finished. ``text`` holds the printed tables."""
    from fixedhead.studies.kit.learning_rate import best_rate, losses_record, next_rate
    from fixedhead.studies.kit.stats import difference_word, mean_std, paired_difference

    runs: dict[tuple, dict] = {}
    for r in rows:
        key = (r["preset"], r["seed"], r["learning_rate"])
        if key not in runs or ("intervention" in r and "intervention" not in runs[key]):
            runs[key] = r
    seeds = seeds or sorted({seed for _, seed, _ in runs})
    first = seeds[0]
    out: dict = {"learning_rate_selection": {}, "models": {}, "seeds": seeds}
    lines = [
        f"{'model':>17}  {'rate':>6}  {'params':>7}  seeds  {'held-out loss (mean ± sd)':>26}  {'ppl':>6}"
        "  attention gain"
    ]
    finished = {}
    for label, preset in MODELS.items():
        grid = {lr: r["validation_loss"] for (p, seed, lr), r in runs.items() if p == preset and seed == first}
        chosen = best_rate(grid)
        out["learning_rate_selection"][preset] = {
            "seed": first,
            "validation_loss": losses_record(grid),
            "chosen": chosen,
            "bracketed": next_rate(grid) is None,
        }
        mine = {seed: runs[(preset, seed, chosen)] for seed in seeds if (preset, seed, chosen) in runs}
        finished[preset] = mine
        losses = [r["heldout_loss"] for r in mine.values()]
        mean, sd = mean_std(losses)
        gains = [r["intervention"]["attention_gain"] for r in mine.values() if "intervention" in r]
        gain = f"{statistics.mean(gains):.3f} nats ({len(gains)} seeds)" if gains else "-"
        lines.append(
            f"{label:>17}  {chosen:6g}  {next(iter(mine.values()))['parameters'] / 1e6:6.2f}M  {len(mine):5d}  "
            f"{mean:17.4f} ± {sd:6.4f}  {math.exp(mean):6.1f}  {gain}"
        )
        out["models"][preset] = {
            "label": label,
            "learning_rate": chosen,
            "heldout_loss": {str(seed): r["heldout_loss"] for seed, r in mine.items()},
            "intervention": {str(seed): r["intervention"] for seed, r in mine.items() if "intervention" in r},
        }
    lines.append("\nrank intervention: every layer's logits cut to rank k (k = 0: uniform attention), held-out loss")
    lines.append("minus the full-rank loss (nats), mean over seeds:")
    ks = sorted({int(k) for m in out["models"].values() for c in m["intervention"].values() for k in c["all_layers"]})
    lines.append(f"{'model':>17}  " + "  ".join(f"{'k=' + str(k):>7}" for k in [0, *ks]) + "  full loss")
    for m in out["models"].values():
        curves = list(m["intervention"].values())
        if not curves:
            continue
        cells = [statistics.mean(c["uniform"] - c["full"] for c in curves)]
        cells += [statistics.mean(c["all_layers"].get(str(k), c["full"]) - c["full"] for c in curves) for k in ks]
        full = statistics.mean(c["full"] for c in curves)
        lines.append(f"{m['label']:>17}  " + "  ".join(f"{v:+7.4f}" for v in cells) + f"  {full:9.4f}")
    standard, fixed = MODELS.values()
    both = [seed for seed in seeds if seed in finished[standard] and seed in finished[fixed]]
    if len(both) >= 2:
        a = [finished[standard][seed]["heldout_loss"] for seed in both]
        b = [finished[fixed][seed]["heldout_loss"] for seed in both]
        d = paired_difference(a, b)
        word = difference_word(d["difference"], d["low"], d["high"], d["p"], target=target)
        out["gap"] = d | {
            "word": word,
            "target": target,
            "seeds": both,
            "per_seed": [y - x for x, y in zip(a, b, strict=True)],
        }
        lines.append(
            f"\nhead-size gap (fixed − standard held-out loss, paired by seed, seeds {both}): "
            f"{d['difference']:+.4f} nats, 95% CI [{d['low']:+.4f}, {d['high']:+.4f}], p = {d['p']:.3g}: {word}"
        )
    missing = [f"{p} seed {seed}" for p in MODELS.values() for seed in seeds if seed not in finished[p]]
    if missing:
        lines.append("not finished: " + ", ".join(missing))
    out["text"] = "\n".join(lines)
    return out


if __name__ == "__main__":
    sys.exit(main())
