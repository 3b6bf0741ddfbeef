"""The ``fixedhead`` command. Thin: every subcommand parses arguments and calls a library function.

Each subcommand is a pair ``_add_NAME(subparsers)`` / ``_cmd_NAME(args)``; user errors
(ValueError) and file-system errors (OSError: a missing or occupied path, a full disk, a
read-only folder) become a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from .data.mlm import OBJECTIVES
from .training.arguments import LR_SCHEDULERS


def parse_head_dim(text):
    """``--head-dim`` as the config takes it: None, an int (``64``), or one entry per layer
    (``64,64,128,128``; ``none`` = the standard d/h for that layer). The options' argparse ``type``.

    Raises:
        argparse.ArgumentTypeError: an entry that is neither an int nor ``none`` (argparse turns
            it into its usage error, exit status 2).
    """
    if text is None or isinstance(text, (int, list)):
        return text
    values = []
    for t in str(text).split(","):
        t = t.strip()
        if t.lower() == "none":
            values.append(None)
            continue
        try:
            values.append(int(t))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid int value: {t!r} (--head-dim takes an int, or one per layer: 64,64,128,128; none = d/h)"
            ) from None
    return values if "," in str(text) else values[0]


# ----------------------------------------------------------------------------------- count
#: ``count`` options that a preset keeps its own values of when they are not given (and takes when
#: they are: the preset with another depth, feed-forward width, vocabulary or length), with the
#: defaults of explicit sizes (BERT's)
_COUNT_OVERRIDES = {
    "num_hidden_layers": 24,
    "intermediate_size": None,  # 4 x hidden size
    "vocab_size": 30522,
    "max_position_embeddings": 512,
}


def _add_count(sub):
    p = sub.add_parser("count", help="parameter count of a preset or of explicit sizes (paper Tables 1-3)")
    p.add_argument(
        "--preset",
        nargs="*",
        help="paper preset names (default: all of Tables 1-3); --num-hidden-layers, --intermediate-size, "
        "--vocab-size and --max-position-embeddings change them, --hidden-size, --num-attention-heads "
        "and --head-dim are refused",
    )
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-attention-heads", type=int)
    p.add_argument(
        "--head-dim",
        type=parse_head_dim,
        default=None,
        help="fixed head size, or one per layer (64,64,128,128); omit for standard d/h",
    )
    p.add_argument("--num-hidden-layers", type=int, help="default 24, or the preset's")
    p.add_argument(
        "--intermediate-size", type=int, help="feed-forward width (default 4 x hidden size, or the preset's)"
    )
    p.add_argument("--vocab-size", type=int, help="default 30522, or the preset's")
    p.add_argument("--max-position-embeddings", type=int, help="default 512, or the preset's")
    p.set_defaults(func=_cmd_count)


def _cmd_count(args):
    from .model.configuration import FixedHeadConfig
    from .model.modeling import count_parameters
    from .model.paper_presets import PAPER_PRESETS, get_preset

    sizes = [f for f in ("hidden_size", "num_attention_heads", "head_dim") if getattr(args, f) is not None]
    overrides = {f: getattr(args, f) for f in _COUNT_OVERRIDES if getattr(args, f) is not None}
    if sizes and args.preset is not None:
        options = ", ".join(f"--{f.replace('_', '-')}" for f in sizes)
        raise ValueError(f"--preset fixes d, h and d_p; drop {options} (or drop --preset)")
    if sizes or (overrides and args.preset is None):
        if args.hidden_size is None or args.num_attention_heads is None:
            given = (sizes or list(overrides))[0]
            raise ValueError(
                f"--{given.replace('_', '-')} needs --hidden-size and --num-attention-heads (or --preset NAME)"
            )
        kw = {**_COUNT_OVERRIDES, "intermediate_size": 4 * args.hidden_size, **overrides}
        cfg = FixedHeadConfig(
            hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads, head_dim=args.head_dim, **kw
        )
        print(
            f"{count_parameters(cfg):,} parameters: d={cfg.hidden_size}, h={cfg.num_attention_heads}, "
            f"d_p={cfg.head_size_label}, {cfg.num_hidden_layers} layers, feed-forward {cfg.intermediate_size}, "
            f"vocabulary {cfg.vocab_size}, {cfg.max_position_embeddings} positions (pooler and MLM head included)"
        )
        return 0
    names = args.preset or list(PAPER_PRESETS)
    rows = [(name, get_preset(name)) for name in names]  # an unknown name is refused before any output
    rows = [(name, p, p.build_config(**overrides)) for name, p in rows]
    print(f"{'preset':<22} {'source':<9} {'d':>5} {'h':>3} {'d_p':>4} {'params':>13} {'paper':>6} {'diff':>7}")
    for name, p, cfg in rows:
        n = count_parameters(cfg)
        paper_params = None if overrides else p.paper_params  # the paper counted the preset as it is
        diff = f"{100 * (n / 1e6 - paper_params) / paper_params:+.2f}%" if paper_params else ""
        paper = f"{paper_params:.0f}M" if paper_params else ""
        print(
            f"{name:<22} {p.source:<9} {cfg.hidden_size:>5} {cfg.num_attention_heads:>3} "
            f"{cfg.head_size_label!s:>4} {n:>13,} {paper:>6} {diff:>7}"
        )
    if overrides:
        changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
        print(f"({changed} in place of the preset's own; no paper column: the paper counted the presets as published)")
    return 0


# ------------------------------------------------------------------------------- pretrain
class _SizeOption(argparse.Action):
    """Stores the value and remembers that the option was given (``--preset`` and ``--init-from``
    refuse size options)."""

    given = "size_options_given"

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, self.given, getattr(namespace, self.given, ()) + (option_string,))


class _DataOption(_SizeOption):
    """Stores the value and remembers that the option was given (``--init-from`` takes the source
    run's data settings and refuses other data options)."""

    given = "data_options_given"


def add_model_args(p):
    g = p.add_argument_group("model")
    g.add_argument("--hidden-size", type=int, default=128, action=_SizeOption, help="d (default 128)")
    g.add_argument("--num-hidden-layers", type=int, default=2, action=_SizeOption)
    g.add_argument("--num-attention-heads", type=int, default=16, action=_SizeOption, help="h (default 16)")
    g.add_argument(
        "--head-dim",
        type=parse_head_dim,
        default=None,
        action=_SizeOption,
        help="fixed head size d_p, or one per layer (64,64,128,128); omit for the standard d/h",
    )
    g.add_argument(
        "--intermediate-size", type=int, default=None, action=_SizeOption, help="feed-forward width (default 4d)"
    )
    g.add_argument("--dropout", type=float, default=None, help="hidden and attention dropout (default 0)")


def model_config_from_args(args):
    """The ``FixedHeadConfig`` that the model options (``add_model_args``) and ``--max-seq-length`` describe."""
    from .model.configuration import FixedHeadConfig

    dropout = 0.0 if args.dropout is None else args.dropout
    return FixedHeadConfig(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        head_dim=args.head_dim,
        intermediate_size=args.intermediate_size if args.intermediate_size is not None else 4 * args.hidden_size,
        max_position_embeddings=args.max_seq_length,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )


def add_data_args(p, corpus_default=True):
    from .data import DEFAULT_CORPUS

    g = p.add_argument_group("data")
    g.add_argument(
        "--corpus",
        default=str(DEFAULT_CORPUS) if corpus_default else None,
        action=_DataOption,
        help="a .txt/.jsonl(.gz) file, a directory of them, or a Hugging Face dataset name "
        "(default: the Gutenberg books in ../shared/data)",
    )
    g.add_argument(
        "--max-seq-length", type=int, default=64, action=_DataOption, help="n, tokens per packed sequence (default 64)"
    )
    g.add_argument("--vocab-size", type=int, default=8192, action=_DataOption)
    g.add_argument(
        "--heldout-fraction", type=float, default=0.05, action=_DataOption, help="fraction of documents held out"
    )
    g.add_argument("--max-train-tokens", type=int, default=None, action=_DataOption)
    g.add_argument("--max-eval-tokens", type=int, default=200_000, action=_DataOption)


def data_settings_from_args(args):
    """The ``DataSettings`` that the data options (:func:`add_data_args`) describe (validated)."""
    from .data import DataSettings

    return DataSettings(
        corpus=args.corpus,
        vocab_size=args.vocab_size,
        max_seq_length=args.max_seq_length,
        heldout_fraction=args.heldout_fraction,
        max_train_tokens=args.max_train_tokens,
        max_eval_tokens=args.max_eval_tokens,
    )


def add_train_args(p):
    g = p.add_argument_group("training")
    g.add_argument(
        "--objective",
        default=None,
        choices=OBJECTIVES,
        help="mlm: masked LM (BERT, the paper's Tables 1-3); clm: causal (left-to-right) LM, "
        "FixedHeadForCausalLM (default: mlm, or the --preset's: clm for the LM1B-style presets)",
    )
    g.add_argument("--max-steps", type=int, default=600)
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--learning-rate", type=float, default=2e-3)
    g.add_argument("--warmup-ratio", type=float, default=0.06)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument(
        "--lr-scheduler-type",
        default="linear",
        choices=LR_SCHEDULERS,
        help="learning-rate schedule after the warm-up (default linear decay, as BERT)",
    )
    g.add_argument(
        "--mlm-probability",
        type=float,
        default=0.15,
        help="masked LM: fraction of training tokens masked (default 0.15, BERT's; held-out scoring always masks 0.15)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--eval-steps", type=int, default=100)
    g.add_argument("--save-steps", type=int, default=200)
    g.add_argument(
        "--report-to",
        nargs="*",
        default=["tensorboard"],
        help="Trainer integrations (tensorboard, wandb, mlflow, ...; a repeated one counts once), "
        "all (every installed one) or none (no logging); default tensorboard",
    )
    g.add_argument("--torch-compile", action="store_true")
    g.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 autocast (mixed precision; weights and optimizer stay fp32); meant for GPUs "
        "with bf16, works on CPUs with it too",
    )
    _add_checkpointing_arg(g)


def _add_checkpointing_arg(group):
    group.add_argument(
        "--gradient-checkpointing",
        "--activation-checkpointing",
        dest="gradient_checkpointing",
        action="store_true",
        help="recompute each encoder block in the backward pass: less "
        "activation memory for about one more forward pass of time; same gradients",
    )


def report_to_integrations(names: list[str]) -> list[str]:
    """``--report-to`` values as the Trainer takes them: repeats dropped (keeping the first, in
    order), ``none`` (or no value) = ``[]``, ``all`` = every installed integration. Unknown or
    uninstalled integrations, and ``none`` or ``all`` together with another value, are a
    ValueError naming the values, raised before any data is prepared."""
    from transformers.integrations import integration_utils as iu

    names = list(dict.fromkeys(names))  # a repeated integration would log every scalar twice
    for word, meaning in (("none", "turns reporting off"), ("all", "already means every installed integration")):
        if word in names and len(names) > 1:
            others = " ".join(n for n in names if n != word)
            raise ValueError(
                f"--report-to {' '.join(names)}: {word} {meaning}; pass {word} alone, or {others} without it"
            )
    if names in (["none"], []):
        return []
    if names == ["all"]:
        return iu.get_available_reporting_integrations()
    for name in names:
        if name not in iu.INTEGRATION_TO_CALLBACK:
            raise ValueError(
                f"--report-to {name}: unknown integration; known: none, all, {', '.join(iu.INTEGRATION_TO_CALLBACK)}"
            )
        available = getattr(iu, f"is_{name.replace('_ml', '').replace('azure', 'azureml')}_available", None)
        if available is not None and not available():
            raise ValueError(
                f"--report-to {name}: the {name} package is not installed (pip install it, or pick another)"
            )
    return list(names)


def _add_pretrain(sub):
    p = sub.add_parser("pretrain", help="masked-LM pretraining of one model on real text")
    p.add_argument("--output-dir", required=True, help="run directory (model, tokenizer, metrics, checkpoints, logs)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output-dir")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --output-dir")
    p.add_argument(
        "--preset",
        default=None,
        help="a named model from `fixedhead count` (the paper's Tables 1-3, lm1b-*); the size options "
        "below are then refused, --dropout is allowed (default: the preset's 0.1)",
    )
    p.add_argument(
        "--init-from",
        default=None,
        metavar="RUN_DIR",
        help="continue training from this run's weights (a pretraining run or a `fixedhead widen` output) "
        "with the training options given here, on the data the run recorded (--corpus may name a moved "
        "corpus); model and other data options are refused",
    )
    add_model_args(p)
    add_data_args(p)
    add_train_args(p)
    p.set_defaults(func=_cmd_pretrain)


def _cmd_pretrain(args):
    import json

    from .training import TrainSettings, prepare_data, pretrain

    report_to = report_to_integrations(args.report_to)  # before the (slow) data preparation
    objective = args.objective or "mlm"
    source = None
    if args.init_from is not None:
        source = _init_from_source(args)
        objective = "clm" if source.config.is_decoder else "mlm"
        config = None
    elif args.preset:
        from .model.paper_presets import get_preset

        objective = args.objective or get_preset(args.preset).objective  # LM1B presets: causal, as the paper

        if getattr(args, "size_options_given", ()):
            raise ValueError(
                f"--preset {args.preset} fixes the model size; drop "
                f"{', '.join(sorted(set(args.size_options_given)))} (or drop --preset)"
            )

        dropout = (
            {}
            if args.dropout is None
            else dict(hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout)
        )
        config = get_preset(args.preset).build_config(**dropout)
        if args.max_seq_length > config.max_position_embeddings:
            raise ValueError(
                f"--max-seq-length {args.max_seq_length} exceeds preset {args.preset!r}'s "
                f"max_position_embeddings={config.max_position_embeddings}"
            )
    else:
        config = model_config_from_args(args)
    settings = TrainSettings(  # validated before the (slow) data preparation
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        lr_scheduler_type=args.lr_scheduler_type,
        mlm_probability=args.mlm_probability,
        seed=args.seed,
        eval_steps=args.eval_steps,
        save_steps=args.save_steps,
        report_to=report_to,
        torch_compile=args.torch_compile,
        bf16=args.bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        objective=objective,
    )
    if not args.resume:  # an occupied folder is refused before the (slow) data preparation
        from pathlib import Path

        from .training.pretrain import check_run_dir

        check_run_dir(Path(args.output_dir), {}, resume=False, overwrite=args.overwrite)
    if source is not None:
        from .training import source_data

        given = set(getattr(args, "data_options_given", ()))
        data = source_data(args.init_from, corpus=args.corpus if "--corpus" in given else None)
    else:
        data = prepare_data(data_settings_from_args(args))
    result = pretrain(
        config,
        data,
        args.output_dir,
        settings,
        resume=args.resume,
        overwrite=args.overwrite,
        init_from=args.init_from,
    )
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_curve")}, indent=2))
    return 0


def _init_from_source(args):
    """``--init-from``: refuse options that would contradict the run, then open it (one-line errors)."""
    from pathlib import Path

    from .runs import open_run

    refused = [o for o in getattr(args, "size_options_given", ())]
    refused += ["--preset"] * bool(args.preset) + ["--dropout"] * (args.dropout is not None)
    refused += [o for o in getattr(args, "data_options_given", ()) if o != "--corpus"]
    if refused:
        raise ValueError(
            f"--init-from {args.init_from} continues that run's model on its recorded data; drop "
            f"{', '.join(sorted(set(refused)))} (to change the head size, widen it first: fixedhead widen)"
        )
    if not Path(args.init_from).is_dir():
        raise FileNotFoundError(f"--init-from {args.init_from!r}: no such run directory")
    if Path(args.init_from).resolve() == Path(args.output_dir).resolve():
        raise FileExistsError(f"--output-dir {args.output_dir!r} is the run being continued; choose another folder")
    try:
        source = open_run(args.init_from)
    except (OSError, ValueError) as e:
        raise type(e)(f"--init-from {args.init_from!r}: {e}") from None
    objective = "clm" if source.config.is_decoder else "mlm"
    if args.objective is not None and args.objective != objective:
        raise ValueError(
            f"--init-from {args.init_from} holds a {'causal' if objective == 'clm' else 'masked'} LM; "
            f"drop --objective {args.objective} (its objective, {objective}, is used)"
        )
    return source


# ------------------------------------------------------------------------------- evaluate
def _add_allow_pickle(p):
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also load pickle weights (pytorch_model.bin); only for files you trust",
    )


def _add_evaluate(sub):
    p = sub.add_parser(
        "evaluate",
        help="held-out (or --text) loss, perplexity, accuracy and bits per character of a run directory",
    )
    p.add_argument("run_dir")
    p.add_argument("--corpus", default=None, help="where the run's training corpus is now (its text must be the same)")
    p.add_argument(
        "--text",
        default=None,
        help="score new text instead of the held-out set: a .txt/.jsonl(.gz) file or a folder of them, all of it",
    )
    p.add_argument("--eval-seed", type=int, default=None, help="masking seed (default: the run's)")
    p.add_argument("--max-eval-tokens", type=int, default=None)
    _add_allow_pickle(p)
    p.set_defaults(func=_cmd_evaluate)


def _cmd_evaluate(args):
    import json

    from .training.pretrain import evaluate_run, evaluate_text

    if args.text is not None:
        if args.corpus is not None:
            raise ValueError("pass --text (new text to score) or --corpus (the moved training corpus), not both")
        metrics = evaluate_text(
            args.run_dir,
            args.text,
            eval_seed=args.eval_seed,
            max_eval_tokens=args.max_eval_tokens,
            allow_pickle=args.allow_pickle,
        )
    else:
        metrics = evaluate_run(
            args.run_dir,
            corpus=args.corpus,
            eval_seed=args.eval_seed,
            max_eval_tokens=args.max_eval_tokens,
            allow_pickle=args.allow_pickle,
        )
    print(json.dumps(metrics, indent=2))
    return 0


# -------------------------------------------------------------------------------- compare
def _add_compare(sub):
    from .studies.compare import COMPARE_PRESETS

    p = sub.add_parser("compare", help="train standard vs fixed-head models on the same text and compare (make run)")
    p.add_argument("--preset", default="cpu", choices=sorted(COMPARE_PRESETS))
    p.add_argument("--output-dir", default="runs/compare")
    p.add_argument(
        "--corpus", default=None, help="a .txt/.jsonl(.gz) file, a directory, or a Hugging Face dataset name"
    )
    p.add_argument(
        "--objective",
        default=None,
        choices=OBJECTIVES,
        help="train every model as a masked (mlm) or causal (clm) LM (default: the preset's)",
    )
    p.add_argument("--max-steps", type=int, default=None, help="override the preset's step budget")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--learning-rate", type=float, default=None, help="override the preset's peak learning rate")
    p.add_argument("--overwrite", action="store_true", help="retrain models that already finished")
    p.set_defaults(func=_cmd_compare)


def _cmd_compare(args):
    from .studies.compare import run_compare

    run_compare(
        args.preset,
        args.output_dir,
        corpus=args.corpus,
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        seed=args.seed,
        learning_rate=args.learning_rate,
        overwrite=args.overwrite,
        objective=args.objective,
    )


# ------------------------------------------------------------------------------ bottleneck
def _add_bottleneck(sub):
    p = sub.add_parser("bottleneck", help="one head's low-rank bottleneck against head size (Theorem 1): CSV + PNG")
    p.add_argument("--n", type=int, nargs="+", default=[16, 32, 64], help="sequence lengths (default: 16 32 64)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the random P (default: 0 1 2)")
    p.add_argument("--temperature", type=float, default=1.0, help="P = softmax(G / T); lower is more peaked")
    p.add_argument("--max-iter", type=int, default=100, help="L-BFGS iterations per fit (KL; causal: logit space)")
    p.add_argument("--output-dir", default="runs/bottleneck")
    p.add_argument(
        "--causal",
        action="store_true",
        help="also a causal (decoder) head: its threshold ceil((n-1)/2) side by side with n-1",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_bottleneck)


def _cmd_bottleneck(args):
    from .runs import claim_output_dir
    from .studies.bottleneck import bottleneck_sweep

    claim_output_dir(
        args.output_dir,
        ("bottleneck.csv", "bottleneck.png"),
        ("bottleneck.csv", "bottleneck.png"),
        "bottleneck",
        create=False,
    )
    args.n, args.seeds = sorted(set(args.n)), sorted(set(args.seeds))  # repeats add nothing
    rows = bottleneck_sweep(
        args.n,
        args.seeds,
        args.temperature,
        args.output_dir,
        args.max_iter,
        progress=not args.no_progress,
        causal=args.causal,
    )
    print(
        f"{'mask':>13} {'n':>4} {'d_p':>4}  {'logit error':>11}  {'KL (fit)':>10}   "
        f"(mean over {len(args.seeds)} seeds, nats)"
    )
    for mask in ("bidirectional", "causal") if args.causal else ("bidirectional",):
        for n in args.n:
            sel_n = [r for r in rows if r["n"] == n and r["mask"] == mask]
            t = max(r["min_head_dim"] for r in sel_n)
            for k in sorted({1, n // 2, t - 1, t, n} - {0}):
                sel = [r for r in sel_n if r["head_dim"] == k]
                le = sum(r["logit_error"] for r in sel) / len(sel)
                kl = sum(r["kl_fit"] for r in sel) / len(sel)
                print(f"{mask:>13} {n:>4} {k:>4}  {le:>11.3e}  {kl:>10.3e}")
    print(f"wrote {args.output_dir}/bottleneck.csv and bottleneck.png")
    return 0


# -------------------------------------------------------------------------------- analyze
def _add_analyze(sub):
    p = sub.add_parser("analyze", help="per-head rank of attention logits, min_head_dim and entropy on a text")
    p.add_argument("model", help="a fixedhead run directory or a local transformers BERT checkpoint directory")
    p.add_argument("--text", required=True, help="a .txt or .jsonl (text field) file, optionally .gz")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: MODEL)")
    p.add_argument("--max-sequences", type=int, default=8, help="windows of the text to analyse (default 8)")
    p.add_argument(
        "--max-seq-length", type=int, default=None, help="n (default: the model's max_position_embeddings, <= 512)"
    )
    p.add_argument(
        "--rtol", type=float, default=None, help="relative singular-value tolerance of the logit rank (default 1e-5)"
    )
    p.add_argument(
        "--output-dir",
        default=None,
        help="where analysis.json and attention_heatmap.png go "
        "(default: runs/analysis/<model directory name>); a new, empty or earlier analysis folder",
    )
    _add_allow_pickle(p)
    p.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args):
    from pathlib import Path

    from .analysis import (
        ANALYSIS_FILE,
        ANALYSIS_OWNED,
        DEFAULT_RTOL,
        HEATMAP_FILE,
        analyze,
        format_table,
        write_analysis,
    )
    from .runs import claim_output_dir
    from .validation import positive_int

    positive_int("max_sequences", args.max_sequences)
    if args.max_seq_length is not None:
        positive_int("max_seq_length", args.max_seq_length, minimum=3)
    out = args.output_dir or Path("runs") / "analysis" / Path(args.model).resolve().name
    # refuse an occupied folder before the work, not after it
    claim_output_dir(out, (ANALYSIS_FILE, HEATMAP_FILE), ANALYSIS_OWNED, "analyze", create=False)
    result = analyze(
        args.model,
        args.text,
        tokenizer_path=args.tokenizer,
        max_sequences=args.max_sequences,
        max_seq_length=args.max_seq_length,
        rtol=args.rtol if args.rtol is not None else DEFAULT_RTOL,
        allow_pickle=args.allow_pickle,
    )
    print(format_table(result))
    paths = write_analysis(result, out)
    print(f"wrote {paths['json']} and {paths['heatmap']}")
    return 0


# ------------------------------------------------------------------------------- finetune
def _add_finetune(sub):
    p = sub.add_parser("finetune", help="fine-tune a pretrained run on a GLUE task; score on GLUE dev")
    p.add_argument("--task", required=True, help="sst2, cola, mrpc, rte or stsb")
    p.add_argument("--model", required=True, help="a pretraining run directory (model.safetensors + tokenizer)")
    p.add_argument(
        "--output-dir",
        default=None,
        help="default: MODEL/finetune-TASK; a new, empty or earlier fine-tuning folder (never the run itself)",
    )
    p.add_argument("--data-dir", default=None, help="folder holding glue/ (default: ../shared/data)")
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--eval-steps", type=int, default=100, help="validate (and checkpoint) every N steps")
    p.add_argument("--patience", type=int, default=3, help="early stopping: evaluations without improvement")
    p.add_argument(
        "--validation-size",
        type=int,
        default=None,
        help="examples carved out of GLUE train for early stopping (default: 1000 or a fifth of "
        "GLUE train, whichever is smaller)",
    )
    p.add_argument("--max-train-examples", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier fine-tuning result in --output-dir (removes only files fine-tuning wrote)",
    )
    _add_checkpointing_arg(p)
    p.set_defaults(func=_cmd_finetune)


def _cmd_finetune(args):
    import json
    from pathlib import Path

    from .training.finetune import FinetuneSettings, finetune

    settings = FinetuneSettings(
        max_seq_length=args.max_seq_length,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        max_steps=args.max_steps,
        eval_steps=args.eval_steps,
        patience=args.patience,
        validation_size=args.validation_size,
        max_train_examples=args.max_train_examples,
        seed=args.seed,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    out = args.output_dir or str(Path(args.model) / f"finetune-{args.task}")
    result = finetune(args.model, args.task, out, settings, data_dir=args.data_dir, overwrite=args.overwrite)
    print(json.dumps({k: v for k, v in result.items() if k != "fingerprint"}, indent=2))
    return 0


# ---------------------------------------------------------------------------------- sweep
def _add_sweep(sub):
    from .studies.sweep import EXPERIMENTS, SWEEP_PRESETS

    p = sub.add_parser(
        "sweep",
        help="the paper's head / embedding-size / head-size sweeps with seeds, then a report",
        description="Train every model of a sweep preset with several seeds (several workers may share one "
        "--output-dir: each skips runs another holds), score held-out perplexity, fine-tune (masked presets) "
        "and write OUT/report.md with a paper-claim table. Presets: cpu-mlm (default) = the BERT claims with "
        "the masked-LM recipe, 8 models x seeds 0-2, SST-2 fine-tuning; cpu-clm = the LM1B claims as causal "
        "LMs, 5 models x seeds 0-1, no fine-tuning; cpu = the original 300-step masked sweep.",
    )
    p.add_argument("--preset", default="cpu-mlm", choices=sorted(SWEEP_PRESETS), help="(default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="CI-sized version of the preset (under a minute)")
    p.add_argument("--output-dir", default=None, help="default: runs/sweep-PRESET[-quick]")
    p.add_argument("--corpus", default=None)
    p.add_argument("--seeds", type=int, nargs="*", default=None, help="override the preset's seeds")
    p.add_argument("--experiments", nargs="*", default=None, choices=EXPERIMENTS)
    p.add_argument("--max-steps", type=int, default=None, help="override the pretraining steps per run")
    p.add_argument(
        "--finetune-task",
        default=None,
        help="GLUE task for each checkpoint (default: the preset's, sst2; cpu-clm has none)",
    )
    p.add_argument("--skip-finetune", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    p.add_argument("--overwrite", action="store_true", help="retrain runs that already finished")
    p.set_defaults(func=_cmd_sweep)


def _cmd_sweep(args):
    from .studies.report import write_report
    from .studies.sweep import run_sweep

    if args.threads is not None:
        import torch

        from .validation import positive_int

        torch.set_num_threads(positive_int("threads", args.threads))
    out = args.output_dir or f"runs/sweep-{args.preset}{'-quick' if args.quick else ''}"
    run_sweep(
        args.preset,
        out,
        quick=args.quick,
        corpus=args.corpus,
        seeds=args.seeds,
        experiments=args.experiments,
        max_steps=args.max_steps,
        finetune_task=args.finetune_task,
        skip_finetune=args.skip_finetune,
        overwrite=args.overwrite,
    )
    if not args.no_report:
        print(f"report: {write_report(out)}")
    return 0


# --------------------------------------------------------------------------------- report
def _add_report(sub):
    p = sub.add_parser("report", help="markdown tables, plots and the paper-claim table of a sweep directory")
    p.add_argument("sweep_dir")
    p.add_argument("--output-dir", default=None, help="default: SWEEP_DIR")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args):
    from .studies.report import write_report

    print(f"wrote {write_report(args.sweep_dir, args.output_dir)}")
    return 0


# -------------------------------------------------------------------------- farthest-point
def _add_farthest_point(sub):
    from .studies.farthest_point import SYNTHETIC_PRESETS

    p = sub.add_parser(
        "farthest-point",
        help="the bottleneck in trained models: a synthetic task whose needed "
        "rank r is a knob, trained over (r, d_p) and heads, with seeds (minutes on a CPU)",
    )
    p.add_argument("--preset", default="default", choices=sorted(SYNTHETIC_PRESETS))
    p.add_argument("--quick", action="store_true", help="the seconds-long preset (same as --preset quick)")
    p.add_argument("--output-dir", default=None, help="default: runs/farthest-point-PRESET")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the preset's seeds (default 0 1 2)")
    p.add_argument("--steps", type=int, default=None, help="override the training steps per run")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--overwrite", action="store_true", help="discard stored runs and train every cell again")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_farthest_point)


def _cmd_farthest_point(args):
    from .studies.farthest_point import format_grid, run_synthetic

    preset = "quick" if args.quick else args.preset
    if args.threads is not None:
        if args.threads <= 0:
            raise ValueError(f"--threads must be a positive int, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    out = args.output_dir or f"runs/farthest-point-{preset}"
    state = run_synthetic(
        preset, out, seeds=args.seeds, steps=args.steps, overwrite=args.overwrite, progress=not args.no_progress
    )
    print(format_grid(state))
    meta = state["meta"]
    print(
        f"wrote {out}/report.md, results.json, results.csv and three PNGs ({meta['total_seconds']:.0f} s since "
        f"the first start, {meta['compute_seconds']:.0f} s of training)"
    )
    return 0


# ---------------------------------------------------------------------------------- widen
def _add_widen(sub):
    p = sub.add_parser(
        "widen", help="grow every head of a run to a larger head size d_p' with the same function (exactly)"
    )
    p.add_argument("run_dir", help="a fixedhead run directory (masked or causal LM)")
    p.add_argument(
        "--head-dim",
        type=parse_head_dim,
        required=True,
        help="new head size d_p' >= the current one, or one per layer (64,64,128,128)",
    )
    p.add_argument("--output-dir", required=True, help="a new or empty folder (or an earlier widen output)")
    p.add_argument(
        "--init-std", type=float, default=None, help="std of the new random rows (default: initializer_range)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the new random rows (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier `fixedhead widen` output there")
    _add_allow_pickle(p)
    p.set_defaults(func=_cmd_widen)


def _cmd_widen(args):
    from .training.widen import widen_run

    record = widen_run(
        args.run_dir,
        args.head_dim,
        args.output_dir,
        init_std=args.init_std,
        seed=args.seed,
        overwrite=args.overwrite,
        allow_pickle=args.allow_pickle,
    )
    print(
        f"widened {args.run_dir}: head sizes {record['old_head_dims']} -> {record['new_head_dims']}; "
        f"wrote {args.output_dir}"
    )
    return 0


# ----------------------------------------------------------------------- widen-experiment
def _add_widen_experiment(sub):
    from .studies.widening import WIDENING_PRESETS

    p = sub.add_parser(
        "widen-experiment",
        help="does widening help? a trained standard-head causal LM continued as is, widened (all, early, "
        "late layers) and with a parameter-matched wider FFN, with seeds; report and plot",
    )
    p.add_argument("--preset", default="cpu", choices=sorted(WIDENING_PRESETS))
    p.add_argument("--output-dir", default=None, help="default: runs/widen-experiment-PRESET")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="continuation seeds (default: 1 2 3)")
    p.add_argument("--base-steps", type=int, default=None, help="override the base run's steps (cpu: 400)")
    p.add_argument("--steps", type=int, default=None, help="override each continuation's steps (cpu: 100)")
    p.add_argument(
        "--head-dim",
        type=int,
        default=None,
        help="the widened head size (default: the generic causal threshold ceil((n-1)/2), 16 for n = 32)",
    )
    p.add_argument("--corpus", default=None, help="the preset's corpus at another path")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--overwrite", action="store_true", help="delete this experiment's earlier runs there first")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_widen_experiment)


def _cmd_widen_experiment(args):
    from .studies.widening import format_table, run_widening
    from .validation import positive_int

    if args.threads is not None:
        import torch

        torch.set_num_threads(positive_int("threads", args.threads))
    out = args.output_dir or f"runs/widen-experiment-{args.preset}"
    state = run_widening(
        args.preset,
        out,
        seeds=args.seeds,
        base_steps=args.base_steps,
        steps=args.steps,
        wide_head_dim=args.head_dim,
        corpus=args.corpus,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    if args.no_progress:
        print(format_table(state))
    meta = state["meta"]
    print(
        f"wrote {out}/report.md, results.json and widening.png ({meta['total_seconds']:.0f} s since the first "
        f"start, {meta['compute_seconds']:.0f} s of training)"
    )
    return 0


# ------------------------------------------------------------------------------------ main
_COMMANDS = [
    _add_count,
    _add_pretrain,
    _add_evaluate,
    _add_compare,
    _add_bottleneck,
    _add_analyze,
    _add_finetune,
    _add_sweep,
    _add_report,
    _add_farthest_point,
    _add_widen,
    _add_widen_experiment,
]


class _OneLineErrors(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``fixedhead CMD: error: ...``) with exit status 2,
    like every other error of the command; ``--help`` still shows the full usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="fixedhead",
        description="Fixed head size attention (Bhojanapalli et al., ICML 2020): train, compare, analyse.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineErrors)
    for add in _COMMANDS:
        add(sub)
    return parser


def _os_error_message(e: OSError) -> str:
    """One line for a file-system error: our own messages as they are, the system's with the path."""
    if e.strerror and e.filename:
        hint = {
            27: " (the disk or a file-size limit is full)",
            28: " (the disk is full)",
            30: " (a read-only file system)",
            13: "",
        }.get(e.errno, "")
        return f"{e.filename}: {e.strerror}{hint}"
    return str(e)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except ValueError as e:
        print(f"fixedhead {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a missing or occupied path, a full disk, a read-only folder
        print(f"fixedhead {args.command}: error: {_os_error_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = {
            "pretrain": "; rerun with --resume to continue from the newest checkpoint",
            "compare": "; rerun the same command to continue (finished models are reused)",
            "sweep": "; rerun the same command to continue (finished points are reused)",
            "farthest-point": "; rerun the same command to continue (finished runs are reused)",
            "widen-experiment": "; rerun the same command to continue (finished runs are reused)",
        }.get(args.command, "")
        print(f"fixedhead {args.command}: interrupted{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
