"""The ``fixedhead`` command itself: how it is started, the options it checks before handing over
to a library function, and commands with no module of their own (``count``). Commands that
front a module are tested with it (``analyze`` in test_analysis.py, ``bottleneck`` in
test_theory.py, ``sweep``/``report`` in test_sweep.py, ...); bad values on the command line are
part of the table in test_bad_input.py."""

import argparse
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from _tiny_run import require_data
from fixedhead.cli import build_parser, main
from fixedhead.studies import STUDIES, study_class, study_help
from fixedhead.training import TrainSettings
from fixedhead.training.settings import report_to_integrations


@pytest.mark.parametrize("module", ["fixedhead", "fixedhead.cli"])
def test_runs_as_a_module(module, monkeypatch, capsys):
    """``python -m fixedhead`` (like the ``fixedhead`` script) and ``python -m fixedhead.cli`` (what
    torchrun / accelerate launch run) reach main()."""
    monkeypatch.setattr(sys, "argv", ["fixedhead", "--help"])
    for name in ("fixedhead.__main__", "fixedhead.cli"):  # run it fresh, as `python -m` does
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("pretrain", "evaluate", "finetune", "analyze", "compare", "count", "bottleneck", "sweep", "report"):
        assert command in out


_SCRIPT = Path(sys.executable).with_name("fixedhead")


@pytest.mark.parametrize("start", [["-m", "fixedhead"], [str(_SCRIPT)]], ids=["python -m fixedhead", "script"])
@pytest.mark.parametrize(
    "argv, status",
    [
        (["--help"], 0),
        (["pretrain", "--no-such-option"], 2),
        (["pretrain", "--help"], 0),
        (["evaluate", "--help"], 0),
        (["report", "--help"], 0),
        (["count", "--help"], 0),
    ],
)
def test_help_and_a_usage_error_import_neither_torch_nor_transformers(start, argv, status):
    """`fixedhead --help` and a usage error answer before any heavy import (seconds each: importing torch,
    and transformers' masking utilities import torch's compiler; benchmarks/bench_startup.py measures it)."""
    if not Path(start[-1]).is_file() and start[0] != "-m":
        pytest.skip("no fixedhead script beside this Python")
    done = subprocess.run([sys.executable, "-X", "importtime", *start, *argv], capture_output=True, text=True)
    assert done.returncode == status, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "fixedhead.cli" in imported  # the import log is read
    assert not imported & {"torch", "transformers", "numpy", "fixedhead.model.modeling"}, sorted(imported)


def test_the_command_registers_the_auto_classes_once_it_runs(capsys):
    """The command's own import skips the Auto-class registration that `import fixedhead` does; it registers
    before running a command, so a command that loads a run through transformers' Auto classes still can."""
    code = (
        "import sys; sys.argv = ['fixedhead']; import fixedhead, transformers; "
        "from transformers import AutoConfig; from transformers.models.auto.configuration_auto import CONFIG_MAPPING; "
        "before = 'fixedhead' in CONFIG_MAPPING; from fixedhead.cli import main; "
        "main(['count', '--preset', 'bert-large-h16']); print(before, 'fixedhead' in CONFIG_MAPPING)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "False True"


def test_import_fixedhead_offers_every_public_name():
    import fixedhead

    for name in fixedhead.__all__:
        assert getattr(fixedhead, name).__name__ == name
    with pytest.raises(AttributeError, match="no_such_name"):
        fixedhead.no_such_name  # noqa: B018


@pytest.mark.parametrize("command", list(STUDIES))
def test_a_study_s_help_is_read_without_importing_it(command):
    assert study_help(command) == study_class(command).help


@pytest.mark.parametrize(
    "argv, option",
    [
        (["compare", "--workers", "0"], "--workers"),
        (["compare", "--threads", "0"], "--threads"),
        (["compare", "--steps", "0"], "--steps"),
        (["pretrain", "--output-dir", "out", "--max-steps", "0"], "--max-steps"),
        (["shrink", "run", "--qk-head-dim", "0", "--output-dir", "out"], "--qk-head-dim"),
        (["count", "--hidden-size", "0", "--num-attention-heads", "2"], "--hidden-size"),
    ],
)
def test_an_error_names_the_option_as_typed(argv, option, capsys, tmp_path, monkeypatch):
    """One wording for a bad value, whichever dataclass or check refuses it: the option as the user typed it."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err.endswith(f": error: {option} must be a positive int, got 0\n")


def test_an_option_name_inside_a_sentence_is_left_alone(tmp_path, capsys):
    assert main(["pretrain", "--output-dir", str(tmp_path / "run"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err


@pytest.mark.parametrize("command", list(build_parser()._subparsers._group_actions[0].choices))
def test_help_says_what_a_user_types(command):
    """`--help` names no Python constant or module (the choices are listed beside the option) and says what a
    default left to something else is, not "None"."""
    text = _subparser(command).format_help()
    assert not re.search(r"\bNone\b|[A-Z]_PRESETS\b|\bfixedhead\.[a-z]", text), text


@pytest.mark.parametrize("command", list(build_parser()._subparsers._group_actions[0].choices))
def test_help_names_values_by_their_kind_not_by_their_field(command):
    """An option's value in `--help` is N, X, PATH, FIELD, NAME, a list of choices or a metavar its field names,
    never its field's name in capitals (``[HEAD_SIZE_FAMILIES ...]``, ``TEXT_FIELD``)."""
    parser = _subparser(command)
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and action.help != argparse.SUPPRESS:
            kind = action.metavar in ("N", "X")  # --n N: the int's own name
            assert action.choices or kind or action.metavar not in (None, action.dest.upper()), (command, action.dest)


def test_help_metavars_say_what_to_type():
    usage = _subparser("pretrain").format_usage() + _subparser("scaling").format_usage()
    for shown in ("--corpus PATH", "--text-field FIELD", "--report-to [NAME ...]", "--preset NAME", "--dropout X"):
        assert shown in usage, shown
    assert "--head-size-families [NAME ...]" in usage and "TEXT_FIELD" not in usage, usage


def test_preset_help_lists_the_names_and_dropout_one_default():
    from fixedhead.model.paper_presets import PAPER_PRESETS

    for command in ("count", "pretrain"):
        (preset,) = [a for a in _subparser(command)._actions if a.dest == "preset"]
        assert all(name in preset.help for name in PAPER_PRESETS), preset.help
    (dropout,) = [a for a in _subparser("pretrain")._actions if a.dest == "dropout"]
    assert dropout.help.count("default") == 1 and "(default: 0.0)" in dropout.help, dropout.help


def test_the_corpus_help_gives_the_default_path():
    (corpus,) = [a for a in _subparser("pretrain")._actions if a.dest == "corpus"]
    assert "$FIXEDHEAD_DATA_DIR/pretrain/gutenberg_en_books.jsonl.gz" in corpus.help


def test_count_a_preset_and_refuse_sizes_that_do_not_divide(capsys):
    assert main(["count", "--preset", "bert-large-h16"]) == 0
    assert "336,224,058" in capsys.readouterr().out
    assert main(["count", "--hidden-size", "1024", "--num-attention-heads", "12"]) == 2
    assert "got --hidden-size 1024 and --num-attention-heads 12" in capsys.readouterr().err


def test_report_on_a_folder_that_is_not_a_study_says_so_and_lists_the_studies(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is not a study folder (no plan.json or results.json)" in err and "sweep results" not in err
    assert all(name in err for name in STUDIES) and len(err.splitlines()) == 1
    assert main(["report", str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == f"fixedhead report: error: {tmp_path / 'gone'} does not exist\n"
    (tmp_path / "file.md").write_text("x")
    assert main(["report", str(tmp_path / "file.md")]) == 2
    assert capsys.readouterr().err == f"fixedhead report: error: {tmp_path / 'file.md'} is not a folder\n"


def test_report_to_is_passed_to_the_trainer_and_checked_early(tmp_path, capsys):

    assert TrainSettings(report_to=["tensorboard"]).training_arguments(tmp_path).report_to == ["tensorboard"]
    assert TrainSettings(report_to=[]).training_arguments(tmp_path).report_to == []
    assert report_to_integrations(["none"]) == [] and report_to_integrations(["tensorboard"]) == ["tensorboard"]
    rc = main(["pretrain", "--output-dir", str(tmp_path / "r"), "--report-to", "nosuchtracker"])
    assert rc == 2 and "--report-to nosuchtracker: unknown integration" in capsys.readouterr().err
    from transformers.integrations import is_wandb_available

    if not is_wandb_available():
        rc = main(["pretrain", "--output-dir", str(tmp_path / "r"), "--report-to", "wandb"])
        assert rc == 2 and "wandb package is not installed" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before any work


# bert-large-h16 as the paper counts it (Table 1; test_count_a_preset_... above), and the parts that
# the size options change, from the formula in count_parameters' docstring with d = 1024, f = 4d:
# a layer is 4d² + 4d (attention) + 2·d·f + f + d (feed-forward) + 4d (LayerNorms) = 12d² + 13d;
# a vocabulary entry is d (embedding) + 1 (MLM output bias); a position is d
BERT_LARGE_H16 = 336_224_058
D = 1024


@pytest.mark.parametrize(
    "options,expected",
    [
        (["--num-hidden-layers", "12"], BERT_LARGE_H16 - 12 * (12 * D**2 + 13 * D)),
        (["--intermediate-size", "1024"], BERT_LARGE_H16 - 24 * (2 * D * (4 * D - 1024) + (4 * D - 1024))),
        (
            ["--vocab-size", "1000", "--max-position-embeddings", "128"],
            BERT_LARGE_H16 - (30522 - 1000) * (D + 1) - (512 - 128) * D,
        ),
    ],
    ids=["layers", "ffn", "vocab-positions"],
)
def test_count_applies_size_options_to_a_preset(options, expected, capsys):
    assert main(["count", "--preset", "bert-large-h16"] + options) == 0
    out = capsys.readouterr().out
    assert f"{expected:,}" in out
    assert f"{BERT_LARGE_H16:,}" not in out and "336M" not in out  # no paper column for a changed preset
    assert "in place of the preset's own" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["count", "--hidden-size", "64", "--num-attention-heads", "4", "--intermediate-size", "0"],
            "--intermediate-size must be a positive int, got 0",
        ),
        (["count", "--preset", "bert-large-h16", "--intermediate-size", "0"], "--intermediate-size must be a positive"),
        (
            ["count", "--preset", "bert-large-h16", "--num-hidden-layers", "-1"],
            "--num-hidden-layers must be a positive",
        ),
        (["count", "--preset", "bert-large-h16", "--head-dim", "32"], "--preset fixes d, h and d_p; drop --head-dim"),
        (["count", "--num-hidden-layers", "12"], "--num-hidden-layers also needs --hidden-size, --num-attention-heads"),
        (["count", "--hidden-size", "64"], "--hidden-size also needs --num-attention-heads"),
        (["count", "--hidden-size", "-4"], "--hidden-size must be a positive int, got -4"),
        (["count", "--num-attention-heads", "0"], "--num-attention-heads must be a positive int, got 0"),
        (
            ["pretrain", "--output-dir", "never-made", "--intermediate-size", "0"],
            "--intermediate-size must be a positive",
        ),
    ],
    ids=[
        "intermediate-0",
        "preset-intermediate-0",
        "preset-layers-negative",
        "preset-head-dim",
        "layers-alone",
        "hidden-size-alone",
        "hidden-size-negative-alone",
        "heads-0-alone",
        "pretrain-intermediate-0",
    ],
)
def test_count_refuses_bad_sizes_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""


def test_report_to_drops_repeats_and_takes_none_alone(tmp_path, capsys):

    # a repeated integration would be registered (and log every scalar) twice
    assert report_to_integrations(["tensorboard", "tensorboard"]) == ["tensorboard"]
    settings = TrainSettings(report_to=report_to_integrations(["tensorboard", "tensorboard"]))
    assert settings.training_arguments(tmp_path).report_to == ["tensorboard"]
    # none is transformers' own word for no logging, also when repeated
    args = build_parser().parse_args(["pretrain", "--output-dir", "x", "--report-to", "none"])
    assert report_to_integrations(args.report_to) == [] and TrainSettings(report_to=args.report_to).report_to == []
    assert report_to_integrations(["none", "none"]) == []
    for values, word, other in [
        (["tensorboard", "none"], "none", "tensorboard"),
        (["none", "tensorboard", "none"], "none", "tensorboard"),
        (["all", "tensorboard"], "all", "tensorboard"),
    ]:
        with pytest.raises(ValueError) as info:
            report_to_integrations(values)
        message = str(info.value)
        assert f"{word} alone" in message and other in message and "unknown" not in message, message
    rc = main(["pretrain", "--output-dir", str(tmp_path / "r"), "--report-to", "tensorboard", "none"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--report-to tensorboard none: none turns reporting off" in err, err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_pretrain_options_are_the_settings_fields_with_their_defaults():
    """An option left out is the dataclass default (one default: `fixedhead pretrain` and
    `pretrain()` train alike); each given option reaches its field."""
    from fixedhead.data import DataSettings
    from fixedhead.options import given
    from fixedhead.training import ModelSettings

    args = build_parser().parse_args(["pretrain", "--output-dir", "x"])
    assert given(args, TrainSettings) == given(args, DataSettings) == given(args, ModelSettings) == {}
    argv = ["--learning-rate", "5e-4", "--no-lowercase", "--head-dim", "8,none", "--report-to", "none", "--bf16"]
    args = build_parser().parse_args(["pretrain", "--output-dir", "x", *argv])
    assert given(args, TrainSettings) == {"learning_rate": 5e-4, "report_to": ["none"], "bf16": True}
    assert given(args, DataSettings) == {"lowercase": False} and given(args, ModelSettings) == {"head_dim": [8, None]}
    assert TrainSettings().learning_rate == 2e-3  # the masked recipe's rate (docs/performance.md, row b)


def test_study_commands_share_one_group_of_options():
    parser = build_parser()
    shared = ["--seeds", "3", "--steps", "5", "--threads", "1", "--overwrite", "--output-dir", "o"]
    for command, preset in [
        ("sweep", "cpu-clm"),
        ("widen-experiment", "cpu"),
    ]:
        args = parser.parse_args([command, "--preset", preset, *shared])
        assert (args.preset, args.seeds, args.steps, args.threads, args.overwrite, args.output_dir) == (
            preset,
            [3],
            5,
            1,
            True,
            "o",
        )
    args = parser.parse_args(["farthest-point", "--quick", *shared])
    assert (args.quick, args.seeds, args.steps, args.threads, args.overwrite, args.output_dir) == (
        True,
        [3],
        5,
        1,
        True,
        "o",
    )
    args = parser.parse_args(["bottleneck", "--seeds", "3", "--threads", "1", "--output-dir", "o"])
    assert (args.seeds, args.threads, args.output_dir) == ([3], 1, "o")
    # the names these options had before, still accepted
    args = parser.parse_args(["compare", "--max-steps", "7", "--seed", "2"])
    assert (args.steps, args.seed) == (7, 2)
    assert parser.parse_args(["sweep", "--max-steps", "7"]).steps == 7


ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(
    r"fixedhead(?:\.cli)? ((?:count|pretrain|evaluate|compare|bottleneck|analyze|finetune|sweep|report|"
    r"farthest-point|widen|widen-experiment|shrink)\b[^`\n\"]*)"
)


def documented_commands() -> set[tuple[str, bool]]:
    """Every `fixedhead ...` command line in the README, the Makefile, docs/ (prose, recorded
    commands in results) and examples/, without synopses ([--option], {a,b}, ..., $VARS), as ``(command,
    recorded)``: recorded = read from a study's record (its results or report), where an option the command
    has since dropped stays as it was run."""
    files = ["README.md", "Makefile", *(ROOT / "docs").rglob("*.md"), *(ROOT / "docs").rglob("*.json")]
    found = set()
    for path in [ROOT / f for f in files] + sorted((ROOT / "examples").glob("*.py")):
        text = Path(path).read_text(encoding="utf-8").replace("\\\n", " ")
        recorded = Path(path).name in ("results.json", "report.md")
        for m in COMMAND.finditer(text):
            command = re.split(r"\s#|\s&&|\s\||;|\s\(|\)", m.group(1))[0].strip()
            if not re.search(r"[\[\]{}$<>…]|\.\.\.", command):
                found.add((command, recorded))
    return found


def test_every_documented_command_line_parses(capsys):
    """Prose may name a command without its required arguments (`fixedhead analyze`); every option
    and value written in the docs must still be accepted."""
    commands = documented_commands()
    assert len(commands) > 30 and any("--init-from" in c for c, _ in commands)
    for command, recorded in sorted(commands):
        try:
            build_parser().parse_args(command.split())
        except SystemExit:
            err = capsys.readouterr().err
            allowed = r"arguments are required|expected one argument \(see" + (r"| is gone: " if recorded else "")
            assert re.search(allowed, err), (command, err)


@pytest.mark.parametrize(
    "flags, message",
    [(["--resume"], "nothing to resume"), (["--resume", "--overwrite"], "contradict each other")],
    ids=["resume-nothing", "resume-and-overwrite"],
)
def test_pretrain_refuses_contradicting_flags_before_preparing_data(flags, message, tmp_path, monkeypatch, capsys):
    import fixedhead.training.command as command

    def prepared_anyway(*a, **k):
        raise AssertionError("the corpus was prepared before the flags were checked")

    monkeypatch.setattr(command, "prepare_data", prepared_anyway)
    assert main(["pretrain", "--output-dir", str(tmp_path / "run"), "--max-steps", "1", *flags]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_kit_studies_take_one_default_folder_from_the_command_line_and_python(monkeypatch):
    """runs/scaling-PRESET from both; --quick: runs/scaling-quick, never the real folder; compare: runs/compare."""
    import fixedhead.studies.kit.study as kit_study
    from fixedhead.studies.scaling import ScalingStudy

    claimed = []

    def claim(out, *args, **kw):
        claimed.append(Path(out))
        raise ValueError("claimed")

    monkeypatch.setattr(kit_study, "claim_output_dir", claim)
    assert main(["scaling"]) == 2 and main(["scaling", "--preset", "gpu"]) == 2 and main(["scaling", "--quick"]) == 2
    with pytest.raises(ValueError, match="claimed"):
        kit_study.run_study(ScalingStudy())
    assert claimed == [
        Path(p) for p in ("runs/scaling-cpu", "runs/scaling-gpu", "runs/scaling-quick", "runs/scaling-cpu")
    ]
    # compare (make run) writes to runs/compare whatever its preset, never to it with --quick
    from fixedhead.studies.compare import CompareStudy

    claimed.clear()
    assert (
        main(["compare"]) == 2 and main(["compare", "--preset", "cpu-mlm"]) == 2 and main(["compare", "--quick"]) == 2
    )
    with pytest.raises(ValueError, match="claimed"):
        kit_study.run_study(CompareStudy())
    assert claimed == [Path(p) for p in ("runs/compare", "runs/compare", "runs/compare-quick", "runs/compare")]
    # sweep: runs/sweep-PRESET (it used to be runs/sweep from Python); it reads its GLUE task before the folder
    from fixedhead.data.glue import glue_path
    from fixedhead.studies.sweep import SweepStudy

    require_data(glue_path("sst2", "dev"), glue_path("sst2", "train"))

    claimed.clear()
    assert main(["sweep"]) == 2 and main(["sweep", "--preset", "cpu-clm"]) == 2 and main(["sweep", "--quick"]) == 2
    with pytest.raises(ValueError, match="claimed"):
        kit_study.run_study(SweepStudy())
    assert claimed == [
        Path(p) for p in ("runs/sweep-cpu-mlm", "runs/sweep-cpu-clm", "runs/sweep-quick", "runs/sweep-cpu-mlm")
    ]


def _subparser(command):
    return build_parser()._subparsers._group_actions[0].choices[command]


def _dataclasses_of(command):
    """The dataclasses a command's options are read from (kit studies: their Options and nested recipes, and
    the options every study shares)."""
    from fixedhead import cli
    from fixedhead.data import DataSettings
    from fixedhead.model.sizes import CountSizes
    from fixedhead.options import nested
    from fixedhead.training import ModelSettings
    from fixedhead.training.finetune import FinetuneSettings

    if command in STUDIES:
        options = study_class(command).Options
        return [options, *nested(options).values(), cli.StudyRunning]
    from fixedhead.diagnostics.analysis import AnalyzeOptions
    from fixedhead.diagnostics.intervention import RankInterventionOptions
    from fixedhead.shrink import ShrinkOptions
    from fixedhead.training.export import OnnxExportOptions
    from fixedhead.training.widen import WidenOptions

    return {
        "count": [CountSizes],
        "pretrain": [TrainSettings, DataSettings, ModelSettings, cli.PretrainRun],
        "evaluate": [cli.EvaluateRun],
        "finetune": [FinetuneSettings, cli.FinetuneRun],
        "export-onnx": [OnnxExportOptions, cli.ExportRun],
        "analyze": [AnalyzeOptions, cli.AnalyzeRun],
        "rank-intervention": [RankInterventionOptions, cli.RankInterventionRuns],
        "widen": [WidenOptions, cli.WidenRun],
        "shrink": [ShrinkOptions, cli.ShrinkRun],
        "report": [cli.ReportFolder],
    }[command]


_WITH_DATACLASS = list(build_parser()._subparsers._group_actions[0].choices)  # every command


@pytest.mark.parametrize("command", _WITH_DATACLASS)
def test_every_option_is_a_dataclass_field(command):
    """No option is written by hand: each is a field of a dataclass, with its default and help written once
    (a refused old name, hidden from --help, is not an option)."""
    import dataclasses

    fields = {f.name for cls in _dataclasses_of(command) for f in dataclasses.fields(cls)}
    options = {a.dest for a in _subparser(command)._actions if a.help != argparse.SUPPRESS and a.dest != "help"}
    assert options <= fields, sorted(options - fields)


@pytest.mark.parametrize("command", _WITH_DATACLASS)
def test_every_option_shows_its_dataclass_fields_default(command):
    """`fixedhead COMMAND --help` shows each field's default as the dataclass has it (read, not copied)."""
    import dataclasses

    actions = {a.dest: a for a in _subparser(command)._actions}
    checked = 0
    for cls in _dataclasses_of(command):
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.type) or f.name not in actions:
                continue
            action = actions[f.name]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # a required option
                assert action.required or not action.option_strings, f.name
                checked += 1
                continue
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            if isinstance(default, bool):
                assert (action.option_strings[0].startswith("--no-")) == default, f.name
            elif default not in (None, "", [], ()):
                shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
                assert f"(default: {shown})" in action.help, (f.name, action.help)
            checked += 1
    assert checked >= 1


def test_a_kit_study_reads_its_options_nested_recipe_included():
    from fixedhead.options import options_from
    from fixedhead.studies.farthest_point.known_rank import KnownRankCheck

    parser = build_parser()
    assert options_from(parser.parse_args(["known-rank"]), KnownRankCheck()) == KnownRankCheck()
    args = parser.parse_args(["known-rank", "--seeds", "1", "2", "--steps", "50", "--betas", "0.8", "0.9"])
    got = options_from(args, KnownRankCheck())
    assert got.seeds == (1, 2) and got.recipe.steps == 50 and got.recipe.betas == (0.8, 0.9)
    assert got.recipe.batch_size == KnownRankCheck().recipe.batch_size


@pytest.mark.parametrize(
    "argv, words",
    [
        (["bottleneck", "--max-iter", "0"], "--max-iter must be"),
        (["known-rank", "--rank", "4", "--num-points", "4", "--head-dims", "4"], "--rank = 4 needs --num-points"),
        (["seq-len", "--shared-rate", "-1"], "--shared-rate must be"),
    ],
)
def test_a_kit_study_names_a_bad_value_by_its_option(argv, words, capsys, tmp_path):
    assert main([*argv, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()  # refused before the folder is touched


def test_quick_says_what_it_sets(capsys):
    """A kit study's --quick help names the options it changes, read from its quick Options."""
    from fixedhead.studies.farthest_point import QUICK

    for command, expected in (
        ("scaling", "(it sets --preset tiny)"),
        ("farthest-point", f"--steps {QUICK.recipe.steps}"),
    ):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert expected in " ".join(capsys.readouterr().out.split()).replace("- ", "-")


@pytest.mark.parametrize(
    ("command", "module"),
    [("compare", "compare"), ("scaling", "scaling"), ("widen-experiment", "widening")],
)
def test_a_preset_is_named_options_and_help_lists_the_names(command, module, capsys):
    """Each preset is an Options value of its study: --preset NAME runs exactly those options, and --help lists
    every name."""
    import importlib

    m = importlib.import_module(f"fixedhead.studies.{module}")
    study = study_class(command)()
    for name, preset in m.PRESETS.items():
        assert preset.preset == name and study.resolve(study.Options(preset=name)) == study.resolve(preset)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert f"--preset {{{','.join(m.PRESETS)}}}" in capsys.readouterr().out


def test_an_options_checks_come_from_its_field_metadata_and_show_in_help():
    """check_fields reads a field's metadata (each value of a tuple, None passing); --help says the same."""
    import dataclasses

    from fixedhead.checks import check_fields
    from fixedhead.options import add_options

    @dataclasses.dataclass(frozen=True)
    class Opts:
        seeds: tuple[int, ...] = dataclasses.field(
            default=(0,), metadata={"check": "non_negative", "nonempty": True, "distinct": True}
        )
        """seeds"""
        steps: int | None = dataclasses.field(default=None, metadata={"check": "positive"})
        """steps"""
        rate: float = dataclasses.field(default=1.0, metadata={"check": "positive_float"})
        """rate"""

        def __post_init__(self):
            check_fields(self)

    Opts()
    for bad, message in [
        (dict(seeds=()), "seeds must hold at least one value, got none"),
        (dict(seeds=(1, 1)), "seeds must be distinct, got [1, 1]"),
        (dict(seeds=(0, -1)), "seeds must be an int >= 0, got -1"),
        (dict(steps=0), "steps must be a positive int, got 0"),
        (dict(rate=float("nan")), "rate must be a positive finite number, got nan"),
    ]:
        with pytest.raises(ValueError) as e:
            Opts(**bad)
        assert str(e.value) == message
    parser = argparse.ArgumentParser()
    add_options(parser, Opts)
    text = " ".join(parser.format_help().split())
    assert "seeds; an int >= 0, nonempty, distinct" in text and "steps; a positive int" in text
    # a study's options say so too
    assert "an int >= 0, nonempty, distinct" in " ".join(_subparser("sweep").format_help().split())


def test_report_says_every_file_it_wrote_and_only_those(tmp_path, capsys):
    """`fixedhead report` re-renders the tables and figures too: it names each file it wrote, none it left."""
    import shutil

    committed = Path(__file__).resolve().parents[1] / "docs" / "results" / "known-rank"
    folder = tmp_path / "known-rank"
    shutil.copytree(committed, folder)
    assert main(["report", str(folder), "--output-dir", str(tmp_path / "r")]) == 0
    written = sorted(p.name for p in (tmp_path / "r").iterdir() if not p.name.startswith("."))
    assert written == ["known_rank.csv", "known_rank.png", "report.md"]
    assert capsys.readouterr().out == f"wrote {tmp_path / 'r'}/: {', '.join(written)}\n"
    assert main(["report", str(folder)]) == 0  # in place: results.json and the README are read, not written
    assert capsys.readouterr().out == f"wrote {folder}/: {', '.join(written)}\n"


@pytest.mark.parametrize(
    "message, words",
    [
        ("head_dim=[8, 16] is refused", "--head-dim 8,16 is refused"),  # the one word --head-dim takes
        ("got 3 (head_dim=[None, 8, 9])", "got 3 (--head-dim none,8,9)"),  # none: that layer's d/h
        ("standard attention (head_dim=None) needs", "standard attention (no --head-dim) needs"),
        ("parametrization='mup' needs mup_base_head_dim", "--parametrization mup needs --mup-base-head-dim"),
        ("report_to: got ['x', 'y']", "--report-to: got x y"),
        ("learning rates: got (0.001,)", "learning rates: got 0.001"),
        (
            "attention_scale must be a positive number or None, got -1.0",
            "--attention-scale must be a positive number or left out, got -1.0",
        ),
        ("hidden_size [30] and num_attention_heads [2, 4]", "--hidden-size 30 and --num-attention-heads 2 4"),
        ("warmup_ratio must be in (0, 1), got 2.0", "--warmup-ratio must be in (0, 1), got 2.0"),  # an interval
        ("/runs/max_steps/head_dim.json: no 'head_dim' key", "/runs/max_steps/head_dim.json: no 'head_dim' key"),
        ("the model and the text", "the model and the text"),  # one-word fields are words in a sentence
    ],
)
def test_an_error_is_rewritten_in_the_command_lines_words(message, words):
    from fixedhead.options import in_option_words

    assert in_option_words(message, _subparser("pretrain")) == words
