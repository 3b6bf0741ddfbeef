"""The toy study of docs/writing-a-study.md (examples/toy_study.py): one file on the kit, run from Python and,
with one registry line, as a ``fixedhead`` command."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from toy_study import LogitRankOptions, LogitRankStudy

from fixedhead.cli import main
from fixedhead.studies import STUDIES
from fixedhead.studies.kit.study import run_study


def test_the_toy_study_measures_the_bound_and_resumes(tmp_path):
    options = LogitRankOptions(n=12, hidden_size=16, head_dims=(2, 8, 12, 16), seeds=(0, 1))
    record = run_study(LogitRankStudy(), options, tmp_path / "t", progress=False)
    # the bound is the paper's (rank of a product of [n, d_p] and [d_p, n] factors); NumPy's own rank agrees
    rng = np.random.default_rng(1)
    x = rng.standard_normal((12, 16))
    w_q, w_k = rng.standard_normal((2, 16, 8)) / 4.0
    assert record["runs"]["dp8-s1"]["logit_rank"] == np.linalg.matrix_rank((x @ w_q) @ (x @ w_k).T) == 8
    rows = {r["head_dim"]: r for r in record["summary"]["rows"]}
    assert [rows[d]["bound"] for d in (2, 8, 12, 16)] == [2, 8, 12, 12] and rows[16]["ranks"] == [12, 12]
    assert record["summary"]["passed"] and not record["missing"]
    report = (tmp_path / "t" / "report.md").read_text()
    assert "| 16 | 12 | 12, 12 |" in report and "plan.json" in report  # the kit adds the plan's line
    assert (tmp_path / "t" / "logit_rank.csv").read_text().count("\n") == 1 + 8
    grown = LogitRankOptions(n=12, hidden_size=16, head_dims=(2, 8, 12, 16), seeds=(0, 1, 2))
    with pytest.raises(FileExistsError, match="--grow"):
        run_study(LogitRankStudy(), grown, tmp_path / "t", progress=False)
    again = run_study(LogitRankStudy(), grown, tmp_path / "t", grow=True, progress=False)
    assert len(again["runs"]) == 12 and again["plan_history"]


def test_one_registry_line_makes_it_a_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(STUDIES, "logit-rank", "toy_study:LogitRankStudy")
    assert main(["logit-rank", "--quick", "--output-dir", str(tmp_path / "q"), "--no-progress"]) == 0
    assert "Every head's logits reach the bound" in capsys.readouterr().out
    saved = json.loads((tmp_path / "q" / "results.json").read_text())
    assert sorted(saved["runs"]) == ["dp4-s0", "dp64-s0"] and saved["meta"]["command"].startswith(
        "fixedhead logit-rank"
    )
    assert main(["logit-rank", "--head-dims", "0", "--output-dir", str(tmp_path / "bad")]) == 2  # a bad value named
    assert not (tmp_path / "bad").exists()  # nothing written
    assert "head_dims" in capsys.readouterr().err.replace("-", "_")


def test_run_as_a_script_it_records_its_command_as_given(tmp_path, monkeypatch, capsys):
    """``python examples/toy_study.py --quick``: the recorded command says --quick, and the report's title names
    no command (``fixedhead logit-rank`` exists only once registered)."""
    import runpy

    out = tmp_path / "q"
    monkeypatch.setattr(sys, "argv", ["examples/toy_study.py", "--quick", "--output-dir", str(out)])
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "toy_study.py"), run_name="__main__")
    command = json.loads((out / "results.json").read_text())["meta"]["command"]
    assert command == f"python examples/toy_study.py --quick --output-dir {out}"
    report = (out / "report.md").read_text()
    assert f"Command: `{command}`" in report and "fixedhead logit-rank" not in report
    assert "Every head's logits reach the bound" in capsys.readouterr().out


def test_run_as_a_script_a_refusal_is_one_line_and_exit_status_2(tmp_path, monkeypatch, capsys):
    """The script refuses as the fixedhead command does: one line on stderr, exit status 2, no traceback; the
    --grow the refusal names is an option of the script too."""
    import runpy

    script = str(Path(__file__).resolve().parents[2] / "examples" / "toy_study.py")
    out = str(tmp_path / "q")
    for argv in (["--quick", "--output-dir", out], ["--output-dir", out]):  # the full plan after the quick one
        monkeypatch.setattr(sys, "argv", ["examples/toy_study.py", *argv])
        capsys.readouterr()
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            status = e.code
        else:
            status = 0
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("toy_study.py: error: ") and "pass --grow" in err
    monkeypatch.setattr(sys, "argv", ["examples/toy_study.py", "--output-dir", out, "--grow"])
    runpy.run_path(script, run_name="__main__")
    assert len(json.loads((tmp_path / "q" / "results.json").read_text())["runs"]) == 15


def test_asking_for_fewer_points_of_a_finished_study_is_not_called_growth(tmp_path):
    """Options that ask for a subset of the folder's points (one seed of three) are refused with what a subset
    means, not "pass --grow to extend"; --grow then makes the plan those points and the report covers them."""
    full = LogitRankOptions(n=12, hidden_size=16, head_dims=(2, 8), seeds=(0, 1, 2))
    run_study(LogitRankStudy(), full, tmp_path / "t", progress=False)
    before = (tmp_path / "t" / "plan.json").read_text()
    one_seed = LogitRankOptions(n=12, hidden_size=16, head_dims=(2, 8), seeds=(0,))
    with pytest.raises(FileExistsError) as info:
        run_study(LogitRankStudy(), one_seed, tmp_path / "t", progress=False)
    message = str(info.value)
    assert "holds a study of 6 points (6 finished); these options ask for 2 of them" in message, message
    assert "extend" not in message and "report.md" in message
    assert (tmp_path / "t" / "plan.json").read_text() == before  # nothing was changed
    record = run_study(LogitRankStudy(), one_seed, tmp_path / "t", grow=True, progress=False)
    assert record["missing"] == [] and [r["ranks"] for r in record["summary"]["rows"]] == [[2], [8]]
    assert len(record["runs"]) == 6  # the other seeds' results are kept
