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
