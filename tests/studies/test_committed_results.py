"""Every committed study report in docs/results/ is what the code renders from the committed
results file next to it: the reports are outputs, never edited by hand."""

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _state(folder: str) -> dict:
    return json.loads((RESULTS / folder / "results.json").read_text())


def _same(value, saved) -> bool:
    """``value`` as saved to JSON equals ``saved``, floats to 1e-9 (least-squares fits differ in the last bits
    under another BLAS threading)."""
    value = json.loads(json.dumps(value))
    if isinstance(value, dict):
        return (
            isinstance(saved, dict) and value.keys() == saved.keys() and all(_same(value[k], saved[k]) for k in value)
        )
    if isinstance(value, list):
        return isinstance(saved, list) and len(value) == len(saved) and all(map(_same, value, saved))
    return value == pytest.approx(saved, rel=1e-9) if isinstance(value, float) else value == saved


@pytest.mark.parametrize("folder", ["make-run", "compare-clm"])
def test_compare_table_regenerates(folder, tmp_path):
    from fixedhead.studies.compare import write_results

    saved = _state(folder)
    write_results(saved["results"], tmp_path, saved["meta"])
    assert (tmp_path / "results.csv").read_text() == (RESULTS / folder / "results.csv").read_text()


@pytest.mark.parametrize("folder", ["synthetic", "synthetic-lr"])
def test_farthest_point_report_regenerates(folder, tmp_path):
    from fixedhead.studies.farthest_point import FarthestPointOptions, FarthestPointStudy, state_of, write_outputs
    from fixedhead.studies.kit.study import options_from_dict, regenerate

    record, report = regenerate(FarthestPointStudy(), RESULTS / folder)
    assert report == (RESULTS / folder / "report.md").read_text() and not record["missing"]
    assert record["summary"] == _state(folder)["summary"]
    options = options_from_dict(FarthestPointOptions, record["options"])
    write_outputs(state_of(options, record["runs"].values(), record["meta"]), tmp_path)
    assert (tmp_path / "results.csv").read_text() == (RESULTS / folder / "results.csv").read_text()


@pytest.mark.parametrize("folder", ["widening", "widening-lr"])
def test_widening_report_regenerates(folder):
    from fixedhead.studies.kit.study import regenerate
    from fixedhead.studies.widening import WideningStudy

    record, report = regenerate(WideningStudy(), RESULTS / folder)
    assert report == (RESULTS / folder / "report.md").read_text() and not record["missing"]
    assert _same(record["summary"], _state(folder)["summary"])


@pytest.mark.parametrize(
    ("folder", "name"),
    [("synthetic", "farthest-point"), ("widening-lr", "widen-experiment"), ("known-rank", "known-rank")],
)
def test_a_committed_folder_without_a_plan_resumes_under_the_options_it_records(folder, name, tmp_path):
    """These folders predate plan.json and record an older plan's hash: rerun with the options their results.json
    records, their plan is written (the same study, not a grown one) holding every stored point."""
    import shutil

    from fixedhead.studies import study_class
    from fixedhead.studies.kit.study import options_from_dict, regenerate, write_plan

    study, saved = study_class(name)(), _state(folder)
    assert not (RESULTS / folder / "plan.json").exists()
    shutil.copy(RESULTS / folder / "results.json", tmp_path / "results.json")
    recorded = regenerate(study, RESULTS / folder)[0]["options"]  # the options it reports under
    spec = study.resolve(options_from_dict(study.Options, recorded))
    plan = write_plan(tmp_path, study, spec)
    assert plan["sha256"] != saved["plan_sha256"] and plan["history"] == []  # read through today's Options
    assert set(saved["runs"]) <= set(plan["plan"]["points"])
    assert json.loads((tmp_path / "plan.json").read_text()) == plan


def test_committed_runs_are_reused_by_todays_presets():
    """The settings record of each committed results file is today's preset's: rerunning the
    committed command in that folder reuses its runs instead of refusing them."""
    from fixedhead.studies import farthest_point, widening
    from fixedhead.studies.kit.study import options_from_dict, settings_sha256

    study, saved = farthest_point.FarthestPointStudy(), _state("synthetic")["options"]
    assert settings_sha256(study, farthest_point.FarthestPointOptions()) == settings_sha256(
        study, options_from_dict(farthest_point.FarthestPointOptions, saved)
    )
    study, saved = widening.WideningStudy(), _state("widening")["options"]
    assert settings_sha256(study, widening.WideningOptions()) == settings_sha256(
        study, options_from_dict(widening.WideningOptions, saved)
    )


def test_coordcheck_report_regenerates():
    from fixedhead.studies.coordcheck import CoordCheckStudy
    from fixedhead.studies.kit.study import regenerate

    record, report = regenerate(CoordCheckStudy(), RESULTS / "coordcheck")
    assert _same(record["summary"], _state("coordcheck")["summary"])
    assert report == (RESULTS / "coordcheck" / "report.md").read_text()


@pytest.mark.parametrize("folder", ["scaling-cpu", "scaling-llama"])
def test_scaling_report_regenerates(folder):
    from fixedhead.studies.kit.study import regenerate
    from fixedhead.studies.scaling import ScalingStudy

    record, report = regenerate(ScalingStudy(), RESULTS / folder)
    assert _same(record["summary"], _state(folder)["summary"]) and not record["missing"]
    assert report == (RESULTS / folder / "report.md").read_text()


@pytest.mark.parametrize("folder", ["sweep-clm-lr", "sweep-mlm-lr", "sweep-clm-mup", "sweep-mlm-mup", "table2b-seeds"])
def test_sweep_report_regenerates(folder, tmp_path):
    """The claim table is recomputed from the per-run results; no data is read (a sweep that fine-tunes records
    its majority-class rate, which the report shows). ``fixedhead report`` writes the same report elsewhere."""
    import shutil

    from fixedhead.studies.kit.study import regenerate
    from fixedhead.studies.sweep import SweepStudy, write_report

    record, report = regenerate(SweepStudy(), RESULTS / folder)
    assert _same(record["summary"], _state(folder)["summary"]) and not record["missing"]
    assert report == (RESULTS / folder / "report.md").read_text()
    shutil.copy(RESULTS / folder / "results.json", tmp_path / "results.json")
    assert write_report(tmp_path, tmp_path / "report").read_text() == report


@pytest.mark.parametrize("task", ["sst2", "cola"])
def test_finetune_sweep_report_regenerates(task):
    """Regenerated with the sweep it sits in (its recorded sweep folder, runs/sweep-mlm-lr, is not committed)."""
    from fixedhead.studies.kit.study import regenerate
    from fixedhead.studies.sweep.finetune_seeds import FinetuneSweepStudy

    folder = RESULTS / "sweep-mlm-lr" / f"finetune-{task}"
    record, report = regenerate(FinetuneSweepStudy(), folder)
    assert _same(record["summary"], _state(f"sweep-mlm-lr/finetune-{task}")["summary"]) and not record["missing"]
    assert report == (folder / "report.md").read_text()


def test_gpu_lm1b_pair_summary_regenerates():
    """The GPU pair's README quotes the summary its script prints from the committed per-run records."""
    import importlib.util

    path = RESULTS.parents[1] / "benchmarks" / "gpu_lm1b_pair.py"
    spec = importlib.util.spec_from_file_location("gpu_lm1b_pair", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [json.loads(line) for line in (RESULTS / "gpu-lm1b-pair" / "runs.jsonl").read_text().splitlines()]
    text = module.summarise(rows, [0, 1, 2, 3, 4, 5])["text"]
    assert text in (RESULTS / "gpu-lm1b-pair" / "README.md").read_text()


@pytest.mark.parametrize("folder", ["seq-len-pilot", "seq-len-long", "seq-len-lr"])
def test_seq_len_report_regenerates(folder):
    """The committed report is what the code renders from the committed runs and plan: the summary is
    recomputed from the per-run results, not read back."""
    from fixedhead.studies.compare.seq_len import SeqLenStudy
    from fixedhead.studies.kit.study import regenerate

    record, report = regenerate(SeqLenStudy(), RESULTS / folder)
    assert json.loads(json.dumps(record["summary"])) == _state(folder)["summary"]
    assert report == (RESULTS / folder / "report.md").read_text()


def test_fixedhead_report_refuses_a_folder_without_options_and_another_studys_folder(tmp_path, capsys):
    """A folder written before its study recorded options is refused in one line, and so is a folder named as
    another study's (every committed folder's re-rendering: test_every_committed_report_regenerates)."""
    from fixedhead.cli import main

    assert main(["report", str(RESULTS / "make-run"), "--study", "compare", "--output-dir", str(tmp_path / "m")]) == 2
    assert "recorded its options" in capsys.readouterr().err and not (tmp_path / "m").exists()
    for study in ("farthest-point", "widen-experiment", "scaling"):
        assert main(["report", str(RESULTS / "coordcheck"), "--study", study, "--output-dir", str(tmp_path / "o")]) == 2


def test_make_run_rank_readme_quotes_its_own_table_and_the_claims_gap():
    """The words of the rank README agree with the numbers committed beside them: the headline needed rank
    is the range of `rank_intervention.json`'s needed ranks, and the fixed − standard gap it quotes is the
    make-run claims table's five-seed row."""
    import re

    readme = (RESULTS / "make-run-rank" / "README.md").read_text()
    runs = json.loads((RESULTS / "make-run-rank" / "rank_intervention.json").read_text())["runs"]
    needed = [k for r in runs for k in r["needed"].values()]
    assert f"has rank {min(needed)} to {max(needed)}.**" in readme
    claims_row = next(
        line
        for line in (RESULTS / "make-run" / "README.md").read_text().splitlines()
        if line.startswith("| fixed − standard |")
    )
    gap = claims_row.split("|")[3].strip()  # "+0.083 [−0.009, +0.176]"
    assert re.search(r"fixed − standard ([^ ]+ nats \[[^]]+\])", readme).group(1).replace(" nats", "") == gap


#: committed folders whose results.json predates ``meta.study``
LEGACY_STUDY = {"scaling": "scaling", "synthetic": "farthest-point", "widening": "widen-experiment"}
COMMITTED_REPORTS = sorted(
    str(p.parent.relative_to(RESULTS)) for p in RESULTS.rglob("report.md") if (p.parent / "results.json").is_file()
)


@pytest.mark.parametrize("folder", COMMITTED_REPORTS)
def test_every_committed_report_regenerates(folder, tmp_path):
    """`fixedhead report FOLDER --output-dir OUT` writes every committed report.md again, byte for byte."""
    from fixedhead.cli import main

    study = next((s for prefix, s in LEGACY_STUDY.items() if folder.startswith(prefix)), None)
    extra = ["--study", study] if study and "study" not in _state(folder)["meta"] else []
    assert main(["report", str(RESULTS / folder), "--output-dir", str(tmp_path / "r"), *extra]) == 0
    assert (tmp_path / "r" / "report.md").read_bytes() == (RESULTS / folder / "report.md").read_bytes()


@pytest.mark.parametrize(
    "model",
    [
        *(f"make-run-rank/visible/{m}" for m in ("standard", "fixed", "standard-wide")),
        *(f"seq-len-long/visible-n256-s0/{m}" for m in ("dp8", "dp32")),
        *(f"qk-v/rank-s0/{m}" for m in ("qk8-v8", "qk8-v32", "qk32-v8", "qk32-v32")),
    ],
)
def test_rank_intervention_reports_regenerate(model):
    """The committed `fixedhead rank-intervention` tables are what the code renders from the runs and command in
    the JSON beside them, and their needed ranks are what the code reads from the curves."""
    from fixedhead.diagnostics.intervention import needed_band, report_markdown, summarise

    folder = RESULTS / model
    record = json.loads((folder / "rank_intervention.json").read_text())
    assert report_markdown(record["runs"], record["command"]) == (folder / "rank_intervention.md").read_text()
    tolerances = tuple(float(t) for t in record["runs"][0]["needed_at"])
    fresh = [
        {k: v for k, v in r.items() if k not in ("band", "band_source", "needed", "needed_at")} for r in record["runs"]
    ]
    assert needed_band(summarise(fresh, tolerances=tolerances)) == record["needed"]


def test_qk_v_effects_are_the_paired_contrasts_of_its_committed_losses():
    """The qk-v report's effects are the per-seed contrasts of the committed held-out losses (plain NumPy) over
    the seeds that finished every arm, with SciPy's paired t-interval, and the README quotes them."""
    import numpy as np
    from scipy import stats

    state = _state("qk-v")
    loss = {(r["qk_head_dim"], r["v_head_dim"], r["seed"]): r["heldout_loss"] for r in state["runs"].values()}
    seeds = sorted({s for (_, _, s) in loss if all((q, v, s) in loss for q in (8, 32) for v in (8, 32))})
    assert len(seeds) >= 2

    def arm(q, v):
        return np.array([loss[(q, v, s)] for s in seeds])

    ss, sl, ls, ll = arm(8, 8), arm(8, 32), arm(32, 8), arm(32, 32)
    contrasts = {"qk": (ls - ss + ll - sl) / 2, "v": (sl - ss + ll - ls) / 2, "interaction": ll - ls - sl + ss}
    report = (RESULTS / "qk-v" / "report.md").read_text()
    readme = (RESULTS / "qk-v" / "README.md").read_text()
    assert f"**Partial: {len(seeds)} of the planned 8 seeds have finished every arm (seeds {seeds});" in report
    for name, d in contrasts.items():
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        quoted = f"{d.mean():+.4f} [{ci.low:+.4f}, {ci.high:+.4f}]"
        assert f"| {quoted} |" in report, (name, quoted)
        assert f"| {quoted.replace('-', '−')} |" in readme, (name, quoted)
