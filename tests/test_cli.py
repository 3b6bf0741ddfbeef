"""The ``fixedhead`` command itself: how it is started, the options it checks before handing over
to a library function, and commands with no module of their own (``count``). Commands that
front a module are tested with it (``analyze`` in test_analysis.py, ``bottleneck`` in
test_theory.py, ``sweep``/``report`` in test_sweep.py, ...); bad values on the command line are
part of the table in test_bad_input.py."""

import runpy
import sys

import pytest

from fixedhead.cli import main
from fixedhead.training import TrainSettings


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


def test_count_a_preset_and_refuse_sizes_that_do_not_divide(capsys):
    assert main(["count", "--preset", "bert-large-h16"]) == 0
    assert "336,224,058" in capsys.readouterr().out
    assert main(["count", "--hidden-size", "1024", "--num-attention-heads", "12"]) == 2
    assert "num_attention_heads=12" in capsys.readouterr().err


def test_report_to_is_passed_to_the_trainer_and_checked_early(tmp_path, capsys):
    from fixedhead.cli import report_to_integrations
    from fixedhead.training.pretrain import _training_args

    assert _training_args(tmp_path, TrainSettings(report_to=["tensorboard"])).report_to == ["tensorboard"]
    assert _training_args(tmp_path, TrainSettings(report_to=[])).report_to == []
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
            "intermediate_size must be a positive int, got 0",
        ),
        (["count", "--preset", "bert-large-h16", "--intermediate-size", "0"], "intermediate_size must be a positive"),
        (["count", "--preset", "bert-large-h16", "--num-hidden-layers", "-1"], "num_hidden_layers must be a positive"),
        (["count", "--preset", "bert-large-h16", "--head-dim", "32"], "--preset fixes d, h and d_p; drop --head-dim"),
        (["count", "--num-hidden-layers", "12"], "--num-hidden-layers needs --hidden-size and --num-attention-heads"),
        (
            ["pretrain", "--output-dir", "never-made", "--intermediate-size", "0"],
            "intermediate_size must be a positive",
        ),
    ],
    ids=[
        "intermediate-0",
        "preset-intermediate-0",
        "preset-layers-negative",
        "preset-head-dim",
        "layers-alone",
        "pretrain-intermediate-0",
    ],
)
def test_count_refuses_bad_sizes_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""


def test_report_to_drops_repeats_and_takes_none_alone(tmp_path, capsys):
    from fixedhead.cli import build_parser, report_to_integrations
    from fixedhead.training.pretrain import _training_args

    # a repeated integration would be registered (and log every scalar) twice
    assert report_to_integrations(["tensorboard", "tensorboard"]) == ["tensorboard"]
    settings = TrainSettings(report_to=report_to_integrations(["tensorboard", "tensorboard"]))
    assert _training_args(tmp_path, settings).report_to == ["tensorboard"]
    # none is transformers' own word for no logging, also when repeated
    args = build_parser().parse_args(["pretrain", "--output-dir", "x", "--report-to", "none"])
    assert report_to_integrations(args.report_to) == []
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
