"""The ``fixedhead`` command (also ``python -m fixedhead``): :data:`COMMANDS` maps each subcommand
to its options and the one library function it calls.

Every option is a dataclass field (:func:`fixedhead.options.add_options`): the settings, a study's ``Options``
and, here, each command's own (:class:`StudyRunning`: the options every study shares). Only the chosen
command's options are built, and ``--help`` and ``count``, ``pretrain``, ``evaluate`` and ``report`` import
neither torch nor transformers, so their help and usage errors answer at once. User errors (ValueError) and
file-system errors (OSError) become one line naming options as typed, and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .checks import positive_int
from .options import (
    add_nested_options,
    add_options,
    given,
    in_option_words,
    options_from,
)
from .studies import STUDIES, study_class, study_help


def _command(cls):
    """A command's own options (what it reads and writes): keyword-only, so a required field may follow one
    with a default."""
    return dataclass(kw_only=True)(cls)


def _read(args, cls):
    """The options of the dataclass ``cls`` as parsed, its defaults where not given."""
    return cls(**given(args, cls))


@_command
class _LoadsWeights:
    allow_pickle: bool = False
    """also load pickle weights; only for files you trust"""


@_command
class _ShowsProgress:
    progress: bool = True
    """progress bars"""


def _print_json(result: dict, drop=lambda key: False):
    print(json.dumps({k: v for k, v in result.items() if not drop(k)}, indent=2))


# -------------------------------------------------------------------------------------- count
def _preset_names() -> str:
    """The model presets' names, for ``--preset``'s help."""
    from .model.paper_presets import PAPER_PRESETS

    return ", ".join(PAPER_PRESETS)


def _count_options(p):
    from .model.sizes import CountSizes

    add_options(p, CountSizes, title="sizes", more_help={"preset": f"; one or more of: {_preset_names()}"})


def _count(args):
    """parameter count of a preset or of explicit sizes (paper Tables 1-3)"""
    from .model.sizes import CountSizes, count_table

    sizes = given(args, CountSizes)
    objective = sizes.pop("objective", None)
    print(count_table(sizes.pop("preset", None), sizes, objective))


# ----------------------------------------------------------------------------------- pretrain
@_command
class PretrainRun:
    output_dir: str = field(metadata={"metavar": "DIR"})
    """run directory (model, tokenizer, metrics, checkpoints, logs)"""
    resume: bool = False
    """continue from the newest checkpoint in --output-dir"""
    overwrite: bool = False
    """replace a run already in --output-dir"""
    preset: str | None = None
    """a named model from `fixedhead count` (the paper's Tables 1-3, lm1b-*); the size options are then refused"""
    init_from: str | None = field(default=None, metadata={"metavar": "RUN_DIR"})
    """continue training this run's weights (a pretraining run or a `fixedhead widen` output) on the data it
    recorded (--corpus may name a moved corpus); model and other data options are refused"""


def _pretrain_options(p):
    from .data import DataSettings
    from .training import ModelSettings, TrainSettings

    add_options(p, PretrainRun, title="the run", more_help={"preset": f"; one of: {_preset_names()}"})
    add_options(p, ModelSettings, title="model", more_help={"dropout": "; with --preset, the preset's (0.1)"})
    add_options(p, DataSettings, title="data")
    with_preset = {"objective": "; with --preset, the preset's (clm for lm1b-*)"}
    add_options(p, TrainSettings, skip=("progress",), title="training", more_help=with_preset)


def _pretrain(args):
    """pretrain one masked or causal LM on real text"""
    from .data import DataSettings
    from .training import ModelSettings, TrainSettings
    from .training.command import pretrain_command

    run = dataclasses.asdict(_read(args, PretrainRun))
    result = pretrain_command(
        run.pop("output_dir"),
        model=given(args, ModelSettings),
        data=given(args, DataSettings),
        train=given(args, TrainSettings),
        **run,
    )
    _print_json(result, drop=lambda k: k.endswith("_curve"))


# ----------------------------------------------------------------------------------- evaluate
@_command
class EvaluateRun(_LoadsWeights):
    run_dir: str = field(metadata={"positional": True})
    """a pretraining run directory"""
    corpus: str | None = None
    """where the run's training corpus is now (its text must be the same)"""
    text: str | None = None
    """score new text instead of the held-out set: a .txt/.jsonl(.gz) file or a folder"""
    eval_seed: int | None = None
    """masking seed (default: the run's)"""
    max_eval_tokens: int | None = None
    """cap on the tokens scored (default: the run's)"""


def _evaluate_options(p):
    add_options(p, EvaluateRun, title="the run and its text")


def _evaluate(args):
    """held-out (or --text) loss, perplexity, accuracy and bits per character of a run directory"""
    from .training import evaluate_run, evaluate_text

    o = _read(args, EvaluateRun)
    common = dict(eval_seed=o.eval_seed, max_eval_tokens=o.max_eval_tokens, allow_pickle=o.allow_pickle)
    if o.text is not None and o.corpus is not None:
        raise ValueError("pass --text (new text to score) or --corpus (the moved training corpus), not both")
    if o.text is not None:
        _print_json(evaluate_text(o.run_dir, o.text, **common))
    else:
        _print_json(evaluate_run(o.run_dir, corpus=o.corpus, **common))


# ----------------------------------------------------------------------------------- finetune
@_command
class FinetuneRun:
    task: str
    """sst2, cola, mrpc, rte or stsb"""
    model: str
    """a pretraining run directory (model.safetensors + tokenizer)"""
    output_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    """a new, empty or earlier fine-tuning folder, never the run (default: MODEL/finetune-TASK)"""
    data_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    """folder holding glue/ (default: ../shared/data)"""
    overwrite: bool = False
    """replace an earlier fine-tuning result in --output-dir"""


def _finetune_options(p):
    from .training.finetune import FinetuneSettings

    add_options(p, FinetuneRun, title="the run")
    add_options(p, FinetuneSettings, skip=("progress", "save_model"), title="fine-tuning")


def _finetune(args):
    """fine-tune a pretrained run on a GLUE task; score on GLUE dev"""

    from .training.finetune import FinetuneSettings, finetune

    o = _read(args, FinetuneRun)
    out = o.output_dir or str(Path(o.model) / f"finetune-{o.task}")
    settings = FinetuneSettings(**given(args, FinetuneSettings))
    result = finetune(o.model, o.task, out, settings, data_dir=o.data_dir, overwrite=o.overwrite)
    _print_json(result, drop=lambda k: k == "fingerprint")


# ------------------------------------------------------------------------------------ analyze
@_command
class AnalyzeRun(_LoadsWeights):
    model: str = field(metadata={"positional": True})
    """a fixedhead run or a local transformers checkpoint (BERT, GPT-2, Llama, ...)"""
    text: str
    """a .txt or .jsonl (text field) file, optionally .gz"""
    output_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    """where analysis.json and attention_heatmap.png go, a new, empty or earlier analysis folder (default:
    runs/analysis/<model directory name>)"""


def _analyze_options(p):
    from .diagnostics.analysis import AnalyzeOptions

    add_options(p, AnalyzeRun, title="the model, its text and the output")
    add_options(p, AnalyzeOptions, title="the analysis")


def _analyze(args):
    """per-head rank of attention logits, min_head_dim and entropy on a text"""
    from .diagnostics.analysis import AnalyzeOptions, analyze_to_folder, format_table

    o, run = _read(args, AnalyzeOptions), _read(args, AnalyzeRun)
    result, paths = analyze_to_folder(
        run.model,
        run.text,
        tokenizer_path=o.tokenizer,
        rtol=o.rtol,
        max_sequences=o.max_sequences,
        max_seq_length=o.max_seq_length,
        output_dir=run.output_dir,
        allow_pickle=run.allow_pickle,
    )
    print(format_table(result))
    print(f"wrote {paths['json']} and {paths['heatmap']}")


# ---------------------------------------------------------------------------- rank-intervention
@_command
class RankInterventionRuns(_ShowsProgress):
    runs: list[str] = field(metadata={"positional": True, "metavar": "RUN"})
    """pretraining run directories (fixedhead or Llama-style; seeds of one model share a folder name, e.g.
    runs/compare/fixed and runs/compare-seed1/fixed)"""
    output_dir: str = field(default="runs/rank-intervention", metadata={"metavar": "DIR"})
    """a new, empty or earlier rank-intervention folder"""
    overwrite: bool = False
    """replace an earlier rank-intervention output"""


def _rank_intervention_options(p):
    from .diagnostics.intervention import RankInterventionOptions

    add_options(p, RankInterventionRuns, title="the runs and the output")
    add_options(p, RankInterventionOptions, title="the intervention")


def _rank_intervention(args):
    """the logit rank a trained model needs: each head's logits cut to rank k, held-out loss against k"""
    from .diagnostics.intervention import RankInterventionOptions, intervene_runs, report_markdown

    o, where = _read(args, RankInterventionOptions), dataclasses.asdict(_read(args, RankInterventionRuns))
    results = intervene_runs(where.pop("runs"), command=args.command_line, **dataclasses.asdict(o), **where)
    print(report_markdown(results, args.command_line))
    print(f"wrote {where['output_dir']}/rank_intervention.{{json,csv,png,md}}")


# ------------------------------------------------------------------------ studies on the kit
@_command
class StudyRunning(_ShowsProgress):
    output_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    """where the study writes"""
    quick: bool = False
    """the seconds-sized version of the study (numbers mean nothing), in its own -quick folder; options given
    still apply"""
    grow: bool = False
    """accept a plan that differs from the folder's after results exist (the report says so)"""
    overwrite: bool = False
    """run every point again with these options (the plan and the stored results are replaced)"""
    threads: int | None = None
    """torch CPU threads (per point with Ray; default: torch's choice, with --workers cores / workers, on a
    cluster 1)"""
    workers: int | None = None
    """run N points at once as Ray tasks on a local Ray instance this command starts and stops (default: one
    after another in this process, no Ray)"""
    ray_address: str | None = field(default=None, metadata={"metavar": "ADDR"})
    """run the points as tasks on this existing Ray cluster (auto or HOST:PORT; default: $RAY_ADDRESS);
    --output-dir must be a path every node sees"""
    gpus_per_point: float | None = field(default=None, metadata={"metavar": "G"})
    """GPUs each point's Ray task asks for (default: none)"""


def _kit_study(name: str):
    """The study ``name`` as a command: one option per field of its ``Options`` (nested ones flattened) and
    :class:`StudyRunning`'s; it runs :func:`~fixedhead.studies.kit.study.run_study` and prints the report."""

    def study():
        return study_class(name)()

    def add(p):
        from .studies.kit.study import default_dir_text

        s = study()
        add_nested_options(p, s.Options, title="the plan (defaults: the full study)")
        where, quick_where = default_dir_text(s), default_dir_text(s, quick=True)
        presets = f"; --preset may also be {', '.join(s.quick_presets)}" if s.quick_presets else ""
        more_help = {
            "output_dir": f" (default: {where}; --quick: {quick_where})",
            "quick": f" (it sets {_quick_values(s)}{presets})",
        }
        add_options(p, StudyRunning, title="running it", more_help=more_help)
        for flag, why in s.removed.items():
            p.add_argument(flag, nargs="*", action=_Removed, help=argparse.SUPPRESS, why=why)

    def run(args):
        from .studies.kit.executor import Executor
        from .studies.kit.study import run_study, study_folder

        s, o = study(), _read(args, StudyRunning)
        quick_preset = getattr(s.quick, "preset", None) if o.quick else None
        if quick_preset and getattr(args, "preset", quick_preset) not in (quick_preset, *s.quick_presets):
            allowed = ", ".join((quick_preset, *s.quick_presets))
            raise ValueError(
                f"--quick trains preset {quick_preset}; with --preset {args.preset} it would train that full preset: "
                f"drop --quick, or pass a quick preset ({allowed})"
            )
        options = options_from(args, s.quick if o.quick else s.Options())
        out = study_folder(s, options, o.output_dir, o.quick)
        address = o.ray_address or os.environ.get("RAY_ADDRESS") or None
        executor = Executor(o.workers, address, o.gpus_per_point, o.threads)
        record = run_study(
            s,
            options,
            out,
            quick=o.quick,
            grow=o.grow,
            overwrite=o.overwrite,
            progress=o.progress,
            command=args.command_line,
            executor=executor,
        )
        print((out / "report.md").read_text())
        written = sorted(p.name for pattern in s.files for p in out.glob(pattern) if p.is_file())
        print(f"wrote {out}/: report.md, results.json, plan.json" + "".join(f", {f}" for f in written))
        for key, error in record.get("failed", {}).items():
            print(f"fixedhead {s.name}: point {key} failed: {error}", file=sys.stderr)
        if record.get("failed"):
            return 1
        if isinstance(record["summary"], dict) and record["summary"].get("passed") is False:
            if o.quick:  # seconds-sized models: the verdict means nothing, the run is a smoke test
                print(f"fixedhead {s.name}: the check failed, as --quick's untrained models may", file=sys.stderr)
                return 0
            print(f"fixedhead {s.name}: the check failed (see {out}/report.md)", file=sys.stderr)
            return 1
        return 0

    return add, run


def _quick_values(study) -> str:
    """What a kit study's ``--quick`` changes of its defaults, as options: ``--steps 40 --seeds 0``."""
    out = []
    for options, defaults in [(study.quick, study.Options())] + [
        (getattr(study.quick, f.name), getattr(study.Options(), f.name))
        for f in dataclasses.fields(study.Options)
        if dataclasses.is_dataclass(getattr(study.Options(), f.name))
    ]:
        for f in dataclasses.fields(options):
            value, default = getattr(options, f.name), getattr(defaults, f.name)
            if value != default and not dataclasses.is_dataclass(value):
                shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
                out.append(f"--{f.name.replace('_', '-')} {shown}".rstrip())
    return " ".join(out) or "nothing"


class _Removed(argparse.Action):
    """An option a command no longer takes: refused (exit status 2) with what replaces it."""

    def __init__(self, *args, why: str, **kw):
        super().__init__(*args, **kw)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is gone: {self.why}")


# -------------------------------------------------------------------------------------- widen
@_command
class WidenRun(_LoadsWeights):
    run_dir: str = field(metadata={"positional": True})
    """a fixedhead run directory (masked or causal LM)"""
    head_dim: int | list[int | None]
    """new head size d_p' >= the current one, or one per layer (64,64,128,128)"""
    output_dir: str = field(metadata={"metavar": "DIR"})
    """a new or empty folder (or an earlier widen output)"""
    overwrite: bool = False
    """replace an earlier `fixedhead widen` output there"""


def _widen_options(p):
    from .training.widen import WidenOptions

    add_options(p, WidenRun, title="the run and the output")
    add_options(p, WidenOptions, title="the new rows")


def _widen(args):
    """grow every head of a run to a larger head size d_p' with the same function (exactly)"""
    from .training.widen import WidenOptions, widen_run

    o, run = _read(args, WidenOptions), _read(args, WidenRun)
    record = widen_run(
        run.run_dir,
        run.head_dim,
        run.output_dir,
        init_std=o.init_std,
        seed=o.seed,
        overwrite=run.overwrite,
        allow_pickle=run.allow_pickle,
    )
    print(
        f"widened {run.run_dir}: head sizes {record['old_head_dims']} -> {record['new_head_dims']}; "
        f"wrote {run.output_dir}"
    )


# ------------------------------------------------------------------------------------- shrink
@_command
class ShrinkRun(_ShowsProgress):
    run_dir: str = field(metadata={"positional": True})
    """a fixedhead run directory (masked or causal LM)"""
    qk_head_dim: int
    """K: the new size of every head's queries and keys (values kept)"""
    output_dir: str = field(metadata={"metavar": "DIR"})
    """a new or empty folder (or an earlier shrink output)"""
    overwrite: bool = False
    """replace an earlier `fixedhead shrink` output there"""


def _shrink_options(p):
    from .shrink import ShrinkOptions

    add_options(p, ShrinkRun, title="the run and the output")
    add_options(p, ShrinkOptions, title="the cut and its fine-tuning")


def _shrink(args):
    """cut every head's queries and keys to size K (the realisable rank-K cut folded into the weights)"""
    from .shrink import ShrinkOptions, shrink_run

    o, run = _read(args, ShrinkOptions), _read(args, ShrinkRun)
    options = dict(overwrite=run.overwrite, progress=run.progress)
    record = shrink_run(run.run_dir, run.qk_head_dim, run.output_dir, **dataclasses.asdict(o), **options)
    print(
        f"shrunk {run.run_dir}: queries and keys {record['old_qk_head_dims']} -> {record['qk_head_dim']} "
        f"(values {record['v_head_dim']}); wrote {run.output_dir}"
    )


# ------------------------------------------------------------------------------------ studies
@_command
class ReportFolder:
    folder: str = field(metadata={"positional": True})
    """a study's output folder (results.json; a sweep's older sweep.json too)"""
    study: str | None = field(default=None, metadata={"choices": tuple(STUDIES)})
    """the study that wrote it, where its results do not say"""
    output_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    """where the report goes (default: FOLDER)"""


def _report_options(p):
    add_options(p, ReportFolder, title="the folder")


def _report(args):
    """the report, tables and figures of a study folder, rendered again from its per-point results"""
    from .runs import load_json_file
    from .studies.kit.study import PLAN_FILE, RESULTS_FILE, rerender
    from .studies.sweep import LEGACY_FILE, write_report

    o = _read(args, ReportFolder)
    folder = Path(o.folder)
    results = folder / RESULTS_FILE
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} {'is not a folder' if folder.exists() else 'does not exist'}")
    if not any((folder / f).is_file() for f in (RESULTS_FILE, PLAN_FILE, LEGACY_FILE)):
        raise FileNotFoundError(
            f"{folder} is not a study folder (no {PLAN_FILE} or {RESULTS_FILE}); give the --output-dir of one of "
            f"the studies: {', '.join(STUDIES)}"
        )
    if not results.is_file() and (folder / PLAN_FILE).is_file():
        raise FileNotFoundError(
            f"{folder} holds a study's plan but no point has finished ({RESULTS_FILE}): nothing to report"
        )
    meta = load_json_file(results, "study results").get("meta", {}) if results.is_file() else {}
    name = meta.get("study") or o.study or "sweep"
    if o.study and name != o.study:
        raise ValueError(f"{results} holds the results of `fixedhead {name}`, not of `fixedhead {o.study}`")
    out = Path(o.output_dir or folder)
    before = _file_times(out)
    if name == "sweep":  # a sweep written before the kit reads too
        write_report(o.folder, o.output_dir)
    else:
        rerender(study_class(name)(), folder, o.output_dir)
    after = _file_times(out)
    print(f"wrote {out}/: " + ", ".join(sorted(f for f in after if before.get(f) != after[f])))


def _file_times(folder: Path) -> dict[str, int]:
    """``{name: modification time}`` of the files directly in ``folder`` (none when it does not exist)."""
    return {p.name: p.stat().st_mtime_ns for p in folder.glob("*") if p.is_file()} if folder.is_dir() else {}


# ---------------------------------------------------------------------------------- export-onnx
@_command
class ExportRun:
    run: str = field(metadata={"positional": True})
    """a masked-LM pretraining run or a fine-tuned (sequence classification) run"""
    output_dir: str = field(metadata={"metavar": "DIR"})
    """a new or empty folder for the ONNX model"""
    overwrite: bool = False
    """replace an earlier export in --output-dir"""


def _export_onnx_options(p):
    from .training.export import OnnxExportOptions

    add_options(p, ExportRun, title="the run and the output")
    add_options(p, OnnxExportOptions, title="export and check")


def _export_onnx(args):
    """export an encoder run to ONNX (dynamic batch and length) and check its logits on ONNX Runtime"""
    from .training.export import OnnxExportOptions, export_onnx

    run = _read(args, ExportRun)
    record = export_onnx(run.run, run.output_dir, _read(args, OnnxExportOptions), run.overwrite)
    for check in record["checks"]:
        print(
            f"ONNX Runtime vs PyTorch, batch x n = {check['shape'][0]} x {check['shape'][1]}: "
            f"max |logit difference| {check['max_abs_diff']:.2e} (allowed {check['allowed']:.2e})"
        )
    print(f"wrote {run.output_dir}/model.onnx (+ model.onnx.data, tokenizer, onnx_export.json)")


# ---------------------------------------------------------------------------------------- main
#: command -> (its options, the function that calls one library function; its docstring is the help)
#: the tools (train, score, inspect, export one model); the studies follow, from fixedhead.studies.STUDIES
COMMANDS = {
    "count": (_count_options, _count),
    "pretrain": (_pretrain_options, _pretrain),
    "evaluate": (_evaluate_options, _evaluate),
    "analyze": (_analyze_options, _analyze),
    "rank-intervention": (_rank_intervention_options, _rank_intervention),
    "finetune": (_finetune_options, _finetune),
    "export-onnx": (_export_onnx_options, _export_onnx),
    "widen": (_widen_options, _widen),
    "shrink": (_shrink_options, _shrink),
    "report": (_report_options, _report),
}

#: what to do after Ctrl-C, for the commands that keep their finished work (every study on the kit too)
_RESUME_HINTS = {
    "pretrain": "rerun with --resume to continue from the newest checkpoint",
}


class _OneLineErrors(argparse.ArgumentParser):
    """argparse, but a usage error is one line with exit status 2, like every other error of the command."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``only``, only that command's options are built (a command's options
    import their dataclasses)."""
    parser = _OneLineErrors(
        prog="fixedhead",
        description="Fixed head size attention (Bhojanapalli et al., ICML 2020): train, compare, analyse.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineErrors)
    studies = {name: _kit_study(name) for name in STUDIES}  # read here: a study registered later is a command too
    for name, (add, func) in (COMMANDS | studies).items():
        text = " ".join((func.__doc__ or study_help(name)).split())  # a study's help is on its class
        p = sub.add_parser(name, help=text, description=text)
        if only in (None, name):
            add(p)
        p.set_defaults(func=func)
    return parser


def _error_message(e: Exception) -> str:
    """One line for a user error: our own messages as they are, the system's file-system errors with the path."""
    if isinstance(e, OSError) and e.strerror and e.filename:
        hint = {
            27: " (the disk or a file-size limit is full)",
            28: " (the disk is full)",
            30: " (a read-only file system)",
        }
        return f"{e.filename}: {e.strerror}{hint.get(e.errno, '')}"
    return str(e)


_FALSE = {"0", "false", "no", "off"}


def offline_unless_asked() -> None:
    """No command reaches a network unless the user asks (``HF_HUB_OFFLINE=0``): the model hub (hub kernels
    for ``flash_attention_*`` included), datasets' hub and telemetry are switched off for this process and its
    workers; the already-imported clients too, since they read their switches when imported."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _FALSE:
        return
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ[name] = "1"
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = sys.modules["datasets"].config.HF_DATASETS_OFFLINE = True


def main(argv=None) -> int:
    offline_unless_asked()
    words = sys.argv[1:] if argv is None else list(argv)
    command = next((w for w in words if not w.startswith("-")), "")  # the parser has no option before it
    parser = build_parser(only=command)
    if not command and not {"-h", "--help"} & set(words) and words:  # argparse would only ask for a command
        parser.error(f"unrecognized arguments: {' '.join(words)}")
    args, extra = parser.parse_known_args(words)
    if extra:  # named by the command they were given to (argparse names the top-level parser)
        commands = parser._subparsers._group_actions[0].choices
        (commands.get(getattr(args, "command", None)) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    # the command line as given, for the results files that record it (``main([...])`` from Python too)
    args.command_line = "fixedhead " + shlex.join(words)
    try:
        from .model.modeling import register_auto_classes  # as `import fixedhead` does outside the command

        register_auto_classes()
        if getattr(args, "threads", None) is not None:
            import torch

            torch.set_num_threads(positive_int("threads", args.threads))
        if getattr(args, "progress", True) is False:  # --no-progress: transformers' own bars (loading weights) too
            from .training.settings import transformers_progress_bars

            with transformers_progress_bars(False):
                return args.func(args) or 0
        return args.func(args) or 0
    except (ValueError, OSError) as e:  # OSError: a missing or occupied path, a full disk, a read-only folder
        message = in_option_words(_error_message(e), parser._subparsers._group_actions[0].choices[args.command])
        print(f"fixedhead {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        again = "rerun the same command to continue (finished points are reused)"
        hints = _RESUME_HINTS | dict.fromkeys(STUDIES, again)
        hint = f"; {hints[args.command]}" if args.command in hints else ""
        print(f"fixedhead {args.command}: interrupted{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
