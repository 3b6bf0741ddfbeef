"""fixedhead.studies.kit.executor and the driver around it: points as Ray tasks give what the in-process run
gives, bit for bit; a worker killed mid-point is retried; a point that raises is recorded as failed; one driver
per folder; a plan, a result or a run file changed after it was written is refused. Exercised by a toy study
that trains a tiny torch model per point (its weights and metrics.json in its run folder)."""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fixedhead.studies.kit.core import run_key, seed_major
from fixedhead.studies.kit.executor import Executor
from fixedhead.studies.kit.study import Point, Study, _lock, regenerate, run_study


@dataclasses.dataclass(frozen=True)
class TinyOptions:
    arms: tuple[str, ...] = ("narrow", "wide")
    """the arms (hidden sizes 4 and 16)"""
    seeds: tuple[int, ...] = (0, 1)
    """seeds"""
    steps: int = 30
    """training steps"""


@dataclasses.dataclass(frozen=True)
class TinySpec:
    """What the hooks read: the options and each arm's hidden size, derived once (sent to the Ray workers)."""

    options: TinyOptions
    widths: dict


class Tiny(Study):
    """Fits y = sin(3x) with a one-hidden-layer net per point; a later seed's rate depends on its first seed's
    loss (as a later seed trains at the rate its first seed chose), so the plan has needs."""

    name = "tiny"
    Options = TinyOptions
    points_only = ("arms", "seeds")
    fail_at: str | None = None
    kill_once_at: str | None = None
    kill_always_at: str | None = None

    def resolve(self, o):
        return TinySpec(o, {"narrow": 4, "wide": 16})

    def plan(self, s):
        o = s.options
        first = o.seeds[0]
        return [
            Point(run_key(a, seed=s), (a, s), () if s == first else (run_key(a, seed=first),))
            for a, s in seed_major(o.arms, o.seeds)
        ]

    def run(self, s, point, folder, done, progress):
        import torch
        from safetensors.torch import save_file

        arm, seed = point.spec
        if point.key == self.fail_at:
            raise RuntimeError(f"{point.key} cannot train")
        marker = folder / f"killed-{point.key}"
        if point.key == self.kill_always_at or point.key == self.kill_once_at and not marker.exists():
            marker.write_text("once")
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-point
        lr = 0.05 if not point.needs else 0.05 * (1 + done[point.needs[0]]["loss"])
        torch.manual_seed(seed)
        width = s.widths[arm]
        net = torch.nn.Sequential(torch.nn.Linear(1, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        x = torch.linspace(-1, 1, 256).unsqueeze(1)
        y = torch.sin(3 * x)
        for _ in range(s.options.steps):
            loss = torch.nn.functional.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        run_dir = folder / "runs" / run_key(arm, lr, seed)
        run_dir.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, run_dir / "model.safetensors")
        (run_dir / "metrics.json").write_text(json.dumps({"loss": loss.item()}))
        return {"loss": loss.item(), "learning_rate": lr, "train_seconds": 0.0}

    def summarise(self, state):
        return {"points": len(state["results"])}

    def report(self, state):
        return "# Tiny\n" + "".join(f"{k}: {r['loss']!r}\n" for k, r in state["runs"].items())


def _files(folder: Path) -> dict[str, bytes]:
    """Every run file's bytes (weights, metrics.json), by path in the folder."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted((folder / "runs").rglob("*.*")) if p.is_file()
    }


@pytest.fixture
def in_process(tmp_path):
    """The in-process study at one torch thread per point: its record and run files."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        record = run_study(Tiny(), output_dir=tmp_path / "in-process", progress=False)
    finally:
        torch.set_num_threads(threads)
    return record, _files(tmp_path / "in-process")


def test_two_ray_workers_give_the_in_process_numbers_and_files_bit_for_bit(in_process, tmp_path):
    record, files = in_process
    assert list(record["points"]["narrow-s1"]) == [
        *("node", "python", "torch", "transformers", "torch_threads", "files", "result_sha256")
    ]
    out = tmp_path / "ray"
    ray_record = run_study(Tiny(), output_dir=out, progress=False, executor=Executor(workers=2, threads=1))
    assert ray_record["runs"] == record["runs"] and not ray_record["missing"]
    assert _files(out) == files and len(files) == 8  # weights and metrics.json of 4 points, byte for byte
    for key, rec in ray_record["points"].items():
        assert rec["ray"] and rec["torch_threads"] == 1 and rec["files"] == record["points"][key]["files"]
    # the later seed ran after its first seed and at the rate computed from it
    assert ray_record["runs"]["wide-s1"]["learning_rate"] != 0.05


def test_a_point_that_raises_on_ray_is_recorded_as_failed_and_reported_missing(tmp_path):
    tiny, out = Tiny(), tmp_path / "t"
    tiny.fail_at, tiny.kill_always_at = "narrow-s0", "wide-s1"  # one raises, one's worker dies on both tries
    record = run_study(tiny, output_dir=out, progress=False, executor=Executor(workers=2, threads=1))
    assert record["failed"] == {
        "narrow-s0": "RuntimeError: narrow-s0 cannot train",
        "narrow-s1": "not run: it needs narrow-s0, which failed",
        "wide-s1": "its worker died on both tries (WorkerCrashedError)",
    }
    assert record["missing"] == ["narrow-s0", "narrow-s1", "wide-s1"] and set(record["runs"]) == {"wide-s0"}
    report = (out / "report.md").read_text()
    assert (
        "Incomplete: 3 point(s)" in report and "Point narrow-s0 failed: RuntimeError: narrow-s0 cannot train" in report
    )
    assert json.loads((out / "results.json").read_text())["failed"] == record["failed"]
    # the rerun runs what failed (here in-process) and the record forgets the failure
    again = run_study(Tiny(), output_dir=out, progress=False)
    assert not again["missing"] and "failed" not in again


def test_a_killed_ray_worker_is_retried_and_the_numbers_are_the_same(in_process, tmp_path):
    import torch

    out, threads = tmp_path / "k", torch.get_num_threads()
    torch.set_num_threads(1)  # the first seed in this process, as the in-process fixture ran it
    try:
        run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False)
    finally:
        torch.set_num_threads(threads)
    # then the second seed on Ray, reading the stored first seed's results; one worker dies mid-point
    tiny = Tiny()
    tiny.kill_once_at = "wide-s1"
    record = run_study(tiny, output_dir=out, grow=True, progress=False, executor=Executor(workers=2, threads=1))
    assert (out / "killed-wide-s1").is_file()  # it did die once
    assert record["runs"] == in_process[0]["runs"] and not record["missing"]
    assert _files(out) == in_process[1]


def test_the_driver_killed_mid_study_resumes_and_a_second_driver_is_refused(tmp_path):
    out = tmp_path / "d"
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_executor import Tiny
from fixedhead.studies.kit.study import run_study
class Dies(Tiny):
    def run(self, o, point, folder, done, progress):
        if point.key == "narrow-s1":
            os.kill(os.getpid(), signal.SIGKILL)
        return super().run(o, point, folder, done, progress)
run_study(Dies(), output_dir={str(out)!r}, progress=False)
"""
    killed = subprocess.run([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert killed.returncode == -signal.SIGKILL
    assert sorted(json.loads((out / "results.json").read_text())["runs"]) == ["narrow-s0", "wide-s0"]
    # a live driver holds the folder: a second one is refused in one line, nothing changed
    held = _lock(out, "tiny")
    before = (out / "results.json").read_bytes()
    with pytest.raises(FileExistsError, match=r"is being run by another `fixedhead tiny` \(pid \d+ on ") as e:
        run_study(Tiny(), output_dir=out, progress=False)
    assert "\n" not in str(e.value) and (out / "results.json").read_bytes() == before
    held.close()
    # the killed driver's lock died with it: the rerun resumes where it stopped
    record = run_study(Tiny(), output_dir=out, progress=False)
    assert not record["missing"] and set(record["points"]) == {"narrow-s0", "wide-s0", "narrow-s1", "wide-s1"}


def test_a_changed_plan_result_or_run_file_is_refused_naming_it(tmp_path):
    out = tmp_path / "t"
    run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False)
    plan_path, results_path = out / "plan.json", out / "results.json"
    plan_text, results_text = plan_path.read_text(), results_path.read_text()
    # plan.json edited, its recorded hash kept: refused on resume and by the report
    plan = json.loads(plan_text)
    plan["plan"]["options"]["steps"] = 60
    plan_path.write_text(json.dumps(plan))
    with pytest.raises(FileExistsError, match="plan.json was changed after it was written: its plan hashes to"):
        run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False)
    with pytest.raises(FileExistsError, match="plan.json was changed after it was written"):
        regenerate(Tiny(), out)
    plan_path.write_text(plan_text)
    # a result edited by hand (it no longer agrees with its run's metrics.json)
    results = json.loads(results_text)
    results["runs"]["wide-s0"]["loss"] = 0.001
    results_path.write_text(json.dumps(results))
    with pytest.raises(FileExistsError, match="the result of point wide-s0 was changed after it was recorded"):
        run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False)
    with pytest.raises(FileExistsError, match="point wide-s0 was changed"):
        regenerate(Tiny(), out)
    results_path.write_text(results_text)
    # a run file rewritten after its point finished
    metrics = next((out / "runs").glob("narrow-*/metrics.json"))
    metrics.write_text(json.dumps({"loss": 0.001}))
    with pytest.raises(FileExistsError, match=r"metrics.json \(point narrow-s0\) no longer matches its record"):
        run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False)
    with pytest.raises(FileExistsError, match=r"\(point narrow-s0\) no longer matches"):
        regenerate(Tiny(), out)


def test_an_edited_meta_is_refused_and_the_report_says_what_it_can_do(tmp_path):
    """results.json's meta (commands, description, timing) is hashed as the results are; `fixedhead report`
    (which has no --overwrite) names the study command to run again."""
    out = tmp_path / "t"
    run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False, command="fixedhead tiny")
    results_path = out / "results.json"
    text = results_path.read_text()
    results = json.loads(text)
    results["meta"]["command"] = "fixedhead tiny --steps 3000"
    results_path.write_text(json.dumps(results))
    with pytest.raises(FileExistsError, match=r"its meta \(commands, description, timing, versions\) was changed"):
        run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False)
    with pytest.raises(FileExistsError, match="its meta .* run `fixedhead tiny` again with --overwrite") as e:
        regenerate(Tiny(), out)
    assert "pass --overwrite" not in str(e.value)
    results = json.loads(text)
    results["runs"]["wide-s0"]["loss"] = 0.001
    results_path.write_text(json.dumps(results))
    with pytest.raises(FileExistsError, match="point wide-s0 was changed.* run `fixedhead tiny` again with") as e:
        regenerate(Tiny(), out)
    assert "pass --overwrite" not in str(e.value)
    results_path.write_text(text)
    assert regenerate(Tiny(), out)[0]["runs"] == json.loads(text)["runs"]


def test_staging_files_of_a_driver_killed_while_writing_are_its_own(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    (out / ".plan.json.k3j_x9q.tmp.json").write_text('{"plan": ')  # killed while plan.json was written
    record = run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False)
    assert not record["missing"] and not list(out.glob(".plan.json.*"))
    only_lock = tmp_path / "l"  # killed after taking its folder, before its plan
    only_lock.mkdir()
    (only_lock / ".driver.lock").write_text("pid 1 on elsewhere")
    (only_lock / ".report.md.x_1.tmp.md").write_text("#")
    assert not run_study(Tiny(), TinyOptions(seeds=(0,)), only_lock, progress=False)["missing"]
    (out / ".results.json.a1b2c3.tmp.json").write_text("{")  # and beside a plan, while results were written
    run_study(Tiny(), TinyOptions(seeds=(0,)), out, progress=False)
    assert not list(out.glob(".results.json.*"))
    # a file of the same look that the study did not write is still refused
    other = tmp_path / "o"
    other.mkdir()
    (other / ".plan.json.notes").write_text("mine")
    with pytest.raises(FileExistsError, match="did not create"):
        run_study(Tiny(), TinyOptions(seeds=(0,)), other, progress=False)


def test_executor_options_that_cannot_run_are_refused_in_one_line():
    from fixedhead.cli import main

    with pytest.raises(ValueError, match="workers must be a positive int, got 0"):
        Executor(workers=0)
    with pytest.raises(ValueError, match="--gpus-per-point asks Ray for GPUs"):
        Executor(gpus_per_point=1)
    with pytest.raises(ValueError, match="give one of them"):
        Executor(workers=2, ray_address="auto")
    assert main(["farthest-point", "--quick", "--workers", "2", "--ray-address", "auto"]) == 2  # before any folder


@pytest.mark.slow
def test_a_real_study_with_rates_chosen_by_its_first_seed_is_the_same_on_ray(tmp_path, monkeypatch):
    """`fixedhead farthest-point`: each cell's first seed chooses its rate on a grid, the second seed trains at
    it (a task dependency on Ray); two Ray workers give the in-process results, every number but wall times."""
    from fixedhead.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["farthest-point", "--quick", "--more-heads", "4", "--seeds", "0", "1", "--learning-rates", "1e-3,4e-3"]
    argv += ["--max-extensions", "0", "--threads", "1", "--no-progress", "--output-dir"]
    assert main([*argv, "in-process"]) == 0
    assert main([*argv, "ray", "--workers", "2"]) == 0

    def untimed(value):
        if isinstance(value, dict):
            return {k: untimed(v) for k, v in value.items() if "seconds" not in k}
        return [untimed(v) for v in value] if isinstance(value, list) else value

    a, b = (json.loads((tmp_path / f / "results.json").read_text()) for f in ("in-process", "ray"))
    assert untimed(a["runs"]) == untimed(b["runs"]) and len(a["runs"]) == 8 and not b["missing"]
    assert all(b["points"][k]["ray"] for k in b["runs"])


def test_a_ray_cluster_that_cannot_be_reached_is_refused_in_one_line_before_the_folder_is_touched(
    tmp_path, monkeypatch, capsys
):
    """An address nothing listens on is refused after a short probe (Ray itself retries for minutes), and
    ``auto`` with no cluster on this machine says what to start; neither leaves plan.json or a driver lock."""
    import ray._private.services as services

    from fixedhead.cli import main

    out = tmp_path / "study"
    argv = ["farthest-point", "--quick", "--no-progress", "--output-dir", str(out), "--ray-address"]
    with socket.socket() as s:  # a port that was free a moment ago: nothing answers there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main([*argv, f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"--ray-address 127.0.0.1:{port}: no Ray cluster answers there" in err and len(err.splitlines()) == 1
    assert not out.exists()
    # no cluster recorded by `ray start` and none running (whatever else runs Ray on this machine meanwhile)
    monkeypatch.setattr(services, "find_gcs_addresses", frozenset)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main([*argv, "auto"]) == 2
    err = capsys.readouterr().err
    assert "--ray-address auto: no Ray cluster is running on this machine" in err and "`ray start --head`" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_more_gpus_per_point_than_the_ray_instance_has_are_refused_before_the_folder_is_touched(
    tmp_path, monkeypatch, capsys
):
    from fixedhead.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # Ray counts no GPU here, on a GPU host too
    out = tmp_path / "study"
    argv = ["farthest-point", "--quick", "--no-progress", "--output-dir", str(out), "--workers", "1"]
    assert main([*argv, "--gpus-per-point", "1"]) == 2
    assert not out.exists()
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fixedhead")]  # (Ray logs too)
    assert len(ours) == 1 and "--gpus-per-point 1: this machine's Ray instance has 0 GPU(s)" in ours[0]


class Nested(Study):
    """Keeps each point's models in the point's own folder, as seq-len and qk-v do: ``KEY/NAME/`` and, on the
    first seed, ``KEY/lr-grid/NAME-lrRATE/``."""

    name = "nested"
    Options = TinyOptions
    points_only = ("arms", "seeds")

    def plan(self, o):
        return [Point(run_key(a, seed=s), (a, s)) for a, s in seed_major(o.arms, o.seeds)]

    def run(self, o, point, folder, done, progress):
        arm, seed = point.spec
        runs = [folder / point.key / arm] + ([folder / point.key / "lr-grid" / run_key(arm, 0.01)] if seed == 0 else [])
        for run_dir in runs:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "metrics.json").write_text(json.dumps({"loss": seed}))
            (run_dir / "model.safetensors").write_bytes(bytes([seed]))
        return {"loss": float(seed)}

    def summarise(self, state):
        return {}

    def report(self, state):
        return "# Nested\n"


def test_run_files_inside_a_points_own_folder_are_recorded_and_checked(tmp_path):
    out = tmp_path / "n"
    record = run_study(Nested(), TinyOptions(arms=("narrow",)), out, progress=False)
    assert sorted(record["points"]["narrow-s0"]["files"]) == [
        "narrow-s0/lr-grid/narrow-lr0.01/metrics.json",
        "narrow-s0/lr-grid/narrow-lr0.01/model.safetensors",
        "narrow-s0/narrow/metrics.json",
        "narrow-s0/narrow/model.safetensors",
    ]
    assert sorted(record["points"]["narrow-s1"]["files"]) == [
        "narrow-s1/narrow/metrics.json",
        "narrow-s1/narrow/model.safetensors",
    ]
    (out / "narrow-s1" / "narrow" / "metrics.json").write_text(json.dumps({"loss": 0.0}))
    with pytest.raises(FileExistsError, match=r"narrow-s1/narrow/metrics.json \(point narrow-s1\) no longer matches"):
        run_study(Nested(), TinyOptions(arms=("narrow",)), out, progress=False)


def test_a_points_files_are_its_own_runs_only(tmp_path):
    """The rate in a run folder's name is a number: a fine-tuning of another seed's run (``m-lr0.001-s1-ft-s0``,
    finetune-sweep's folder inside the sweep's) is not a run of point ``m-s0``."""
    from fixedhead.studies.kit.executor import point_files

    folder = tmp_path
    mine = [
        "runs/m-lr0.001-s0/metrics.json",
        "runs/m-lr0.0001-s0/metrics.json",
        "runs/m-lr1e-05-s0/metrics.json",
        "runs/m-lr3e-4-s0/metrics.json",  # a rate written by hand
        "runs/m-s0/metrics.json",
    ]
    others = [
        "finetune-sst2/runs/m-lr0.001-s1-ft-s0/metrics.json",
        "finetune-sst2/runs/m-lr0.001-s1-lr1e-05-s0/metrics.json",  # finetune-sweep's run of checkpoint m-lr0.001-s1
        "runs/m-lr0.001-s1/metrics.json",
        "runs/m-s00/metrics.json",  # a key that starts with this one's
        "runs/m-lr0.001-s01/metrics.json",
        "runs/m-wide-s0/metrics.json",
        "runs/m-s0/checkpoint-5/model.safetensors",  # a checkpoint a finished run may delete
    ]
    for rel in mine + others:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(rel)
    assert sorted(point_files(folder, "m-s0")) == sorted(mine)
