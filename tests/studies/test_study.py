"""fixedhead.studies.kit.study: a new study is its options, plan, one point, summary and report; the
kit does the bookkeeping (folder, plan hash, resume, workers, record). Exercised by a toy study that
declares only those."""

import dataclasses
import hashlib
import json

import pytest

from fixedhead.studies.kit import render
from fixedhead.studies.kit.core import run_key, seed_major
from fixedhead.studies.kit.study import Point, Study, regenerate, rerender, run_study


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    arms: tuple[str, ...] = ("standard", "fixed")
    """the arms"""
    seeds: tuple[int, ...] = (0, 1)
    """seeds, paired across arms"""
    scale: float = 2.0
    """the fixed arm's loss is the standard one's times this"""


class Toy(Study):
    name = "toy"
    Options = ToyOptions
    quick = ToyOptions(seeds=(0,))
    points_only = ("arms", "seeds")

    def __init__(self, fail_at=None, during=None):
        self.ran, self.fail_at, self.during = [], fail_at, during

    def plan(self, o):
        return [Point(run_key(arm, seed=s), (arm, s)) for arm, s in seed_major(o.arms, o.seeds)]

    def plan_record(self, o):
        return {"pairing": "by seed"}

    def run(self, o, point, folder, done, progress):
        arm, seed = point.spec
        assert (folder / "plan.json").is_file()  # the plan is written before the first point runs
        if point.key == self.fail_at:
            raise RuntimeError(f"{point.key} failed")
        if self.during:
            self.during(point, folder)
        self.ran.append(point.key)
        return {"loss": (o.scale if arm == "fixed" else 1.0) * (1 + seed), "train_seconds": 1.0}

    def summarise(self, state):
        results = state["results"]
        return {"mean_loss": sum(r["loss"] for r in results) / len(results), "runs": len(results)}

    def report(self, record):
        rows = [[key, f"{r['loss']:g}"] for key, r in record["runs"].items()]
        plan = f"plan {str(record['plan_sha256'])[:12]}"  # None in a folder from before plans
        return "\n".join(["# Toy", plan, *render.table(["run", "loss"], rows)]) + "\n"


def test_a_toy_study_needs_no_bookkeeping_of_its_own(tmp_path):
    toy, out = Toy(), tmp_path / "toy"
    record = run_study(toy, output_dir=out, progress=False, command="fixedhead toy")
    # seed-major: every arm's first seed before any second seed
    assert toy.ran == ["standard-s0", "fixed-s0", "standard-s1", "fixed-s1"]
    assert record["runs"]["fixed-s1"]["loss"] == 4.0  # scale 2 × (1 + seed 1)
    assert record["summary"] == {"mean_loss": (1 + 2 + 2 + 4) / 4, "runs": 4}
    saved = json.loads((out / "results.json").read_text())
    assert saved["runs"] == record["runs"] and saved["meta"]["compute_seconds"] == 4.0
    assert saved["meta"]["study"] == "toy" and saved["meta"]["commands"] == ["fixedhead toy"]
    assert saved["meta"]["torch"] and saved["meta"]["python"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["plan"]["points"] == list(record["runs"]) and plan["plan"]["pairing"] == "by seed"
    assert saved["plan_sha256"] == plan["sha256"] and (out / "report.md").read_text().startswith("# Toy")
    # the committed folder regenerates: the same summary and report from the per-point results
    again, text = regenerate(Toy(), out)
    assert again["summary"] == record["summary"] and text == (out / "report.md").read_text()

    # resumed: nothing runs again; the second command is recorded beside the first
    toy2 = Toy()
    run_study(toy2, output_dir=out, progress=False, command="fixedhead toy --again")
    assert toy2.ran == [] and json.loads((out / "results.json").read_text())["meta"]["commands"][-1].endswith("again")


def test_a_changed_plan_is_refused_after_results_unless_the_study_grows(tmp_path):
    out = tmp_path / "toy"
    first = run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
    with pytest.raises(FileExistsError, match=r"another plan .* 2 finished point\(s\); pass --grow"):
        run_study(Toy(), ToyOptions(seeds=(0, 1)), out, progress=False)
    assert json.loads((out / "plan.json").read_text())["sha256"] == first["plan_sha256"]  # unchanged
    toy = Toy()
    grown = run_study(toy, ToyOptions(seeds=(0, 1)), out, grow=True, progress=False)
    assert toy.ran == ["standard-s1", "fixed-s1"]  # only the new points
    assert grown["plan_history"][0]["sha256"] == first["plan_sha256"]
    assert grown["plan_history"][0]["runs_done"] == ["fixed-s0", "standard-s0"]
    assert "The study grew after results existed" in (out / "report.md").read_text()
    # a plan that drops points (grow) keeps their stored results; the summary covers the plan's points
    fewer = run_study(Toy(), ToyOptions(arms=("fixed",), seeds=(0, 1)), out, grow=True, progress=False)
    assert set(fewer["runs"]) == {"standard-s0", "fixed-s0", "standard-s1", "fixed-s1"}
    assert fewer["summary"] == {"mean_loss": (2 + 4) / 2, "runs": 2}


def test_points_of_other_settings_are_refused_and_overwrite_runs_them_again(tmp_path):
    out = tmp_path / "toy"
    run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
    with pytest.raises(FileExistsError, match=r"other settings \(--scale: 2.0 → 3.0\); pass --overwrite"):
        run_study(Toy(), ToyOptions(seeds=(0,), scale=3.0), out, grow=True, progress=False)
    toy = Toy()
    again = run_study(toy, ToyOptions(seeds=(0,), scale=3.0), out, overwrite=True, progress=False)
    assert toy.ran == ["standard-s0", "fixed-s0"] and again["runs"]["fixed-s0"]["loss"] == 3.0
    assert again["plan_history"] == []  # every point ran again: a new study, not a grown one


def _rehashed(plan: dict) -> dict:
    """A plan record with the hash of its (changed) plan, as the plan files of older versions were written."""
    import hashlib

    text = json.dumps(plan["plan"], indent=1, sort_keys=True)
    return plan | {"sha256": hashlib.sha256(text.encode()).hexdigest()}


def test_a_plan_written_before_plans_carried_their_settings_hash_grows_under_the_same_settings(tmp_path):
    out = tmp_path / "toy"
    run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
    plan = json.loads((out / "plan.json").read_text())
    del plan["plan"]["settings_sha256"]  # as the plans committed before the field existed
    (out / "plan.json").write_text(json.dumps(_rehashed(plan)))
    toy = Toy()
    run_study(toy, ToyOptions(seeds=(0, 1)), out, grow=True, progress=False)
    assert toy.ran == ["standard-s1", "fixed-s1"]
    # a field added to the options since (here: scale, at its default) keeps the stored points
    plan = json.loads((out / "plan.json").read_text())
    del plan["plan"]["options"]["scale"]
    (out / "plan.json").write_text(json.dumps(_rehashed(plan)))
    toy = Toy()
    run_study(toy, ToyOptions(seeds=(0, 1, 2)), out, grow=True, progress=False)
    assert toy.ran == ["standard-s2", "fixed-s2"]
    # and other settings are still named
    plan = json.loads((out / "plan.json").read_text())
    del plan["plan"]["settings_sha256"]
    (out / "plan.json").write_text(json.dumps(_rehashed(plan)))
    with pytest.raises(FileExistsError, match=r"other settings \(--scale: 2.0 → 3.0\)"):
        run_study(Toy(), ToyOptions(seeds=(0, 1, 2), scale=3.0), out, grow=True, progress=False)


def test_the_seed_that_chose_the_rates_stays_first(tmp_path):
    class ToyRates(Toy):
        def first_seed(self, o):  # its first seed's points choose what the others reuse
            return o.seeds[0]

    out = tmp_path / "toy"
    run_study(ToyRates(), ToyOptions(seeds=(0,)), out, progress=False)
    with pytest.raises(FileExistsError, match="chose their rates with seed 0, this plan's first seed is 1"):
        run_study(ToyRates(), ToyOptions(seeds=(1, 0)), out, grow=True, progress=False)
    toy = ToyRates()
    run_study(toy, ToyOptions(seeds=(0, 1)), out, grow=True, progress=False)
    assert toy.ran == ["standard-s1", "fixed-s1"]


def test_a_failed_point_keeps_the_earlier_ones(tmp_path):
    out = tmp_path / "toy"
    with pytest.raises(RuntimeError, match="standard-s1 failed"):
        run_study(Toy(fail_at="standard-s1"), output_dir=out, progress=False)
    assert sorted(json.loads((out / "results.json").read_text())["runs"]) == ["fixed-s0", "standard-s0"]
    toy = Toy()
    run_study(toy, output_dir=out, progress=False)
    assert toy.ran == ["standard-s1", "fixed-s1"]  # resumed where it stopped


def test_plans_that_cannot_run_are_refused_before_the_folder_is_touched(tmp_path):
    with pytest.raises(ValueError, match="points twice .*standard-s1"):
        run_study(Toy(), ToyOptions(seeds=(1, 1)), tmp_path / "twice", progress=False)
    with pytest.raises(ValueError, match="no point"):
        run_study(Toy(), ToyOptions(arms=()), tmp_path / "none", progress=False)
    assert not (tmp_path / "twice").exists() and not (tmp_path / "none").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "plan.json").write_text(json.dumps({"plan": {"study": "coordcheck"}, "sha256": "x", "history": []}))
    with pytest.raises(FileExistsError, match="plan of `fixedhead coordcheck`"):
        run_study(Toy(), output_dir=other, progress=False)


def test_quick_never_writes_into_the_real_folder_and_foreign_folders_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_study(Toy(), quick=True, progress=False)
    assert (tmp_path / "runs" / "toy-quick" / "results.json").is_file() and not (tmp_path / "runs" / "toy").exists()
    quick_report = (tmp_path / "runs" / "toy-quick" / "report.md").read_text()
    assert "(`--quick`): it shows the study runs end to end; its numbers mean nothing" in quick_report
    assert regenerate(Toy(), tmp_path / "runs" / "toy-quick")[1] == quick_report  # kept when re-rendered
    run_study(Toy(), output_dir=tmp_path / "full", progress=False)
    assert "--quick" not in (tmp_path / "full" / "report.md").read_text()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="did not create"):
        run_study(Toy(), output_dir=tmp_path / "mine", progress=False)
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_every_study_is_one_registry_line_with_its_help_and_default_folder():
    """fixedhead.studies.STUDIES names every Study subclass of the package once, under its own name; the help's
    default folder is its default_dir (a -{preset} part gives way to -quick)."""
    import importlib
    import pkgutil

    import fixedhead.studies as studies
    from fixedhead.studies import STUDIES, study_class
    from fixedhead.studies.kit.study import default_dir_text

    found = set()
    for info in pkgutil.walk_packages(studies.__path__, "fixedhead.studies."):
        module = importlib.import_module(info.name)
        found |= {
            c
            for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, Study) and c.__module__ == info.name
        } - {Study}
    assert {study_class(name) for name in STUDIES} == found and len(found) == len(STUDIES)
    assert all(study_class(name).name == name and study_class(name).help for name in STUDIES)
    texts = {
        name: (default_dir_text(study_class(name)()), default_dir_text(study_class(name)(), True)) for name in STUDIES
    }
    assert texts["sweep"] == ("runs/sweep-PRESET", "runs/sweep-quick")
    assert texts["compare"] == ("runs/compare", "runs/compare-quick")
    assert texts["finetune-sweep"] == ("SWEEP_DIR/finetune-TASK", "SWEEP_DIR/finetune-TASK-quick")


def test_a_plan_written_before_an_option_existed_resumes_as_the_same_plan(tmp_path):
    """A folder whose plan.json lacks a field added to the Options since (read at its default) is the same plan:
    it resumes without --grow, nothing runs again, and its history stays."""
    out = tmp_path / "toy"
    record = run_study(Toy(), output_dir=out, progress=False)
    stored = json.loads((out / "plan.json").read_text())
    del stored["plan"]["options"]["scale"]  # as written before `scale` existed (its default: 2.0)
    text = json.dumps(stored["plan"], indent=1, sort_keys=True)  # hashed as that older plan was
    stored["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    (out / "plan.json").write_text(json.dumps(stored))
    toy = Toy()
    again = run_study(toy, output_dir=out, progress=False)
    assert toy.ran == [] and again["runs"] == record["runs"] and again["plan_history"] == []
    assert json.loads((out / "plan.json").read_text())["sha256"] == record["plan_sha256"]


def test_an_empty_folder_option_puts_the_default_folder_here_not_at_the_root():
    from fixedhead.studies.kit.study import study_folder
    from fixedhead.studies.sweep.finetune_seeds import FinetuneSweepOptions, FinetuneSweepStudy

    assert study_folder(FinetuneSweepStudy(), FinetuneSweepOptions(sweep_dir="")).as_posix() == "finetune-sst2"


@dataclasses.dataclass(frozen=True)
class ToySpec:
    options: ToyOptions
    losses: dict  # derived once from the options: {arm: loss at seed 0}


class ResolvedOnce(Toy):
    """A study whose spec derives values from its options: resolved once per invocation, handed to every hook."""

    def __init__(self):
        super().__init__()
        self.resolved, self.seen = 0, set()

    def resolve(self, o):
        self.resolved += 1
        return ToySpec(o, {arm: o.scale if arm == "fixed" else 1.0 for arm in o.arms})

    def describe(self, s):
        self.seen.add(id(s))
        return f"arms {', '.join(s.losses)}"

    def check(self, s):
        self.seen.add(id(s))

    def plan(self, s):
        self.seen.add(id(s))
        return super().plan(s.options)

    def plan_record(self, s):
        self.seen.add(id(s))
        return {"pairing": "by seed"}

    def run(self, s, point, folder, done, progress):
        self.seen.add(id(s))
        arm, seed = point.spec
        return {"loss": s.losses[arm] * (1 + seed), "train_seconds": 1.0}

    def state(self, s, results, record=None):
        self.seen.add(id(s))
        return {**(record or {}), "options": s.options, "results": list(results)}


def test_run_study_resolves_once_and_every_hook_reads_that_spec(tmp_path):
    """The spec from Study.resolve reaches every hook as one object; plan.json records its options, as the
    options themselves would be recorded (the derived values are not part of the plan)."""
    study = ResolvedOnce()
    record = run_study(study, ToyOptions(), tmp_path / "t", progress=False)
    assert study.resolved == 1 and len(study.seen) == 1
    assert record["meta"]["description"] == "arms standard, fixed"
    assert record["runs"]["fixed-s1"]["loss"] == 2.0 * 2
    run_study(Toy(), ToyOptions(), tmp_path / "plain", progress=False)
    plans = [json.loads((tmp_path / f / "plan.json").read_text()) for f in ("t", "plain")]
    assert plans[0]["plan"]["options"] == {"arms": ["standard", "fixed"], "seeds": [0, 1], "scale": 2.0}
    assert plans[0]["sha256"] == plans[1]["sha256"]


def test_every_registered_study_resolves_to_a_spec_that_pickles():
    """Ray sends the spec to its workers: every study's resolved spec (quick and full options) survives pickle."""
    import pickle

    from fixedhead.studies import STUDIES, study_class
    from fixedhead.studies.kit.study import options_in

    for name in STUDIES:
        study = study_class(name)()
        for options in (study.quick, study.Options()):
            try:
                spec = study.resolve(options)
            except ValueError:  # finetune-sweep without a sweep folder
                continue
            again = pickle.loads(pickle.dumps(spec))
            assert again == spec and options_in(again) == options_in(spec), name


def test_overwrite_starts_a_new_study_even_under_the_same_plan(tmp_path):
    """--overwrite runs every point again: the record says neither that the study grew before nor that it is the
    --quick version the folder held before."""
    out = tmp_path / "toy"
    run_study(Toy(), quick=True, output_dir=out, progress=False)
    assert run_study(Toy(), ToyOptions(), out, grow=True, progress=False)["plan_history"]  # grew
    toy = Toy()
    again = run_study(toy, ToyOptions(), out, overwrite=True, progress=False)  # the plan it grew to
    assert toy.ran == ["standard-s0", "fixed-s0", "standard-s1", "fixed-s1"]
    assert again["plan_history"] == [] and json.loads((out / "plan.json").read_text())["history"] == []
    assert "quick" not in again["meta"]
    report = (out / "report.md").read_text()
    assert "grew after results existed" not in report and "--quick" not in report


def test_results_written_before_plans_are_held_to_the_options_they_record(tmp_path):
    """A folder with results but no plan.json (written before plans were): other settings are refused as a
    planned folder refuses them; the same options resume it; results that record no options are refused."""
    out = tmp_path / "toy"
    run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
    (out / "plan.json").unlink()
    before = (out / "results.json").read_text()
    with pytest.raises(FileExistsError, match=r"2 point\(s\) run with other settings \(--scale: 2.0 → 3.0\)"):
        run_study(Toy(), ToyOptions(seeds=(0,), scale=3.0), out, progress=False)
    assert (out / "results.json").read_text() == before and not (out / "plan.json").exists()
    toy = Toy()
    resumed = run_study(toy, ToyOptions(seeds=(0,)), out, progress=False)
    assert toy.ran == [] and resumed["runs"]["fixed-s0"]["loss"] == 2.0 and (out / "plan.json").is_file()
    (out / "plan.json").unlink()
    results = json.loads(before)
    del results["options"]
    (out / "results.json").write_text(json.dumps(results))
    with pytest.raises(FileExistsError, match="holds 2 point.* but neither plan.json nor the options they ran with"):
        run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)


def test_results_that_record_options_but_no_plan_hash_regenerate_as_they_resume(tmp_path):
    """results.json written before plans were hashed: its options, but neither plan.json nor ``plan_sha256`` and
    ``plan_history``. A resume reads it as the plan its options make; so does the report (no plan line)."""
    out = tmp_path / "toy"
    record = run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
    (out / "plan.json").unlink()
    results = json.loads((out / "results.json").read_text())
    del results["plan_sha256"], results["plan_history"]
    (out / "results.json").write_text(json.dumps(results))
    again, text = regenerate(Toy(), out)
    assert again["summary"] == record["summary"] and again["runs"] == record["runs"]
    assert again["plan_sha256"] is None and again["plan_history"] == [] and "Plan: `plan.json`" not in text
    toy = Toy()
    resumed = run_study(toy, ToyOptions(seeds=(0,)), out, progress=False)
    assert toy.ran == [] and resumed["summary"] == record["summary"] and (out / "plan.json").is_file()


def test_rerender_resolves_the_folders_options_once_and_writes_the_report_regenerate_gives(tmp_path):
    """A study's resolve may read its inputs (finetune-sweep reads the sweep): re-rendering resolves once."""

    class Counting(Toy):
        def resolve(self, o):
            self.resolved = getattr(self, "resolved", 0) + 1
            return o

    out = tmp_path / "toy"
    run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
    expected = regenerate(Toy(), out)[1]
    study = Counting()
    assert rerender(study, out, tmp_path / "again") == tmp_path / "again" / "report.md"
    assert study.resolved == 1 and (tmp_path / "again" / "report.md").read_text() == expected


def test_a_damaged_plan_or_results_file_is_named_in_one_line(tmp_path):
    """A plan.json or results.json that parses but holds a list where an object belongs is refused naming the
    file and the field, by a rerun and by the report; nothing is changed."""
    out = tmp_path / "toy"
    run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
    for name, key in [("plan.json", "plan"), ("results.json", "points"), ("results.json", "meta")]:
        path = out / name
        text = path.read_text()
        path.write_text(json.dumps(json.loads(text) | {key: []}))
        files = {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".driver.lock"}
        message = rf"{name}: its '{key}' is a JSON list, not an object; the file is damaged"
        with pytest.raises(ValueError, match=message):
            run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
        with pytest.raises(ValueError, match=message):
            regenerate(Toy(), out)
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".driver.lock"} == files
        path.write_text(text)


def test_settings_refused_for_an_option_the_study_no_longer_has_name_it(tmp_path):
    """Results recording an option that today's options lack (a field removed since), with no plan.json and an
    older plan's hash: the settings they ran with are unknown, so they are refused, naming that option."""
    out = tmp_path / "toy"
    run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
    (out / "plan.json").unlink()
    results = json.loads((out / "results.json").read_text())
    results["options"]["warmup"] = 10
    results["plan_sha256"] = "0" * 64
    (out / "results.json").write_text(json.dumps(results))
    with pytest.raises(FileExistsError, match=r"run with other settings \(--warmup: 10 → not an option now\)"):
        run_study(Toy(), ToyOptions(seeds=(0,)), out, progress=False)
