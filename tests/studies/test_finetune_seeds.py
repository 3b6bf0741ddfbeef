import json
import math
from dataclasses import replace

import pytest
from scipy.stats import spearmanr

from _tiny_run import TINY
from fixedhead.cli import main
from fixedhead.runs import model_fingerprint
from fixedhead.studies.kit.study import run_study
from fixedhead.studies.sweep import LEGACY_FILE, PRESETS, SweepOptions, SweepStudy, load_sweep
from fixedhead.studies.sweep.claims import claims
from fixedhead.studies.sweep.finetune_seeds import (
    FinetuneSweepOptions,
    FinetuneSweepStudy,
    as_sweep_state,
    rank_correlation,
    state_of,
)
from fixedhead.studies.sweep.presets import SWEEP_PRESETS, SweepPoint, SweepPreset
from fixedhead.training.finetune import FINETUNE_FILE, FinetuneSettings

FT = FinetuneSettings(
    max_seq_length=16, batch_size=8, max_steps=2, eval_steps=2, validation_size=16, max_train_examples=16,
    max_dev_examples=24, save_model=False, progress=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def masked_sweep(small_real_corpus, tmp_path_factory):
    """Two tiny masked models (standard and fixed at h = 4) x seeds 0, 1: four checkpoints, each fine-tuned once."""
    from fixedhead.data.glue import glue_path

    if not glue_path("sst2", "train").is_file():
        pytest.skip("shared GLUE data not found")
    root = tmp_path_factory.mktemp("ft-seeds")
    preset = SweepPreset(
        data=replace(TINY.data, corpus=str(small_real_corpus), max_seq_length=16, max_eval_tokens=2000),
        train=replace(TINY.train, batch_size=8, max_steps=3, logging_steps=1, eval_steps=3, save_steps=3),
        common=dict(num_hidden_layers=1, max_position_embeddings=16),
        points=[
            SweepPoint("heads", "standard", 4, dict(hidden_size=16, num_attention_heads=4)),
            SweepPoint("heads", "fixed", 4, dict(hidden_size=16, num_attention_heads=4, head_dim=8)),
        ],
        finetune=FT,  # the sweep's fine-tuning budget, which the study fine-tunes every checkpoint with
    )
    with pytest.MonkeyPatch.context() as mp:  # the preset stays known while the module's tests read the sweep
        mp.setitem(SWEEP_PRESETS, "test-ft", lambda: preset)
        mp.setitem(PRESETS, "test-ft", SweepOptions(preset="test-ft", seeds=(0, 1)))
        run_study(SweepStudy(root / "cache"), SweepOptions(preset="test-ft"), root / "sweep", progress=False)
        yield root / "sweep"


def _state(options, out) -> dict:
    """The study's state (what its report reads) from its folder's results."""
    record = json.loads((out / "results.json").read_text())
    return state_of(FinetuneSweepStudy().resolve(options), record["runs"].values(), record["meta"])


def _run(sweep_dir, out, **options) -> dict:
    o = FinetuneSweepOptions(sweep_dir=str(sweep_dir), **options)
    run_study(FinetuneSweepStudy(), o, out, progress=False)
    return _state(o, out)


def test_each_checkpoint_chooses_its_rate_then_every_seed_trains_at_it(masked_sweep, tmp_path):
    out = tmp_path / "ft"
    kw = dict(seeds=(0, 1), learning_rates=(1e-4, 1e-3), max_extensions=0)
    state = _run(masked_sweep, out, **kw)
    assert state["meta"]["settings"]["finetune"]["max_steps"] == FT.max_steps  # the sweep's budget
    sweep = load_sweep(masked_sweep)
    assert sorted(state["tuning"]) == sorted(sweep["runs"])
    for name, t in state["tuning"].items():
        at = {r["learning_rate"]: r for r in state["runs"].values() if r["checkpoint"] == name and r["seed"] == 0}
        assert set(at) == {1e-4, 1e-3}
        # the choice is the highest validation score (ties: the smaller rate), never the dev score
        best = max(sorted(at), key=lambda lr: at[lr]["validation_score"])
        assert t["chosen"] == best
        seeds = sorted(
            r["seed"] for r in state["runs"].values() if r["checkpoint"] == name and r["learning_rate"] == best
        )
        assert seeds == [0, 1]
    # a checkpoint's score for the claims is the mean of its seeds at the chosen rate
    merged = as_sweep_state(sweep, state)
    for name, r in merged["runs"].items():
        chosen = state["tuning"][name]["chosen"]
        dev = [x["score"] for x in state["runs"].values() if x["checkpoint"] == name and x["learning_rate"] == chosen]
        assert r["finetune"]["score"] == pytest.approx(sum(dev) / len(dev))
    assert merged["meta"]["verdict"] == {"test": "welch", "alpha": 0.01, "correction": "holm"}
    assert any("fine-tun" in c and "not measured" not in m for c, m, _ in claims(merged))
    # Spearman's rho over checkpoints with its bootstrap interval
    rho = rank_correlation(sweep, state, resamples=200)
    pairs = [(sweep["runs"][n]["heldout_perplexity"], merged["runs"][n]["finetune"]["score"]) for n in sweep["runs"]]
    expected = spearmanr([a for a, _ in pairs], [b for _, b in pairs])[0]
    assert rho["checkpoints"] == 4
    if expected == expected:  # all scores equal (every model at the majority class): rho is undefined
        assert rho["rho"] == pytest.approx(expected) and rho["low"] <= rho["rho"] <= rho["high"]
    assert "| paper claim | our measurement | verdict |" in (out / "report.md").read_text()
    assert (out / "learning_rates.png").stat().st_size > 5000

    # a rerun reuses every fine-tuning run
    ft_file = next(out.glob(f"runs/*/{FINETUNE_FILE}"))
    mtime = ft_file.stat().st_mtime_ns
    again = _run(masked_sweep, out, **kw)
    assert ft_file.stat().st_mtime_ns == mtime
    assert again["runs"] == state["runs"]
    # rates chosen with another first seed in the same folder are refused rather than mixed in
    with pytest.raises(FileExistsError, match="chose their rates with seed 0"):
        _run(masked_sweep, out, **kw | {"seeds": (2, 0)})
    assert _state(FinetuneSweepOptions(sweep_dir=str(masked_sweep), **kw), out)["runs"] == state["runs"]
    # the default folder is the sweep's own finetune-TASK
    from fixedhead.studies.kit.study import study_folder

    options = FinetuneSweepOptions(sweep_dir=str(masked_sweep), task="cola")
    assert study_folder(FinetuneSweepStudy(), options) == masked_sweep / "finetune-cola"
    assert study_folder(FinetuneSweepStudy(), options, quick=True) == masked_sweep / "finetune-cola-quick"


def test_bad_input_fails_before_any_work(masked_sweep, tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown GLUE task 'sst3'"):
        _run(masked_sweep, tmp_path / "a", task="sst3")
    with pytest.raises(ValueError, match="at least 2 rates"):
        _run(masked_sweep, tmp_path / "b", learning_rates=(1e-3,))
    with pytest.raises(FileNotFoundError, match="no sweep results"):
        _run(tmp_path, tmp_path / "c")
    assert not any((tmp_path / d).exists() for d in "abc")
    assert main(["finetune-sweep", str(tmp_path), "--task", "sst2"]) == 2
    assert "holds no sweep results (results.json)" in capsys.readouterr().err


def _fake_sweep(root, qualities):
    """A sweep folder whose checkpoints are only names: held-out perplexity falls as ``quality`` rises."""
    runs, points = {}, []
    for i, (key, q) in enumerate(qualities.items()):
        points.append({"experiment": "heads", "series": "standard", "x": 2 ** (i + 1), "key": key})
        for seed in (0, 1, 2):
            name = f"{key}-s{seed}"
            (root / "runs" / name).mkdir(parents=True)
            (root / "runs" / name / "model.safetensors").touch()
            runs[name] = {"key": key, "seed": seed, "heldout_perplexity": 300.0 - 100 * q - seed}
            runs[name] |= {"head_dim": 16 // 2 ** (i + 1), "parameters": 1000}
    meta = {"objective": "mlm", "first_started": 1.0, "finetune": {"max_steps": 2, "validation_size": 16}}
    (root / LEGACY_FILE).write_text(json.dumps({"meta": meta, "points": points, "runs": runs}))
    return root


@pytest.fixture
def fake_finetune(monkeypatch, tmp_path):
    """``finetune`` replaced by a table: validation best at 1e-3, GLUE dev best at 1e-4 (a choice made
    on dev would pick it), 3e-3 diverges; the dev score at 1e-3 falls with the checkpoint's perplexity."""
    from fixedhead.studies.sweep import finetune_seeds as FS
    from fixedhead.training.evaluate import DivergedError

    tsv = tmp_path / "glue.tsv"
    tsv.write_text("sentence\tlabel\n")
    monkeypatch.setattr(FS, "glue_path", lambda task, split: tsv)
    quality = {"d16-h2-dp8": 0.1, "d16-h4-dp4": 0.2, "d16-h8-dp2": 0.3}
    calls = []

    def fake(run_dir, task, out, settings, overwrite=False):
        lr, seed = settings.learning_rate, settings.seed
        calls.append((run_dir.name, lr, seed))
        if lr >= 3e-3:
            raise DivergedError("fine-tuning loss became non-finite")
        key, pretraining_seed = run_dir.name.rsplit("-s", 1)
        q = quality[key] + 0.01 * int(pretraining_seed) + 0.001 * seed  # _fake_sweep's perplexity order
        val, dev = (0.8, 0.5 + q) if lr == 1e-3 else (0.6, 0.99)
        if lr < 1e-4:  # the extension test: validation rises with the rate up to 1e-2
            val, dev = 0.9 - abs(math.log(lr / 1e-2)), 0.5
        fingerprint = {"model": model_fingerprint(run_dir)}
        result = {"metric": "accuracy", "score": dev, "validation": {"accuracy": val}, "train_seconds": 1.0} | {
            "fingerprint": fingerprint
        }
        out.mkdir(parents=True, exist_ok=True)  # the file the real one writes last
        (out / FINETUNE_FILE).write_text(json.dumps(result))
        return result

    monkeypatch.setattr(FS, "finetune", fake)
    return quality, calls


def test_the_rate_is_chosen_on_validation_not_dev_and_a_diverged_rate_is_the_worst(fake_finetune, tmp_path):
    quality, calls = fake_finetune
    sweep_dir = _fake_sweep(tmp_path / "sweep", quality)
    state = _run(sweep_dir, tmp_path / "ft", seeds=(0, 1, 2), learning_rates=(1e-4, 1e-3, 3e-3), max_extensions=1)
    assert len(state["tuning"]) == 9
    for t in state["tuning"].values():
        # 1e-3 has the best validation score, 1e-4 the best dev score; 3e-3 diverged: recorded as None
        assert t["chosen"] == 1e-3 and t["bracketed"]
        assert t["validation_score"] == {"0.0001": 0.6, "0.001": 0.8, "0.003": None}
    # 3 rates with seed 0, then seeds 1 and 2 at the chosen rate only
    assert len(calls) == 9 * (3 + 2)
    assert all(lr == 1e-3 for _, lr, seed in calls if seed != 0)
    # each checkpoint's fine-tuning score rises exactly as its perplexity falls: rho = -1, and the
    # claim "lower perplexity goes with better fine-tuning" agrees
    sweep = json.loads((sweep_dir / LEGACY_FILE).read_text())
    rho = rank_correlation(sweep, state, resamples=200)
    assert rho["checkpoints"] == 9 and rho["rho"] == pytest.approx(-1.0)
    assert rho["low"] == pytest.approx(-1.0) and rho["high"] == pytest.approx(-1.0)
    rows = {c: v for c, _, v in claims(as_sweep_state(sweep, state))}
    assert rows["Implicit throughout: lower pretraining perplexity goes with better fine-tuning"] == "agrees"


def test_the_grid_grows_one_of_its_own_steps_past_an_edge(fake_finetune, tmp_path):
    quality, calls = fake_finetune
    sweep_dir = _fake_sweep(tmp_path / "sweep", {"d16-h2-dp8": quality["d16-h2-dp8"]})
    state = _run(sweep_dir, tmp_path / "ft", seeds=(0,), learning_rates=(3e-5, 9e-5), max_extensions=1)
    # best at the top edge (9e-5); the grid's step is x3: 2.7e-4 is trained, and is still the edge
    for t in state["tuning"].values():
        assert list(t["validation_score"]) == ["3e-05", "9e-05", "0.00027"]
        assert t["chosen"] == pytest.approx(2.7e-4) and not t["bracketed"]


def test_a_bad_extension_count_or_a_causal_sweep_is_refused_before_the_folder_exists(fake_finetune, tmp_path):
    quality, _ = fake_finetune
    sweep_dir = _fake_sweep(tmp_path / "sweep", quality)
    with pytest.raises(ValueError, match="max_extensions"):
        _run(sweep_dir, tmp_path / "a", max_extensions=-1)
    state = json.loads((sweep_dir / LEGACY_FILE).read_text())
    state["meta"]["objective"] = "clm"
    (sweep_dir / LEGACY_FILE).write_text(json.dumps(state))
    with pytest.raises(ValueError, match="'clm' sweep"):
        _run(sweep_dir, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_retrained_checkpoint_is_not_read_from_an_old_result_and_a_moved_sweep_resumes(fake_finetune, tmp_path):
    """Each point records its checkpoint's fingerprint: a sweep moved with its fine-tuning folder resumes
    without fine-tuning anything again; a checkpoint retrained in place makes the stored points stale."""
    import shutil

    quality, calls = fake_finetune
    sweep_dir = _fake_sweep(tmp_path / "a" / "sweep", quality)
    kw = dict(seeds=(0, 1), learning_rates=(1e-3, 3e-3), max_extensions=0)
    first = _run(sweep_dir, sweep_dir / "finetune-sst2", **kw)
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = tmp_path / "b" / "sweep"
    calls.clear()
    assert _run(moved, moved / "finetune-sst2", **kw)["runs"] == first["runs"] and calls == []
    (moved / "runs" / "d16-h4-dp4-s1" / "model.safetensors").write_bytes(b"retrained")
    with pytest.raises(FileExistsError, match=r"inputs that have changed since \(d16-h4-dp4-s1-ft-s0.*--overwrite"):
        _run(moved, moved / "finetune-sst2", **kw)
    assert calls == []


def test_an_edited_finetuning_file_is_refused_on_resume_and_older_points_without_files_resume(fake_finetune, tmp_path):
    """Each point records the digest of its fine-tuning runs' finetune_metrics.json, as other studies record
    their run files: one rewritten after the point finished is refused in one line naming it; a point recorded
    without files (an older study) resumes and regenerates as before."""
    from fixedhead.studies.kit.study import regenerate

    quality, calls = fake_finetune
    sweep_dir = _fake_sweep(tmp_path / "sweep", {"d16-h2-dp8": quality["d16-h2-dp8"]})
    out, kw = tmp_path / "ft", dict(seeds=(0, 1), learning_rates=(1e-3, 3e-3), max_extensions=0)
    first = _run(sweep_dir, out, **kw)
    points = json.loads((out / "results.json").read_text())["points"]
    recorded = points["d16-h2-dp8-s0-ft-s0"]["files"]
    assert sorted(recorded) == [f"runs/d16-h2-dp8-s0-lr0.001-s0/{FINETUNE_FILE}"]  # 3e-3 diverged: no file
    assert sorted(points["d16-h2-dp8-s0-ft-s1"]["files"]) == [f"runs/d16-h2-dp8-s0-lr0.001-s1/{FINETUNE_FILE}"]
    edited = out / "runs" / "d16-h2-dp8-s0-lr0.001-s1" / FINETUNE_FILE
    edited.write_text(edited.read_text().replace('"score": ', '"score": 1e-9 + '))
    results = (out / "results.json").read_text()
    with pytest.raises(FileExistsError) as refused:
        _run(sweep_dir, out, **kw)
    message = str(refused.value)
    assert "\n" not in message and f"{edited} (point d16-h2-dp8-s0-ft-s1) no longer matches its record" in message
    assert (out / "results.json").read_text() == results
    with pytest.raises(FileExistsError, match=r"\(point d16-h2-dp8-s0-ft-s1\) no longer matches"):
        regenerate(FinetuneSweepStudy(), out)
    # a folder whose points recorded no files (written before they did) resumes and regenerates as before
    record = json.loads(results)
    for rec in record["points"].values():
        rec.pop("files")
    (out / "results.json").write_text(json.dumps(record))
    calls.clear()
    assert _run(sweep_dir, out, **kw)["runs"] == first["runs"] and calls == []
    assert regenerate(FinetuneSweepStudy(), out)[0]["runs"] == record["runs"]
