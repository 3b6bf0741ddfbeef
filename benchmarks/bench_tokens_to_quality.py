#!/usr/bin/env python
"""Tokens to quality, side by side: how fast does each pretraining recipe leave the word-frequency plateau?

Every row trains a model of the same size (d = 128, 2 layers, 16 heads, FFN 512, n = 32) on the
same tokenizer and packed sequences of the Gutenberg books for the same token budget, and is
scored during training on the same held-out sequences (masked rows: one fixed 15% masking; the
causal row: every next token). The y-axis is **nats below the unigram reference** (the
training-set word frequencies scored on the same held-out tokens, ``unigram_perplexity``): 0 is
the plateau of a model that learnt word frequencies and nothing from context.

Rows (``--rows`` picks some; each row's result is kept in ``OUT/rows/NAME.json`` and reused):

  bert-run_mlm     transformers' BertForMaskedLM with run_mlm.py's defaults: AdamW lr 5e-5,
                   no warm-up, linear decay, no weight decay, betas (0.9, 0.999), batch 8,
                   DataCollatorForLanguageModeling at 15%, BertConfig's dropout 0.1
  pretrain-default our FixedHeadForMaskedLM with `fixedhead pretrain`'s defaults: lr 2e-3,
                   batch 64, warm-up 6%, linear decay, weight decay 0.01, beta2 0.98, no dropout
  recipe           the best masked-LM recipe found here (LEVERS below: 40% masking, batch 32)
  recipe-no-X      the recipe with lever X switched back to pretrain's default
  recipe+X         the recipe with a lever X added that did not help (REJECTED below)
  recipe-fixed     the recipe on the fixed head size d_p = n = 32 (the paper's fix)
  causal           FixedHeadForCausalLM (every token predicted), lr 1e-3, batch 128

Output: ``OUT/tokens_to_quality.md`` (the table: nats below unigram at the end, tokens and
training seconds to reach L nats below unigram, ratios), ``OUT/tokens_to_quality.png`` (held-out
nats below unigram against tokens and against seconds), ``OUT/results.json``.

Seconds are training time only (held-out scoring excluded) on a shared machine: read them as a
rough guide; tokens are exact. Usage:

    python benchmarks/bench_tokens_to_quality.py --output-dir runs/tokens-to-quality [--rows ...]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import TrainerCallback

from fixedhead.data import DEFAULT_CORPUS, DataSettings, prepare_data
from fixedhead.data.lm import SequenceDataset, heldout_batches, unigram_perplexity
from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.training import TrainSettings, evaluate_lm, pretrain

SEQ = 32
MODEL = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=16,
    intermediate_size=512,
    max_position_embeddings=SEQ,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
#: `fixedhead pretrain`'s defaults (cli.add_train_args)
DEFAULT = TrainSettings(batch_size=64, learning_rate=2e-3, warmup_ratio=0.06, weight_decay=0.01, adam_beta2=0.98)
#: the recipe: each entry is one lever, switched back one at a time in the recipe-no-X rows
LEVERS = {
    "mask40": dict(mlm_probability=0.4),  # Wettig et al., EACL 2023
    "batch32": dict(batch_size=32),  # more updates per token
}
#: levers tried on top of the recipe that did not help here (rows recipe+X)
REJECTED = {
    "lr3e-3": dict(learning_rate=3e-3),  # a higher peak rate (Cramming trains small models hot)
}


def recipe_settings(without: str | None = None) -> TrainSettings:
    changes = {}
    for name, lever in LEVERS.items():
        if name != without:
            changes.update(lever)
    return replace(DEFAULT, **changes)


def rows() -> dict[str, dict]:
    """Every row: ``kind`` (bert / ours / causal), its settings and model fields."""
    table = {
        "bert-run_mlm": dict(kind="bert"),
        "pretrain-default": dict(kind="ours", settings=DEFAULT, model={}),
        "recipe": dict(kind="ours", settings=recipe_settings(), model={}),
        "recipe-fixed": dict(kind="ours", settings=recipe_settings(), model={"head_dim": SEQ}),
        "causal": dict(
            kind="ours",
            settings=replace(DEFAULT, objective="clm", learning_rate=1e-3, batch_size=128),
            model={},
        ),
    }
    for name in LEVERS:
        table[f"recipe-no-{name}"] = dict(kind="ours", settings=recipe_settings(without=name), model={})
    for name, lever in REJECTED.items():
        table[f"recipe+{name}"] = dict(kind="ours", settings=replace(recipe_settings(), **lever), model={})
    return table


class HeldOutTimer(TrainerCallback):
    """Scores the model on the held-out batches every ``every_tokens`` (and at the last step) and
    records (tokens, training seconds, held-out loss); scoring time is not counted as training."""

    def __init__(self, ids, labels, objective, tokens_per_step, every_tokens, budget_tokens):
        self.ids, self.labels, self.objective = ids, labels, objective
        self.tokens_per_step = tokens_per_step
        self.every = max(1, round(every_tokens / tokens_per_step))
        self.last = max(1, budget_tokens // tokens_per_step)
        self.points: list[tuple[int, float, float]] = []
        self.t0, self.scoring = None, 0.0

    def on_train_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kw):
        step = state.global_step
        if step % self.every and step != self.last:
            return
        t = time.perf_counter()
        train_seconds = t - self.t0 - self.scoring
        loss = evaluate_lm(model, self.ids, self.labels, objective=self.objective)["loss"]
        self.scoring += time.perf_counter() - t
        self.points.append((step * self.tokens_per_step, round(train_seconds, 2), loss))


def train_bert(data, budget, timer, out: Path, seed: int) -> None:
    """transformers' own BERT and Trainer with run_mlm.py's defaults (see the module docstring)."""
    from transformers import BertConfig, BertForMaskedLM, Trainer, TrainingArguments

    from fixedhead.data.lm import TrainOrFixedCollator

    config = BertConfig(
        vocab_size=len(data.tokenizer),
        hidden_size=MODEL["hidden_size"],
        num_hidden_layers=MODEL["num_hidden_layers"],
        num_attention_heads=MODEL["num_attention_heads"],
        intermediate_size=MODEL["intermediate_size"],
        max_position_embeddings=SEQ,
        pad_token_id=data.tokenizer.pad_token_id,
    )  # BertConfig's dropout 0.1, as run_mlm's from-scratch model
    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    batch = 8
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=batch,
        max_steps=budget // (batch * SEQ),
        learning_rate=5e-5,
        seed=seed,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=SequenceDataset(data.train),
        data_collator=TrainOrFixedCollator(data.tokenizer, 0.15, seed=seed),  # DataCollatorForLanguageModeling
        callbacks=[timer],
    )
    trainer.train()


def run_row(name: str, spec: dict, data, unigram: dict, budget: int, every: int, out: Path, seed: int) -> dict:
    objective = "mlm" if spec["kind"] == "bert" else spec["settings"].objective
    ids, labels = heldout_batches(data.heldout, data.tokenizer, objective, 1234)
    if spec["kind"] == "bert":
        batch, settings_record = 8, "run_mlm defaults (see the module docstring)"
    else:
        batch = spec["settings"].batch_size
    timer = HeldOutTimer(ids, labels, objective, batch * SEQ, every, budget)
    t0 = time.time()
    if spec["kind"] == "bert":
        train_bert(data, budget, timer, out / "runs" / name, seed)
        head_dim = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    else:
        settings = replace(
            spec["settings"],
            max_steps=budget // (batch * SEQ),
            seed=seed,
            eval_steps=10**6,
            save_steps=10**6,
            logging_steps=50,
            report_to=[],
            progress=False,
        )
        config = FixedHeadConfig(**MODEL, **spec["model"])
        pretrain(config, data, out / "runs" / name, settings, overwrite=True, callbacks=[timer])
        settings_record = {
            k: getattr(settings, k)
            for k in ("objective", "batch_size", "learning_rate", "warmup_ratio", "weight_decay", "adam_beta2")
            + ("mlm_probability", "lr_scheduler_type", "max_steps")
        }
        head_dim = config.head_size_label
    reference = math.log(unigram[objective])
    return {
        "name": name,
        "objective": objective,
        "head_dim": head_dim,
        "settings": settings_record,
        "seed": seed,
        "unigram_loss": reference,
        "curve": [(tok, sec, loss, reference - loss) for tok, sec, loss in timer.points],
        "wall_seconds": round(time.time() - t0, 1),
    }


def first_reaching(curve, level):
    """(tokens, seconds) of the first held-out point at least ``level`` nats below unigram, or None."""
    for tok, sec, _, below in curve:
        if below >= level:
            return tok, sec
    return None


def write_report(results: list[dict], level: float, out: Path, meta: dict) -> str:
    lines = [
        f"Held-out nats below the unigram reference (higher is better); L = {level} nats below unigram.",
        "",
        "| row | objective | d_p | final nats below unigram | tokens to L | seconds to L | tokens to L vs recipe |",
        "|---|---|---|---|---|---|---|",
    ]
    recipe = next((r for r in results if r["name"] == "recipe"), None)
    recipe_hit = first_reaching(recipe["curve"], level) if recipe else None
    for r in results:
        hit = first_reaching(r["curve"], level)
        final = r["curve"][-1][3] if r["curve"] else float("nan")
        seen = r["curve"][-1][0] if r["curve"] else 0
        tokens = f"{hit[0] / 1e6:.2f}M" if hit else f"> {seen / 1e6:.2f}M"
        seconds = f"{hit[1]:.0f}" if hit else "not reached"
        if recipe_hit and hit:
            ratio = f"{hit[0] / recipe_hit[0]:.1f}×"
        elif recipe_hit:
            ratio = f"> {seen / recipe_hit[0]:.1f}×"
        else:
            ratio = "–"
        lines.append(
            f"| {r['name']} | {r['objective']} | {r['head_dim']} | {final:.2f} | {tokens} | {seconds} | {ratio} |"
        )
    lines += [
        "",
        f"Budget {meta['budget_tokens'] / 1e6:.2f}M training tokens per row (n = {SEQ}), seed {meta['seed']}; "
        f"unigram reference ppl: masked {meta['unigram_perplexity']['mlm']:.1f}, "
        f"causal {meta['unigram_perplexity']['clm']:.1f}. "
        f"torch {meta['torch']}, transformers {meta['transformers']}, Python {meta['python']}, "
        f"{meta['torch_threads']} torch thread(s).",
    ]
    text = "\n".join(lines)
    (out / "tokens_to_quality.md").write_text(text + "\n")
    return text


def plot(results: list[dict], level: float, path: Path) -> None:
    from fixedhead.plotting import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for r in results:
        if not r["curve"]:
            continue
        tok, sec, _, below = zip(*r["curve"], strict=True)
        style = "--" if r["objective"] == "clm" else "-"
        label = f"{r['name']} ({r['objective']}, d_p={r['head_dim']})"
        axes[0].plot([t / 1e6 for t in tok], below, style, marker=".", label=label)
        axes[1].plot(sec, below, style, marker=".", label=label)
    for ax in axes:
        ax.axhline(level, color="grey", lw=0.8, ls=":")
        ax.axhline(0, color="black", lw=0.8)
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("training tokens (millions)")
    axes[1].set_xlabel("training seconds (held-out scoring excluded)")
    axes[0].set_ylabel("held-out nats below the unigram reference")
    fig.suptitle("Tokens to quality: d=128, 2 layers, 16 heads, n=32, Gutenberg books", fontsize=10)
    save_figure(fig, path, [axes[1]])


def main(argv=None) -> int:
    table = rows()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default="runs/tokens-to-quality")
    p.add_argument("--rows", nargs="*", default=list(table), choices=list(table))
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    p.add_argument(
        "--budget-tokens",
        type=int,
        default=2_867_200,
        help="training tokens per row (default 2.87M: the budget of the masked make run, before it became causal)",
    )
    p.add_argument("--every-tokens", type=int, default=204_800, help="held-out scoring interval")
    p.add_argument("--level", type=float, default=0.4, help="L: nats below unigram to reach")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-eval-tokens", type=int, default=100_000)
    p.add_argument("--rerun", action="store_true", help="train rows again even if their result exists")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    (out / "rows").mkdir(parents=True, exist_ok=True)
    data = prepare_data(
        DataSettings(
            corpus=args.corpus,
            vocab_size=8192,
            max_seq_length=SEQ,
            max_train_tokens=2 * args.budget_tokens,
            max_eval_tokens=args.max_eval_tokens,
        ),
        progress=True,
    )
    unigram = {obj: unigram_perplexity(data, 1234, obj) for obj in ("mlm", "clm")}
    for name in args.rows:
        path = out / "rows" / f"{name}.json"
        if path.is_file() and not args.rerun:
            continue
        print(f"[{name}] training {args.budget_tokens:,} tokens", flush=True)
        result = run_row(name, table[name], data, unigram, args.budget_tokens, args.every_tokens, out, args.seed)
        path.write_text(json.dumps(result, indent=1, default=str))
        print(
            f"[{name}] {result['curve'][-1][3]:.3f} nats below unigram after {result['wall_seconds']:.0f} s", flush=True
        )
    import transformers

    meta = {
        "budget_tokens": args.budget_tokens,
        "seed": args.seed,
        "unigram_perplexity": unigram,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "command": "python benchmarks/bench_tokens_to_quality.py " + " ".join(sys.argv[1:]),
    }
    results = [
        json.loads((out / "rows" / f"{n}.json").read_text()) for n in table if (out / "rows" / f"{n}.json").is_file()
    ]
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    print(write_report(results, args.level, out, meta))
    plot(results, args.level, out / "tokens_to_quality.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
