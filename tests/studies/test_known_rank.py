"""The rank intervention's known-answer check (fixedhead known-rank): its plumbing, its readings of the
needed rank and its command. Whether trained models need rank r is a learned outcome: it lives in
docs/results/known-rank, not in an assertion."""

from __future__ import annotations

import json

import pytest
import torch

from fixedhead.cli import main
from fixedhead.data.synthetic import FarthestPointTask
from fixedhead.studies.farthest_point.known_rank import (
    QUICK,
    KnownRankCheck,
    KnownRankStudy,
    rank_sweep,
    report_markdown,
)
from fixedhead.studies.farthest_point.set_attention import Cell, SetAttentionModel, evaluate, train_cell
from fixedhead.studies.kit.study import run_study


@pytest.mark.parametrize(("head_dim", "points"), [(3, 8), (8, 4)])
def test_cutting_a_set_model_at_or_above_min_d_p_n_minus_1_changes_nothing_and_below_it_does(head_dim, points):
    """The cut itself, not rank_sweep (which reads the model's own metrics from k = min(d_p, N − 1) on): the
    row-centred N × N logits have rank at most min(d_p, N − 1), so cutting there changes nothing but float
    rounding (d_p = 3 < N − 1, and N − 1 = 3 < d_p = 8); one rank below changes the model."""
    from fixedhead.diagnostics.intervention import attention_modules, truncated_logits

    torch.manual_seed(0)
    model = SetAttentionModel(8, 4, head_dim, logit_scale=16.0).eval()
    task = FarthestPointTask(8, 3, points)
    sets = task.sample(64, torch.Generator().manual_seed(1), task.projection)
    full, exact = evaluate(model, sets), min(head_dim, points - 1)
    modules = attention_modules(model, sets[0])
    cut = {}
    with torch.no_grad():
        for k in (exact - 1, exact, head_dim + 2):
            with truncated_logits(model, k, modules=modules):
                cut[k] = evaluate(model, sets)
        swept = rank_sweep(model, sets, [exact - 1, exact])
    for k in (exact, head_dim + 2):
        assert cut[k]["mse"] == pytest.approx(full["mse"], rel=1e-5)
    assert abs(cut[exact - 1]["mse"] - full["mse"]) > 1e-4
    assert swept == {exact - 1: cut[exact - 1], exact: full}


def test_the_cut_at_the_head_size_reads_the_models_own_metrics_so_a_band_of_0_finds_it():
    """One seed gives a band of 0: the reading needs the loss at k = d_p (the model itself) to be at most the
    full-rank one exactly, not up to the cut's float rounding (which lands above it for some models)."""
    from fixedhead.diagnostics.intervention import needed_rank

    task = FarthestPointTask(8, 3, 8)
    for seed in range(20):
        torch.manual_seed(seed)
        model = SetAttentionModel(8, 4, 3, logit_scale=16.0).eval()
        sets = task.sample(64, torch.Generator().manual_seed(seed + 1), task.projection)
        full = evaluate(model, sets)
        with torch.no_grad():
            swept = rank_sweep(model, sets, [1, 2, 3])
        assert swept[3] == full, seed
        assert needed_rank({k: v["mse"] for k, v in swept.items()}, full["mse"], 0.0) is not None, seed


def test_train_cell_returns_the_model_its_metrics_were_scored_on():
    task = FarthestPointTask(8, 2, 8, seed=0)
    result, model = train_cell(task, Cell(2, 2, 4), QUICK.recipe, seed=0, progress=False, return_model=True)
    sets = task.sample(QUICK.recipe.eval_sets, torch.Generator().manual_seed(30_000), task.projection)
    assert not model.training
    assert evaluate(model, sets)["mse"] == pytest.approx(result["mse"], rel=1e-6)


def test_the_check_reads_the_needed_rank_from_the_hit_rate_and_from_the_mse_band(tmp_path):
    record = run_study(KnownRankStudy(), QUICK, tmp_path / "out", progress=False, command="test")
    state = record["summary"]
    (m2, m4) = state["models"]
    assert [m["head_dim"] for m in state["models"]] == [2, 4]
    assert sorted(m4["ranks"]) == [1, 2, 3, 4]  # k = 1 .. min(d_p, N − 1)
    assert m2["ranks"][2]["mse"] == pytest.approx(m2["mse"], rel=1e-6)  # k = d_p: the model itself
    for m in state["models"]:  # one seed: the band is 0, so the needed rank is the smallest k equal to full
        assert m["band"] == 0.0
        top = max(m["ranks"])
        want = min(k for k in m["ranks"] if all(m["ranks"][j]["mse"] <= m["mse"] for j in range(k, top + 1)))
        assert m["needed_by_mse"] == want
        hits = [k for k in m["ranks"] if all(m["ranks"][j]["hit_rate"] >= 0.9 for j in range(k, top + 1))]
        assert m["needed_by_hit_rate"] == (min(hits) if hits else None)
    assert state["passed"] == all(m["needed_by_mse"] == 2 == m["needed_by_hit_rate"] for m in state["models"])
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert (
        KnownRankStudy().summarise({"options": QUICK, "results": list(saved["runs"].values())}) == state
    )  # from the per-model results
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith(report_markdown(saved, QUICK)) and record["plan_sha256"] in report
    # r = 2: the cut below r is the cut to one dimension, one column (its numbers are the model's k = 1)
    header = next(line for line in report.splitlines() if line.startswith("| d_p"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[3:5] == ["k = r − 1 = 1", "k = r = 2"] and "k = 1" not in cells and len(cells) == 7
    row = next(line for line in report.splitlines() if line.startswith("| 4 | 0 |"))
    assert row.split("|")[4].strip() == f"{m4['ranks'][1]['mse']:.3f} / {m4['ranks'][1]['hit_rate']:.3f}"
    assert all(line.count("|") == header.count("|") for line in report.splitlines() if line.startswith("| "))
    assert len((tmp_path / "out" / "known_rank.csv").read_text().splitlines()) == 1 + 2 + 4
    assert (tmp_path / "out" / "known_rank.png").stat().st_size > 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        run_study(KnownRankStudy(), QUICK, tmp_path / "other", progress=False)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"head_dims": (1, 2)}, "head_dims"),
        ({"head_dims": ()}, "head_dims"),
        ({"seeds": ()}, "seed"),
        ({"rank": 0}, "rank"),
    ],
)
def test_a_check_that_could_not_have_its_answer_is_refused(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        KnownRankCheck(**{"rank": 2, "head_dims": (2,), "dim": 8, "num_points": 8, **kwargs})


def test_quick_never_writes_into_the_real_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = main(["known-rank", "--quick", "--no-progress", "--threads", "1"])
    assert rc in (0, 1)  # 1: the 40-step models do not learn the task, so the check fails
    assert (tmp_path / "runs" / "known-rank-quick" / "results.json").exists()
    assert not (tmp_path / "runs" / "known-rank").exists()
    assert "Check **" in capsys.readouterr().out


def test_the_committed_report_regenerates_from_its_results():
    from pathlib import Path

    from fixedhead.studies.kit.study import regenerate

    folder = Path(__file__).resolve().parents[2] / "docs" / "results" / "known-rank"
    record, report = regenerate(KnownRankStudy(), folder)
    saved = json.loads((folder / "results.json").read_text())
    assert json.loads(json.dumps(record["summary"])) == saved["summary"]  # recomputed from the per-model results
    assert report == (folder / "report.md").read_text()
