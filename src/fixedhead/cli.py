"""The ``fixedhead`` command. Thin: every subcommand parses arguments and calls a library function.

Each subcommand is a pair ``_add_NAME(subparsers)`` / ``_cmd_NAME(args)``; user errors
(ValueError, FileNotFoundError, FileExistsError) become a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import sys


# ----------------------------------------------------------------------------------- count
def _add_count(sub):
    p = sub.add_parser("count", help="parameter count of a preset or of explicit sizes (paper Tables 1-3)")
    p.add_argument("--preset", nargs="*", help="paper preset names (default: all of Tables 1-3)")
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-attention-heads", type=int)
    p.add_argument("--head-dim", type=int, default=None, help="fixed head size; omit for standard d/h")
    p.add_argument("--num-hidden-layers", type=int, default=24)
    p.add_argument("--intermediate-size", type=int)
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--max-position-embeddings", type=int, default=512)
    p.set_defaults(func=_cmd_count)


def _cmd_count(args):
    from .configuration import FixedHeadConfig
    from .experiments.presets import PAPER_PRESETS, get_preset
    from .modeling import count_parameters

    if args.hidden_size is not None or args.num_attention_heads is not None:
        if args.hidden_size is None or args.num_attention_heads is None:
            raise ValueError("--hidden-size and --num-attention-heads go together")
        cfg = FixedHeadConfig(
            hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads,
            head_dim=args.head_dim,
            num_hidden_layers=args.num_hidden_layers,
            intermediate_size=args.intermediate_size or 4 * args.hidden_size,
            vocab_size=args.vocab_size,
            max_position_embeddings=args.max_position_embeddings,
        )
        print(f"{count_parameters(cfg):,} parameters (d_p={cfg.attention_head_size})")
        return 0
    names = args.preset or list(PAPER_PRESETS)
    print(f"{'preset':<22} {'source':<9} {'d':>5} {'h':>3} {'d_p':>4} {'params':>13} {'paper':>6} {'diff':>7}")
    for name in names:
        p = get_preset(name)
        cfg = p.build_config()
        n = count_parameters(cfg)
        diff = f"{100 * (n / 1e6 - p.paper_params) / p.paper_params:+.2f}%" if p.paper_params else ""
        paper = f"{p.paper_params:.0f}M" if p.paper_params else ""
        print(
            f"{name:<22} {p.source:<9} {cfg.hidden_size:>5} {cfg.num_attention_heads:>3} "
            f"{cfg.attention_head_size:>4} {n:>13,} {paper:>6} {diff:>7}"
        )
    return 0


# ------------------------------------------------------------------------------ bottleneck
def _add_bottleneck(sub):
    p = sub.add_parser("bottleneck", help="one head's low-rank bottleneck against head size (Theorem 1): CSV + PNG")
    p.add_argument("--n", type=int, nargs="+", default=[16, 32, 64], help="sequence lengths (default: 16 32 64)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the random P (default: 0 1 2)")
    p.add_argument("--temperature", type=float, default=1.0, help="P = softmax(G / T); lower is more peaked")
    p.add_argument("--max-iter", type=int, default=100, help="L-BFGS iterations per KL fit")
    p.add_argument("--output-dir", default="runs/bottleneck")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_bottleneck)


def _cmd_bottleneck(args):
    from .theory import bottleneck_sweep

    rows = bottleneck_sweep(args.n, args.seeds, args.temperature, args.output_dir, args.max_iter,
                            progress=not args.no_progress)
    print(f"{'n':>4} {'d_p':>4}  {'logit error':>11}  {'KL (fit)':>10}   (mean over {len(args.seeds)} seeds, nats)")
    for n in args.n:
        for k in sorted({1, n // 2, n - 2, n - 1, n} - {0}):
            sel = [r for r in rows if r["n"] == n and r["head_dim"] == k]
            le = sum(r["logit_error"] for r in sel) / len(sel)
            kl = sum(r["kl_fit"] for r in sel) / len(sel)
            print(f"{n:>4} {k:>4}  {le:>11.3e}  {kl:>10.3e}")
    print(f"wrote {args.output_dir}/bottleneck.csv and bottleneck.png")
    return 0


# ------------------------------------------------------------------------------------ main
_COMMANDS = [_add_count, _add_bottleneck]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fixedhead",
        description="Fixed head size attention (Bhojanapalli et al., ICML 2020): train, compare, analyse.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"fixedhead {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fixedhead {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
