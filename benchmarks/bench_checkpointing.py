#!/usr/bin/env python
"""Activation (gradient) checkpointing: peak memory and step time of one masked-LM training step,
with and without, on a paper-size model.

Default: the paper's Table 2A model with 32 heads of 128 (``fixed-d512-h32-dp128``: d = 512,
24 layers, FFN 4096, vocabulary 30,522), batch 8 × 128 tokens, 15% labelled, dropout 0.1. Peak
memory is every tensor alive during forward + backward (parameters, gradients, activations,
temporaries; no optimizer state), counted with ``bench_training_step.PeakTensorMemory``
(CPU has no allocator statistics; on CUDA ``torch.cuda.max_memory_allocated``). Time is the
median of ``--rounds`` steps, plain and checkpointed alternating. Timings are for reading, never
for asserting; ``tests/test_contract.py`` checks that the gradients are the plain model's.

Usage: python benchmarks/bench_checkpointing.py [--preset NAME] [--layers N] [--batch B] [--seq N]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training_step import PeakTensorMemory, make_batch, sync, tune_glibc_malloc

from fixedhead.model.modeling import FixedHeadForMaskedLM
from fixedhead.model.paper_presets import get_preset


def step(model, batch):
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()


def peak_mib(model, batch, device) -> float:
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(model, batch)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    static = list(model.parameters()) + list(batch.values())
    tracker = PeakTensorMemory()
    tracker.ignore(static)
    with tracker:
        step(model, batch)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return (params + tracker.peak) / 2**20


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="fixed-d512-h32-dp128")
    p.add_argument("--layers", type=int, default=None, help="override the preset's depth")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        tune_glibc_malloc()
    overrides = dict(
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=max(512, args.seq)
    )
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    config = get_preset(args.preset).build_config(**overrides)
    torch.manual_seed(0)
    plain = FixedHeadForMaskedLM(config).to(device).train()
    ckpt = copy.deepcopy(plain)
    ckpt.activation_checkpointing_enable()
    batch = make_batch(args.batch, args.seq, config.vocab_size, 0.15, device, torch.Generator().manual_seed(0))
    n_params = sum(p.numel() for p in plain.parameters())
    print(
        f"{args.preset}: d={config.hidden_size}, {config.num_hidden_layers} layers, "
        f"{config.num_attention_heads} heads "
        f"of {config.attention_head_size}, {n_params / 1e6:.1f}M parameters; batch {args.batch} x {args.seq}, "
        f"{device}, {torch.get_num_threads()} threads",
        flush=True,
    )
    peaks = {name: peak_mib(m, batch, device) for name, m in (("plain", plain), ("checkpointed", ckpt))}
    times = {"plain": [], "checkpointed": []}
    for _ in range(args.rounds):
        for name, m in (("plain", plain), ("checkpointed", ckpt)):
            sync(device)
            t = time.perf_counter()
            step(m, batch)
            sync(device)
            times[name].append(time.perf_counter() - t)
    weights = n_params * 4 / 2**20
    print(f"| {'':12s} | peak MiB | of which activations and temporaries | step s |")
    print("|--------------|----------|--------------------------------------|--------|")
    for name in ("plain", "checkpointed"):
        act = peaks[name] - 2 * weights  # parameters and their gradients are the same in both
        print(f"| {name:12s} | {peaks[name]:8.0f} | {act:36.0f} | {statistics.median(times[name]):6.2f} |")
    saved = peaks["plain"] - peaks["checkpointed"]
    slower = statistics.median(times["checkpointed"]) / statistics.median(times["plain"])
    print(
        f"checkpointing saves {saved:.0f} MiB ({saved / peaks['plain']:.0%} of the peak; "
        f"{saved / (peaks['plain'] - 2 * weights):.0%} of activations and temporaries) "
        f"for {slower:.2f}x the step time"
    )
    print(f"command: python benchmarks/bench_checkpointing.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
