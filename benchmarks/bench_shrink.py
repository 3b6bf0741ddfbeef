#!/usr/bin/env python
"""What ``fixedhead shrink`` buys: held-out loss, key-cache bytes and decode speed against the size K
of the queries and keys, for a small trained causal run and its shrunk copies.

Trains a causal fixedhead run (``--steps`` steps of the ``tiny`` recipe's data, d = ``--hidden``,
``--heads`` heads of ``--head-dim``; or takes ``--run``), then for each K shrinks it
(:func:`fixedhead.shrink.shrink_run`: the realisable rank-K cut folded into the query and key
weights; with ``--finetune-steps``, also trained on), and measures, side by side in this one process:

* held-out loss (``fixedhead evaluate``'s, on the source run's held-out text), and its increase;
  with ``--finetune-steps``, also after that many steps of further training, beside the original
  trained on for as many steps at the same rate (the control the fine-tuned cut is compared with);
* key-cache bytes per token: the keys the model's own ``DynamicCache`` holds after a prefill, over
  every layer, divided by the tokens (values are unchanged by the cut and reported apart);
* decode tokens/s: greedy generation of ``--new-tokens`` tokens for a batch of ``--batch`` prompts,
  the original and each shrunk model timed in alternation, the median of ``--rounds``; reported as the
  ratio to the original's.

Timings are for reading, never for asserting. Usage:
python benchmarks/bench_shrink.py [--run RUN] [--ks 1 2 4 8 16] [--steps 200] [--finetune-steps 0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch


def key_value_bytes(model, ids) -> tuple[float, float]:
    """(key bytes, value bytes) per token the model's cache holds after a prefill of ``ids``."""
    with torch.no_grad():
        cache = model(ids, use_cache=True).cache
    keys = sum(layer.keys.numel() * layer.keys.element_size() for layer in cache.layers)
    values = sum(layer.values.numel() * layer.values.element_size() for layer in cache.layers)
    return keys / ids.numel(), values / ids.numel()


def decode_seconds(model, ids, new_tokens: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def train_run(out: Path, steps: int, hidden: int, heads: int, head_dim: int, seq: int) -> Path:
    from fixedhead.model.configuration import FixedHeadConfig
    from fixedhead.studies.kit.recipes import get_recipe
    from fixedhead.training import prepare_data, pretrain

    tiny = get_recipe("tiny")
    data = prepare_data(replace(tiny.data, max_seq_length=seq, max_train_tokens=400_000), progress=False)
    config = FixedHeadConfig(
        **tiny.model_fields(
            hidden_size=hidden,
            num_attention_heads=heads,
            head_dim=head_dim,
            num_hidden_layers=2,
            max_position_embeddings=2 * seq,
        )
    )
    settings = replace(tiny.train, max_steps=steps, eval_steps=steps, save_steps=steps, objective="clm", progress=False)
    pretrain(config, data, out, settings)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="a trained causal fixedhead run (default: train one)")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--steps", type=int, default=200, help="training steps of the run trained here")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--fit-tokens", type=int, default=32_768)
    p.add_argument("--finetune-steps", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)

    from fixedhead.runs import open_run
    from fixedhead.shrink import shrink_run, train_on
    from fixedhead.training.evaluate import evaluate_run, load_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_shrink_"))
    shape = (args.hidden, args.heads, args.head_dim, args.seq)
    run = Path(args.run) if args.run else train_run(tmp / "run", args.steps, *shape)
    original = load_model(open_run(run)).eval()
    full_loss = evaluate_run(run)["loss"]
    vocab = original.config.vocab_size
    ids = torch.randint(5, vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    control = None
    if args.finetune_steps:  # the control: the original continued as long, at the same rate
        from fixedhead.shrink import ShrinkOptions
        from fixedhead.training.pretrain import source_data

        lr = ShrinkOptions.learning_rate
        train_on(run, source_data(run, progress=False), tmp / "original-ft", args.finetune_steps, lr, progress=False)
        control = evaluate_run(tmp / "original-ft")["loss"]
    models = {"original": (original, full_loss, control)}
    for k in args.ks:
        out = tmp / f"k{k}"
        record = shrink_run(run, k, out, fit_tokens=args.fit_tokens, finetune_steps=args.finetune_steps, progress=False)
        loss = evaluate_run(out)["loss"]
        tuned = evaluate_run(out / "finetuned")["loss"] if args.finetune_steps else None
        models[f"K={k}"] = (load_model(open_run(out)).eval(), loss, tuned)  # the cut: timed (same shapes)
        assert record["qk_head_dim"] == k
    times = {name: [] for name in models}
    for m, _, _ in models.values():  # warm-up
        decode_seconds(m, ids, 4)
    for _ in range(args.rounds):  # alternate, so drift in the machine's load hits every model alike
        for name, (m, _, _) in models.items():
            times[name].append(decode_seconds(m, ids, args.new_tokens))
    base_keys, base_values = key_value_bytes(original, ids)
    base_tps = args.batch * args.new_tokens / statistics.median(times["original"])
    cfg = original.config
    print(
        f"run {run}: d = {cfg.hidden_size}, h = {cfg.num_attention_heads}, layers {cfg.num_hidden_layers}, "
        f"torch threads {torch.get_num_threads()}, batch {args.batch}, prompt {args.prompt}, "
        f"{args.new_tokens} new tokens, median of {args.rounds}"
    )
    header = "| queries/keys K | held-out loss | increase (nats) |"
    header += " after fine-tuning |" if args.finetune_steps else ""
    header += " key-cache bytes/token | ratio | value bytes/token | decode tokens/s | ratio |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    rows = []
    for name, (m, loss, tuned) in models.items():
        keys, values = key_value_bytes(m, ids)
        tps = args.batch * args.new_tokens / statistics.median(times[name])
        row = {
            "model": name,
            "heldout_loss": loss,
            "increase": loss - full_loss,
            "finetuned_loss": tuned,
            "key_bytes_per_token": keys,
            "key_ratio": keys / base_keys,
            "value_bytes_per_token": values,
            "decode_tokens_per_s": tps,
            "decode_ratio": tps / base_tps,
        }
        rows.append(row)
        line = f"| {name} | {loss:.4f} | {loss - full_loss:+.4f} |"
        line += f" {tuned:.4f} |" if args.finetune_steps else ""
        line += f" {keys:.0f} | {keys / base_keys:.3f} | {values:.0f} | {tps:.0f} | {tps / base_tps:.2f} |"
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))
    shutil.rmtree(tmp)  # the trained and shrunk runs: model weights are never kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
