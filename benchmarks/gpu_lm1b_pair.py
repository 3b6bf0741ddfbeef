#!/usr/bin/env python
"""LM1B-style pair on one GPU: standard heads (h = 32, d_p = 8) against the paper's fixed head size
(h = 32, d_p = 32) at d = 256, n = 128, two seeds each, causal LM (the paper's Fig. 3a setting,
``lm1b-standard-d256-h32`` and ``lm1b-fixed-d256-h32-dp32``: 6 layers, FFN 1024).

Prepared to fit about 8 minutes of an H100/H200-class GPU (data preparation included); it runs on
a CPU too (slowly: use ``--max-steps 3`` to check it works). Every model trains on the same
tokenizer, packed sequences and step budget and is scored on the same held-out next tokens; the
table gives held-out perplexity, nats below the unigram reference, and mean ± std over seeds.

Usage:
    python benchmarks/gpu_lm1b_pair.py --corpus ../shared/data/pretrain/gutenberg_en_books.jsonl.gz \
        --output-dir runs/gpu-lm1b-pair [--max-steps 2000] [--batch-size 64] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from fixedhead.data import DEFAULT_CORPUS, DataSettings, prepare_data
from fixedhead.data.lm import unigram_perplexity
from fixedhead.model.flops import training_flops
from fixedhead.model.paper_presets import get_preset
from fixedhead.training.pretrain import TrainSettings, train_or_reuse

MODELS = {"standard (d_p=8)": "lm1b-standard-d256-h32", "fixed (d_p=32)": "lm1b-fixed-d256-h32-dp32"}
SEQ = 128


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    p.add_argument("--output-dir", default="runs/gpu-lm1b-pair")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--vocab-size", type=int, default=32000, help="the paper's LM1B sub-word vocabulary (32k)")
    p.add_argument("--max-eval-tokens", type=int, default=500_000)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    t_start = time.time()
    print(
        f"device: {torch.cuda.get_device_name(0) if cuda else 'CPU (no CUDA)'}; torch {torch.__version__}", flush=True
    )
    data = prepare_data(
        DataSettings(
            corpus=args.corpus,
            vocab_size=args.vocab_size,
            max_seq_length=SEQ,
            max_train_tokens=args.max_steps * args.batch_size * SEQ + 1,
            max_eval_tokens=args.max_eval_tokens,
        )
    )
    unigram = unigram_perplexity(data, 1234, "clm")
    settings = TrainSettings(
        objective="clm",
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        warmup_ratio=0.06,
        eval_steps=max(1, args.max_steps // 4),
        save_steps=args.max_steps,
        logging_steps=max(1, args.max_steps // 20),
        report_to=[],
        bf16=cuda and torch.cuda.is_bf16_supported(),
        progress=False,
    )
    rows = []
    for seed in args.seeds:  # seed-major: a run cut short has printed whole pairs, and a rerun reuses them
        for label, preset in MODELS.items():
            config = get_preset(preset).build_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
            config.vocab_size = len(data.tokenizer)
            run = Path(args.output_dir) / f"{preset}-s{seed}"
            t0 = time.time()
            r = train_or_reuse(config, data, run, replace(settings, seed=seed))  # a rerun reuses
            rows.append((label, preset, seed, r, config))
            print(
                f"{label:>17} seed {seed}: held-out ppl {r['heldout_perplexity']:.1f}, "
                f"{math.log(unigram) - r['heldout_loss']:.2f} nats below unigram, {time.time() - t0:.0f} s",
                flush=True,
            )
    print(
        f"\nunigram reference ppl {unigram:.1f} on the same held-out next tokens; {args.max_steps} steps x "
        f"{args.batch_size} x {SEQ} tokens = {args.max_steps * args.batch_size * SEQ / 1e6:.1f}M tokens per model; "
        f"bf16={settings.bf16}"
    )
    print(f"{'model':>17}  {'params':>7}  {'train GFLOPs':>12}  {'held-out ppl (mean ± std)':>26}  below unigram")
    summary = {}
    for label, preset in MODELS.items():
        mine = [r for lab, _, _, r, _ in rows if lab == label]
        config = next(c for lab, _, _, _, c in rows if lab == label)
        ppl = [r["heldout_perplexity"] for r in mine]
        below = [math.log(unigram) - r["heldout_loss"] for r in mine]
        flops = training_flops(config, mine[0]["training_tokens"], SEQ) / 1e9
        spread = statistics.stdev(ppl) if len(ppl) > 1 else float("nan")
        print(
            f"{label:>17}  {mine[0]['parameters'] / 1e6:6.2f}M  {flops:12.0f}  "
            f"{statistics.mean(ppl):17.2f} ± {spread:6.2f}  {statistics.mean(below):.2f}"
        )
        summary[label] = {"preset": preset, "perplexities": ppl, "nats_below_unigram": below}
    Path(args.output_dir, "summary.json").write_text(
        json.dumps({"unigram_perplexity": unigram, "args": vars(args), "models": summary}, indent=1)
    )
    print(f"total {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
