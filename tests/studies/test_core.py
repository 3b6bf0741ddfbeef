"""fixedhead.studies.kit.core: the pieces the Study kit is built of (the toy study on the kit itself is in
test_study.py)."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixedhead.runs import claim_output_dir
from fixedhead.studies.kit import core, render

RESULTS = "results.json"


def claim(out, create=False, **kw):
    """The folder claim every study makes (:func:`fixedhead.runs.claim_output_dir` with its results file)."""
    return claim_output_dir(out, (RESULTS,), ("report.md", RESULTS), "toy", create=create, results_file=RESULTS, **kw)


def test_the_report_names_the_machine_down_to_its_kernels(tmp_path):
    """Runs of other CPUs round differently: the head of every report says which one ran."""
    import torch

    meta = core.start_meta("grid", "a toy grid", "toy", {}, "toy")
    core.save_state(tmp_path / RESULTS, {"meta": meta, "runs": {"a": {"train_seconds": 2.0}}}, [{"train_seconds": 2.0}])
    saved = json.loads((tmp_path / RESULTS).read_text())
    assert saved["meta"]["compute_seconds"] == 2.0 and saved["meta"]["commands"] == ["toy"]
    report = render.markdown(render.Report("Toy", sections=[render.what_was_run(saved["meta"])]))
    assert f"torch kernels {torch.backends.cpu.get_cpu_capability()};" in report
    assert saved["meta"]["cpu"] and saved["meta"]["cpu"] in report


def test_a_report_spec_renders_its_blocks_one_blank_line_apart():
    """Paragraphs, line lists, figures and tables each end with one blank line; a falsy block or section is
    left out; a table's cells come from format strings read against dict rows, or from functions."""
    spec = render.Report(
        "Title",
        ["An opening.", None, ["- one", "- two"]],
        [
            render.Section(
                "Numbers",
                [
                    render.Figure("f.png", "a figure"),
                    render.Table(
                        [("x", "{x}"), ("x²", "{x2:.1f}"), ("odd", lambda r: "yes" if r["x"] % 2 else "no")],
                        [{"x": 1, "x2": 1.0}, {"x": 2, "x2": 4.0}],
                    ),
                    "",
                ],
            ),
            None,
            ["## Already rendered", "", "text", ""],
            render.Section("Plain", [render.Table(["a", "b"], [[1, 2]])]),
        ],
    )
    assert render.markdown(spec) == (
        "# Title\n\nAn opening.\n\n- one\n- two\n\n"
        "## Numbers\n\n![a figure](f.png)\n\n| x | x² | odd |\n|---|---|---|\n| 1 | 1.0 | yes |\n| 2 | 4.0 | no |\n\n"
        "## Already rendered\n\ntext\n\n"
        "## Plain\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    )


def test_the_folder_claim_refuses_what_the_study_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        claim(tmp_path, create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_folder_claim_names_the_root_and_a_folder_below_a_file(tmp_path):
    """The root has no parent to look at: it is refused like any folder holding foreign files."""
    with pytest.raises(FileExistsError, match=r"--output-dir '/' holds files"):
        claim(Path("/"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match=r"lies below '.*/f', which is a file"):
        claim(tmp_path / "f" / "out")


def test_the_folder_claim_refuses_another_studys_results_file_even_with_overwrite(tmp_path):
    """Several studies write results.json: the one whose meta names another study is not ours."""
    other = {"meta": {"study": "compare"}, "results": []}
    (tmp_path / RESULTS).write_text(json.dumps(other))
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="fixedhead compare"):
            claim(tmp_path, create=True, overwrite=overwrite)
    assert json.loads((tmp_path / RESULTS).read_text()) == other
    # a results file from before meta.study: its recorded command names the study
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / RESULTS).write_text(json.dumps({"meta": {"command": "fixedhead scaling --preset cpu"}}))
    with pytest.raises(FileExistsError, match="fixedhead scaling"):
        claim(tmp_path / "old", create=True, overwrite=True)
    (tmp_path / "mine").mkdir()  # its own folder: taken again
    (tmp_path / "mine" / RESULTS).write_text(json.dumps({"meta": {"study": "toy"}}))
    claim(tmp_path / "mine", create=True)
    assert json.loads((tmp_path / "mine" / RESULTS).read_text())["meta"]["study"] == "toy"


def test_a_preset_is_the_options_a_run_starts_from_and_given_options_override_it():
    @dataclass(frozen=True)
    class Toy:
        preset: str = "small"
        width: int | None = None
        seeds: tuple[int, ...] = None  # None: not given (the preset's)
        steps: int = 10  # not a preset's field: always the run's own

    presets = {"small": Toy(width=8, seeds=(0, 1), steps=99), "big": Toy("big", width=64, seeds=(0,))}
    fields = ("width", "seeds")
    assert core.from_preset(presets, Toy(), fields, "toy") == Toy(width=8, seeds=(0, 1))
    assert core.from_preset(presets, Toy("big", seeds=(3,)), fields, "toy") == Toy("big", width=64, seeds=(3,))
    # an empty list given is a value, not the preset's
    assert core.from_preset(presets, Toy(seeds=()), fields, "toy") == Toy(width=8, seeds=())
    with pytest.raises(ValueError, match="unknown toy preset 'huge'; known: small, big"):
        core.from_preset(presets, Toy("huge"), fields, "toy")
    with pytest.raises(ValueError, match="unknown toy preset 'big'; known: small"):
        core.pick({"small": dict}, "big", "toy")


def test_wall_time_counts_invocations_and_not_the_days_between(tmp_path, monkeypatch):
    clock = iter([130.0, 160.0, 1000.0, 1030.0])  # each save_state reads the clock once
    monkeypatch.setattr(core.time, "time", lambda: next(clock))
    path = tmp_path / "results.json"
    # an older results file: first start at 0, 50 s of wall time, no spans recorded
    path.write_text(json.dumps({"meta": {"first_started": 0.0, "total_seconds": 50.0}}))
    old = json.loads(path.read_text())["meta"]
    a = {"meta": {**old, "invocation_started": 100.0}}  # an invocation from 100 s, saving at 130 and 160
    core.save_state(path, a, [])
    runs = [dict(train_seconds=30.0), dict(train_seconds=20.0, finetune=dict(train_seconds=5))]
    core.save_state(path, a, runs)
    meta = json.loads(path.read_text())["meta"]
    assert meta["active"] == [[0.0, 50.0], [100.0, 160.0]]
    assert (meta["total_seconds"], meta["compute_seconds"]) == (110.0, 55.0)
    c = {"meta": {**meta, "invocation_started": 990.0}}  # a later session: 990-1000, then its next save to 1030
    core.save_state(path, c, [])
    core.save_state(path, c, [])
    meta = json.loads(path.read_text())["meta"]
    assert meta["active"] == [[0.0, 50.0], [100.0, 160.0], [990.0, 1030.0]]
    assert meta["total_seconds"] == 150.0
    assert "- wall time: 2.5 min while an invocation ran (3 spans, " in render.wall_time_line(meta)
    # a study started afresh (--overwrite: nothing resumed) counts only its own time, whatever the file held
    clock = iter([1100.0])
    core.save_state(path, {"meta": {"first_started": 1090.0, "invocation_started": 1090.0}}, [])
    assert json.loads(path.read_text())["meta"]["total_seconds"] == 10.0
    # a results file from before the spans keeps its wording, so committed reports regenerate as they were
    assert "- wall time: 1.0 min from the first start to the last result;" in render.wall_time_line(
        {"total_seconds": 60}
    )


def test_run_key_names_runs_as_the_committed_results_do():
    """The keys of docs/results (e.g. scaling-cpu's ``standard-d32-lr0.001-s0``) are what run_key writes."""
    committed = json.loads((Path(__file__).resolve().parents[2] / "docs/results/scaling-cpu/results.json").read_text())
    assert "standard-d32-lr0.001-s0" in committed["runs"]["standard-d32-s0"]["runs"]
    assert core.run_key("standard-d32", 1e-3, 0) == "standard-d32-lr0.001-s0"
    assert core.run_key("fixed", 5e-4) == "fixed-lr0.0005"
    assert core.run_key("cell", seed=2) == "cell-s2"
    assert core.run_key("n256-fixedhead") == "n256-fixedhead"
