import importlib
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from _tiny_run import TINY, require_data
from fixedhead.cli import main
from fixedhead.model.attention import MultiHeadAttention
from fixedhead.studies.kit.study import run_study
from fixedhead.studies.sweep import LEGACY_FILE, PRESETS, SweepOptions, SweepStudy, load_sweep, write_report
from fixedhead.studies.sweep.claims import PointStats, claims, collect_points
from fixedhead.studies.sweep.presets import (
    SWEEP_PRESETS,
    SweepPoint,
    SweepPreset,
    canonical_fields,
    get_sweep_preset,
    model_key,
    plan_runs,
    points_text,
)
from fixedhead.studies.sweep.report import points_table
from fixedhead.training.evaluate import load_run
from fixedhead.training.finetune import FINETUNE_FILE, FinetuneSettings

P = importlib.import_module("fixedhead.training.pretrain")  # the module, not the function


def test_same_architecture_is_one_run():
    # a fixed head size equal to d/h is the standard layer: one key, one run
    assert canonical_fields(dict(hidden_size=128, num_attention_heads=4, head_dim=32))["head_dim"] is None
    assert model_key(dict(hidden_size=128, num_attention_heads=4, head_dim=32)) == "d128-h4-dp32"
    assert model_key(dict(hidden_size=128, num_attention_heads=4)) == "d128-h4-dp32"
    assert model_key(dict(hidden_size=128, num_attention_heads=8, head_dim=32)) == "d128-h8-dp32-fixed"


def test_cpu_plan_is_deduplicated_and_seed_major():
    preset = get_sweep_preset("cpu")
    plan = plan_runs(preset, PRESETS["cpu"].seeds)
    keys = [k for k, _, s in plan if s == 0]
    assert len(keys) == len(set(keys)) == 12
    assert [s for _, _, s in plan] == [0] * 12 + [1] * 12
    # every experiment has >= 2 seeds per point and both series where the paper has both
    exps = {(p.experiment, p.series) for p in preset.points}
    assert exps == {
        ("heads", "standard"),
        ("heads", "fixed"),
        ("embedding", "standard"),
        ("embedding", "fixed"),
        ("head_size", "fixed"),
    }
    assert len(plan_runs(preset, (0, 1), ["head_size"])) == 2 * 4
    with pytest.raises(ValueError, match="'bogus'"):
        plan_runs(preset, (0, 1), ["bogus"])
    with pytest.raises(ValueError, match="'gpu'"):
        get_sweep_preset("gpu")


def test_cpu_mlm_sweep_uses_the_masked_recipe_and_covers_every_claim():
    from fixedhead.studies.compare import CompareOptions, spec

    preset, recipe = get_sweep_preset("cpu-mlm"), spec(CompareOptions(preset="cpu-mlm"))
    for field in ("objective", "mlm_probability", "batch_size", "learning_rate", "max_steps"):
        assert getattr(preset.train, field) == getattr(recipe.train, field), field
    assert preset.train.mlm_probability == 0.4 and preset.train.objective == "mlm"
    n = preset.data.max_seq_length
    assert n == recipe.data.max_seq_length == preset.common["max_position_embeddings"]
    assert preset.finetune is not None and preset.finetune.max_seq_length <= n  # no untrained positions
    plan = plan_runs(preset, PRESETS["cpu-mlm"].seeds)
    assert len({k for k, _, _ in plan}) == 8 and len(PRESETS["cpu-mlm"].seeds) >= 3
    assert {p.experiment for p in preset.points} == {"heads", "embedding", "head_size"}
    assert get_sweep_preset("tiny").train.mlm_probability == 0.4
    with pytest.raises(ValueError, match="'cpu-clm' has no fine-tuning.*'cola'"):
        run_study(SweepStudy(), SweepOptions(preset="cpu-clm", finetune_task="cola"), "/nonexistent/never-written")
    assert not Path("/nonexistent/never-written").exists()


def _register(monkeypatch, preset: SweepPreset, name: str = "test", **options) -> SweepOptions:
    """A sweep of ``preset`` (a test's own points and recipe) with seeds 0 and 1, registered as preset ``name``."""
    monkeypatch.setitem(SWEEP_PRESETS, name, lambda: preset)
    monkeypatch.setitem(PRESETS, name, SweepOptions(preset=name, seeds=(0, 1)))
    return SweepOptions(preset=name, **options)


def _tiny_preset(corpus):
    short = replace(TINY.data, corpus=str(corpus), max_seq_length=16, max_eval_tokens=2000)
    return SweepPreset(
        data=short,
        train=replace(TINY.train, batch_size=8, max_steps=3, logging_steps=1, eval_steps=3, save_steps=3),
        common=dict(
            num_hidden_layers=1, max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        ),
        points=[
            SweepPoint("heads", "standard", 2, dict(hidden_size=16, num_attention_heads=2)),
            SweepPoint("heads", "standard", 4, dict(hidden_size=16, num_attention_heads=4)),
            SweepPoint("heads", "fixed", 4, dict(hidden_size=16, num_attention_heads=4, head_dim=8)),
            SweepPoint("embedding", "standard", 16, dict(hidden_size=16, num_attention_heads=2)),
            SweepPoint("embedding", "fixed", 16, dict(hidden_size=16, num_attention_heads=4, head_dim=8)),
            SweepPoint("head_size", "fixed", 4, dict(hidden_size=16, num_attention_heads=4, head_dim=4)),
            SweepPoint("head_size", "fixed", 8, dict(hidden_size=16, num_attention_heads=4, head_dim=8)),
        ],
        finetune=FinetuneSettings(
            max_seq_length=16,
            batch_size=8,
            max_steps=2,
            eval_steps=2,
            validation_size=16,
            max_train_examples=16,
            max_dev_examples=24,
            save_model=False,
        ),
    )


def test_tiny_sweep_report_and_resume(small_real_corpus, tmp_path, monkeypatch):
    from fixedhead.data.glue import glue_path, majority_class_accuracy

    if not glue_path("sst2", "train").is_file():
        pytest.skip("shared GLUE data not found")
    options = _register(monkeypatch, _tiny_preset(small_real_corpus))
    out = tmp_path / "sweep"
    state = run_study(SweepStudy(tmp_path / "cache"), options, out, progress=False, command="test")
    # 3 distinct models (h=2 std, h=4 std = d_p 4, h=4 d_p=8 fixed) x 2 seeds
    assert sorted(state["runs"]) == sorted(
        f"{k}-s{s}" for k in ("d16-h2-dp8", "d16-h4-dp4", "d16-h4-dp8-fixed") for s in (0, 1)
    )
    saved = load_sweep(out)  # the state the claims and the report read: runs by their folder
    assert saved["runs"].keys() == state["runs"].keys() and not state["missing"]
    assert all("finetune" in r and 0 <= r["finetune"]["score"] <= 1 for r in saved["runs"].values())
    assert not list(out.glob("runs/*/checkpoint-*")), "pretraining checkpoints are removed after each run"
    # the context-free reference: better than a uniform guess over the vocabulary, worse than certainty
    assert 1.0 < saved["meta"]["unigram_perplexity"] < saved["meta"]["data_info"]["vocab_size"]
    # the majority-class rate of the dev examples fine-tuning scored (the first 24) is recorded, so the
    # report needs no data (majority_class_accuracy is checked against the dev label counts in test_glue)
    assert saved["meta"]["majority_class_accuracy"] == majority_class_accuracy("sst2", max_examples=24) != 444 / 872

    report = write_report(out, tmp_path / "report")
    assert report == tmp_path / "report" / "report.md" and report.stat().st_size > 0
    for png in ("heads.png", "params.png", "head_size.png", "finetune_vs_perplexity.png"):
        assert (tmp_path / "report" / png).stat().st_size > 5000, png
    from fixedhead.studies.sweep.claims import UNTESTED

    verdicts = ("agrees", "does not agree", "cannot tell at this scale", UNTESTED)  # tiny models: at chance
    rows = claims(saved)
    assert len(rows) >= 8 and all(v in verdicts for _, _, v in rows)
    # a sweep without fine-tuning (the causal preset): every fine-tuning claim is unmeasured, not guessed
    no_ft = json.loads(json.dumps(saved))
    for r in no_ft["runs"].values():
        del r["finetune"]
    unmeasured = [m for _, m, _ in claims(no_ft) if m == "not measured (this sweep has no fine-tuning)"]
    assert len(unmeasured) == 5
    (tmp_path / "no-ft").mkdir()
    (tmp_path / "no-ft" / LEGACY_FILE).write_text(json.dumps(no_ft))  # a sweep from before the kit reads too
    write_report(tmp_path / "no-ft")
    assert not (tmp_path / "no-ft" / "finetune_vs_perplexity.png").exists()
    # a sweep of one experiment (--experiments head_size) draws and links only that experiment's plot
    only = json.loads(json.dumps(saved))
    only["points"] = [p for p in only["points"] if p["experiment"] == "head_size"]
    assert only["points"] and len(only["points"]) < len(saved["points"])
    (tmp_path / "head-size").mkdir()
    (tmp_path / "head-size" / LEGACY_FILE).write_text(json.dumps(only))
    text = write_report(tmp_path / "head-size").read_text()
    assert (tmp_path / "head-size" / "head_size.png").exists() and "(head_size.png)" in text
    for png in ("heads.png", "params.png"):
        assert not (tmp_path / "head-size" / png).exists() and f"({png})" not in text

    # resume: finished points are neither pretrained nor fine-tuned again; an unfinished one (its result not
    # saved, its training not finished) is
    calls = []
    trainer = P.atomic_checkpoint_trainer

    def recording():
        class Recording(trainer()):
            def train(self, *args, **kwargs):
                calls.append(Path(self.args.output_dir).name)
                return super().train(*args, **kwargs)

        return Recording

    monkeypatch.setattr(P, "atomic_checkpoint_trainer", recording)
    ft_file = out / "runs" / "d16-h2-dp8-s0" / "finetune-sst2" / FINETUNE_FILE
    mtime = ft_file.stat().st_mtime_ns
    (out / "runs" / "d16-h4-dp4-s1" / "metrics.json").unlink()
    record = json.loads((out / "results.json").read_text())
    del record["runs"]["d16-h4-dp4-s1"]
    (out / "results.json").write_text(json.dumps(record))
    again = run_study(SweepStudy(tmp_path / "cache"), options, out, progress=False, command="test")
    assert calls == ["d16-h4-dp4-s1"]
    assert ft_file.stat().st_mtime_ns == mtime
    assert again["runs"]["d16-h2-dp8-s0"]["heldout_perplexity"] == state["runs"]["d16-h2-dp8-s0"]["heldout_perplexity"]


def test_cli_report_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err  # an empty folder is no study's, not a sweep's without results
    assert "is not a study folder (no plan.json or results.json)" in err and "sweep results" not in err


def test_cli_quick_sweep_then_report(small_real_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "q"
    rc = main(
        [
            "sweep",
            "--quick",
            "--corpus",
            str(small_real_corpus),
            "--output-dir",
            str(out),
            "--experiments",
            "head_size",
            "--seeds",
            "0",
            "--max-steps",
            "2",
            "--skip-finetune",
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    state = load_sweep(out)
    assert sorted(state["runs"]) == ["d32-h4-dp16-fixed-s0", "d32-h4-dp8-s0"]
    assert state["meta"]["quick"] and state["meta"]["train"]["max_steps"] == 2
    assert "Sweep report: tiny (--quick)" in (out / "report.md").read_text()
    assert main(["report", str(out), "--output-dir", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.md").read_text() == (out / "report.md").read_text()
    assert main(["report", str(out), "--output-dir", str(tmp_path / "r")]) == 0  # its own folder again
    # another study's folder also holds a report.md: refused, nothing replaced
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.md").write_text("another study's report")
    (tmp_path / "other" / "results.json").write_text("{}")
    assert main(["report", str(out), "--output-dir", str(tmp_path / "other")]) == 2
    assert (tmp_path / "other" / "report.md").read_text() == "another study's report"
    assert sorted(q.name for q in (tmp_path / "other").iterdir()) == ["report.md", "results.json"]
    # bits per character beside perplexity in the points' table, from the run's result (one seed)
    bpc = state["runs"]["d32-h4-dp8-s0"]["heldout_bits_per_character"]
    points = collect_points(state)[("head_size", "fixed")]
    assert 0 < bpc < 10 and f"| {bpc:.3f} (1 seed) |" in "\n".join(points_table(points, "d_p", None).lines())
    # a held-out loss edited in results.json (its run's metrics.json disagrees): `report` refuses, naming the point
    record = json.loads((out / "results.json").read_text())
    record["runs"]["d32-h4-dp8-s0"]["heldout_loss"] -= 0.5
    (out / "results.json").write_text(json.dumps(record))
    assert main(["report", str(out), "--output-dir", str(tmp_path / "r")]) == 2
    assert "the result of point d32-h4-dp8-s0 was changed after it was recorded" in capsys.readouterr().err


def test_report_table_shows_bits_per_character_and_a_dash_for_older_results():

    run = dict(hidden_size=32, num_attention_heads=4, head_dim=8, parameters=10_000, heldout_perplexity=100.0)
    both = PointStats("heads", "fixed", 4, "k1", [dict(run, heldout_bits_per_character=1.0), dict(run)])
    both.runs[1]["heldout_bits_per_character"] = 1.2
    old = PointStats("heads", "fixed", 8, "k2", [dict(run), dict(run)])  # results from before it was measured
    mixed = PointStats("heads", "fixed", 16, "k3", [dict(run, heldout_bits_per_character=1.5), dict(run)])
    lines = points_table([both, old, mixed], "h", None).lines()
    assert lines[0] == "| h | d | h | d_p | params | seeds | held-out perplexity | bits/char | run |"
    # mean 1.1, sample std sqrt(((-0.1)^2 + 0.1^2) / 1) = 0.1414
    assert "| 100.00 ± 0.00 | 1.100 ± 0.141 | `k1` |" in lines[2]
    assert "| 100.00 ± 0.00 | – | `k2` |" in lines[3]
    assert "| 1.500 (1 of 2 seeds) | `k3` |" in lines[4]


def test_a_sweep_with_a_learning_rate_grid_trains_every_seed_at_each_models_rate(
    small_real_corpus, tmp_path, monkeypatch
):
    preset = replace(_tiny_preset(small_real_corpus), finetune=None)
    preset = replace(preset, points=preset.points[:3])  # two models: h=2, h=4 standard and h=4 fixed
    options = _register(monkeypatch, preset, learning_rates=(1e-3, 4e-3), max_extensions=1)
    out = tmp_path / "sweep"
    kw = dict(progress=False)
    record = run_study(SweepStudy(tmp_path / "cache"), options, out, **kw)
    saved = load_sweep(out)
    assert saved["meta"]["learning_rate_selection"]["grid"] == [1e-3, 4e-3]
    assert saved["meta"]["verdict"] == {"test": "welch", "alpha": 0.01, "correction": "holm"}
    assert json.loads((out / "plan.json").read_text())["plan"]["verdict_rule"].startswith("Welch")  # before training
    assert saved["meta"]["data"]["validation_fraction"] > 0
    for key, chosen in saved["tuning"].items():
        losses = {float(lr): v for lr, v in chosen["validation_loss"].items()}
        assert chosen["chosen"] == min(losses, key=lambda lr: losses[lr])
        # each seed trained at the chosen rate; only those runs count in the results
        at_rate = {k: r for k, r in saved["runs"].items() if r["key"] == key}
        assert sorted(r["seed"] for r in at_rate.values()) == [0, 1]
        assert {r["learning_rate"] for r in at_rate.values()} == {chosen["chosen"]}
        assert set(at_rate) == {f"{key}-lr{chosen['chosen']:g}-s{s}" for s in (0, 1)}
    assert not list(out.glob("runs/*/checkpoint-*")), "the grid's runs keep no Trainer checkpoints either"
    # the report names each model's rate in its table and plots the validation curves
    assert (out / "learning_rates.png").is_file()
    for pts in collect_points(saved).values():
        lines = points_table(pts, "h", None).lines()
        lr_col = lines[0].split(" | ").index("lr")
        for q, line in zip(pts, lines[2:], strict=True):
            assert line.split(" | ")[lr_col] == f"{saved['tuning'][q.key]['chosen']:g}"
    # rates chosen with seed 0 stay chosen: another first seed (or no grid) in this folder is refused
    with pytest.raises(FileExistsError, match="chose their rates with seed 0"):
        run_study(SweepStudy(tmp_path / "cache"), replace(options, seeds=(1, 0)), out, **kw)
    with pytest.raises(FileExistsError, match="other settings.*--learning-rates"):  # a shared-rate call
        run_study(SweepStudy(tmp_path / "cache"), replace(options, learning_rates=()), out, **kw)
    again = run_study(SweepStudy(tmp_path / "cache"), options, out, **kw)  # everything reused
    assert again["runs"] == record["runs"]


def test_a_sweep_preset_as_llama_keeps_its_points_and_names_its_runs():
    from fixedhead.studies.sweep.presets import as_architecture

    clm = get_sweep_preset("cpu-clm")
    llama = as_architecture(clm, "llama")
    assert llama.points == clm.points and "LlamaForCausalLM" in points_text(llama)
    keys = [key for key, _, _ in plan_runs(llama, (0,))]
    assert keys == [f"{key}-llama" for key, _, _ in plan_runs(clm, (0,))]
    assert all(fields["architecture"] == "llama" for _, fields, _ in plan_runs(llama, (0,)))
    assert as_architecture(clm, "fixedhead") is clm
    with pytest.raises(ValueError, match="architecture must be one of fixedhead, llama, got 'bert'"):
        as_architecture(clm, "bert")


def test_cli_quick_causal_sweep_as_llama(small_real_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "q"
    common = ["sweep", "--quick", "--corpus", str(small_real_corpus), "--output-dir", str(out), "--threads", "1"]
    # the masked preset cannot be trained as Llama: refused before any work
    assert main([*common, "--architecture", "llama"]) == 2
    err = capsys.readouterr().err  # sweep has no --objective: the refusal names the causal presets
    assert "--architecture llama trains causal LMs only, and sweep preset 'tiny' trains masked LMs" in err
    assert "(--preset cpu-clm or tiny-clm)" in err and not out.exists()
    args = ["--preset", "tiny-clm", "--architecture", "llama", "--experiments", "head_size", "--seeds", "0"]
    with pytest.raises(SystemExit) as exit:  # the report is always written: said so
        main([*common, *args, "--no-report"])
    assert exit.value.code == 2
    assert "--no-report is gone: the report is written" in capsys.readouterr().err
    assert main([*common, *args, "--max-steps", "2"]) == 0
    state = load_sweep(out)
    assert sorted(state["runs"]) == ["d32-h4-dp16-fixed-llama-s0", "d32-h4-dp8-llama-s0"]
    for name, head_dim in (("d32-h4-dp16-fixed-llama-s0", 16), ("d32-h4-dp8-llama-s0", 8)):
        saved = json.loads((out / "runs" / name / "config.json").read_text())
        assert (saved["model_type"], saved["head_dim"]) == ("llama", head_dim)
        assert state["runs"][name]["architecture"] == "llama" and state["runs"][name]["head_dim"] == head_dim
    assert main(["report", str(out), "--output-dir", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "head_size.png").stat().st_size > 5000


def test_a_sweep_preset_under_mup_names_its_runs_and_refuses_a_bad_base():
    from fixedhead.studies.sweep.presets import as_mup

    mlm = get_sweep_preset("cpu-mlm")
    mup = as_mup(mlm, 16)
    assert mup.points == mlm.points and "μP-style, based at d_p = 16" in points_text(mup)
    plan, base_plan = plan_runs(mup, (0, 1)), plan_runs(mlm, (0, 1))
    assert [key for key, _, _ in plan] == [f"{key}-mup16" for key, _, _ in base_plan]
    assert all((f["parametrization"], f["mup_base_head_dim"]) == ("mup", 16) for _, f, _ in plan)
    for bad in (0, -8, 2.5, True):
        with pytest.raises(ValueError, match=f"mup_base_head_dim must be a positive int, got {bad!r}"):
            as_mup(mlm, bad)


def test_a_sweep_restricted_to_some_models_keeps_their_points_only(tmp_path, capsys):
    from fixedhead.studies.sweep.presets import only_models

    clm = get_sweep_preset("cpu-clm")
    pair = only_models(clm, ["d128-h32-dp4", "d128-h32-dp32-fixed"], "cpu-clm")
    # the fixed h = 32 model is a point of two experiments (heads and embedding): both kept, one run
    assert [(p.experiment, p.series, p.x) for p in pair.points] == [
        ("heads", "standard", 32),
        ("heads", "fixed", 32),
        ("embedding", "fixed", 128),
    ]
    assert [key for key, _, seed in plan_runs(pair, (0,)) if seed == 0] == ["d128-h32-dp4", "d128-h32-dp32-fixed"]
    for bad in (["d128-h32-dp8"], []):
        with pytest.raises(ValueError, match=r"model '(d128-h32-dp8|\(none\))' is not in sweep preset 'cpu-clm' \(its"):
            only_models(clm, bad, "cpu-clm")
    with pytest.raises(ValueError, match="model 'd128-h32-dp4' is not in experiments embedding of sweep preset"):
        only_models(clm, ["d128-h32-dp4"], "cpu-clm", ["embedding"])  # a model of the heads experiment only
    out = tmp_path / "never"
    assert main(["sweep", "--preset", "cpu-clm", "--models", "d64-h1", "--output-dir", str(out)]) == 2
    assert "model 'd64-h1' is not in sweep preset 'cpu-clm'" in capsys.readouterr().err and not out.exists()


def test_cli_quick_sweep_under_mup_and_no_mixing_in_one_folder(small_real_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "q"
    common = ["sweep", "--quick", "--corpus", str(small_real_corpus), "--output-dir", str(out), "--threads", "1"]
    common += ["--preset", "tiny-clm", "--experiments", "head_size", "--seeds", "0", "--max-steps", "2"]
    # Llama has no μP option here: refused before any folder is written
    assert main([*common, "--architecture", "llama", "--mup-base-head-dim", "8"]) == 2
    assert "parametrization" in capsys.readouterr().err and not out.exists()
    assert main([*common, "--mup-base-head-dim", "8"]) == 0
    state = load_sweep(out)
    assert sorted(state["runs"]) == ["d32-h4-dp16-fixed-mup8-s0", "d32-h4-dp8-mup8-s0"]
    for name, head_dim in (("d32-h4-dp16-fixed-mup8-s0", 16), ("d32-h4-dp8-mup8-s0", 8)):
        model = load_run(out / "runs" / name)[0]
        assert (model.config.parametrization, model.config.mup_base_head_dim) == ("mup", 8)
        attention = next(m for m in model.modules() if isinstance(m, MultiHeadAttention))
        # μP based at 8: logits √8/d_p (1/√8 at the base itself, where μP is the standard model)
        assert attention.scale == pytest.approx(math.sqrt(8) / head_dim)
    # the same points without μP in that folder would put two models at each point of one report
    assert main(common) == 2
    err = capsys.readouterr().err
    assert "run with other settings (--mup-base-head-dim: 8 → None)" in err
    assert sorted(load_sweep(out)["runs"]) == sorted(state["runs"])


def test_a_grown_sweep_accepts_two_models_at_one_point(small_real_corpus, tmp_path, monkeypatch):
    """The embedding experiment's fixed models share x = d (one per h): a sweep run one model at a time
    (``--models``) grows to both (the report says it grew), and resuming it trains nothing again."""
    points = [
        SweepPoint("embedding", "fixed", 32, dict(hidden_size=32, num_attention_heads=h, head_dim=16)) for h in (2, 4)
    ]
    preset = replace(get_sweep_preset("tiny"), points=points, finetune=None)
    options = _register(monkeypatch, preset, corpus=str(small_real_corpus), steps=2, seeds=(0,))
    kw = dict(progress=False)
    run_study(SweepStudy(tmp_path / "cache"), replace(options, models=("d32-h2-dp16",)), tmp_path / "s", **kw)
    with pytest.raises(FileExistsError, match="--grow"):
        run_study(SweepStudy(tmp_path / "cache"), replace(options, models=("d32-h4-dp16-fixed",)), tmp_path / "s", **kw)
    run_study(
        SweepStudy(tmp_path / "cache"), replace(options, models=("d32-h4-dp16-fixed",)), tmp_path / "s", grow=True, **kw
    )
    record = run_study(
        SweepStudy(tmp_path / "cache"), options, tmp_path / "s", grow=True, **kw
    )  # both stored: nothing trains
    assert sorted(record["runs"]) == ["d32-h2-dp16-s0", "d32-h4-dp16-fixed-s0"] and not record["missing"]
    assert (
        len(record["plan_history"]) == 2 and "grew after results existed" in (tmp_path / "s" / "report.md").read_text()
    )
    # another preset's models in that folder would put two models at one point: refused
    with pytest.raises(FileExistsError, match="other settings"):
        run_study(SweepStudy(tmp_path / "cache"), replace(options, preset="tiny"), tmp_path / "s", **kw)


def _claims_state(std_ppl: list[float], fix_ppl: list[float], verdict: dict | None) -> dict:
    """A causal sweep's state with one comparison measured: standard h=8 against fixed h=8 (the
    Sect. 4 row); the other claims lack points and are not tested."""
    run = dict(hidden_size=32, num_attention_heads=8, parameters=10_000)
    runs = {f"s-{i}": dict(run, key="s", seed=i, head_dim=4, heldout_perplexity=v) for i, v in enumerate(std_ppl)}
    runs |= {f"f-{i}": dict(run, key="f", seed=i, head_dim=16, heldout_perplexity=v) for i, v in enumerate(fix_ppl)}
    points = [
        dict(experiment="heads", series="standard", x=8, key="s"),
        dict(experiment="heads", series="fixed", x=8, key="f"),
    ]
    meta = {"seeds": [0, 1, 2], "objective": "clm"} | ({"verdict": verdict} if verdict else {})
    return {"meta": meta, "points": points, "runs": runs}


def _sect4(state):
    return next(row for row in claims(state) if row[0].startswith("Sect. 4"))


def test_the_recorded_rule_decides_a_claim_and_older_sweeps_keep_theirs():
    from scipy.stats import ttest_ind

    from fixedhead.studies.kit.stats import CLAIMS_RULE

    std, fix = [100.0, 101.0, 102.0], [97.5, 98.5, 99.0]  # fixed lower, Welch p between 0.01 and 0.05
    p = ttest_ind(fix, std, equal_var=False).pvalue
    assert 0.01 < p < 0.05
    assert _sect4(_claims_state(std, fix, None))[2] == "agrees"  # p < 0.05, each claim on its own
    assert _sect4(_claims_state(std, fix, CLAIMS_RULE))[2] == "cannot tell at this scale"
    # a clear difference agrees under the recorded rule too; with one claim tested Holm changes nothing
    far = [90.0, 90.5, 91.0]
    p_far = ttest_ind(far, std, equal_var=False).pvalue
    assert p_far < 0.01
    claim, text, verdict = _sect4(_claims_state(std, far, CLAIMS_RULE))
    assert verdict == "agrees" and f"Holm-adjusted p = {p_far:.2g}" in text
    # the effect in nats and as a fraction of the standard model's loss
    nats = sum(map(math.log, far)) / 3 - sum(map(math.log, std)) / 3
    assert f"{nats:+.3f} nats = {100 * nats / (sum(map(math.log, std)) / 3):+.1f}% of loss" in text
    # a higher fixed perplexity at p < 0.01 does not agree
    assert _sect4(_claims_state(far, std, CLAIMS_RULE))[2] == "does not agree"
    # one seed a side: no test is run, and the text says so instead of printing p = nan
    claim, text, verdict = _sect4(_claims_state(std[:1], far[:1], CLAIMS_RULE))
    assert verdict == "cannot tell at this scale" and "no test with one seed a side" in text and "nan" not in text


def test_holm_counts_every_claim_tested():
    from fixedhead.studies.kit.stats import CLAIMS_RULE, holm

    std, fix = [100.0, 101.0, 102.0], [97.0, 97.4, 98.1]
    state = _claims_state(std, fix, CLAIMS_RULE)
    # a second tested claim (Fig. 3a, fixed heads improve from h=2 to h=8) with a large p
    run = dict(hidden_size=32, num_attention_heads=2, parameters=10_000, head_dim=16)
    state["runs"] |= {f"f2-{i}": dict(run, key="f2", seed=i, heldout_perplexity=v) for i, v in enumerate(fix[::-1])}
    state["points"].insert(1, dict(experiment="heads", series="fixed", x=2, key="f2"))
    rows = [r for r in claims(state) if "Welch p = " in r[1]]
    assert len(rows) == 2
    raw = [float(r[1].split("Welch p = ")[1].split(",")[0]) for r in rows]
    adjusted = holm(raw)
    for (_, text, _), q in zip(rows, adjusted, strict=True):
        assert f"Holm-adjusted p = {q:.2g}" in text
    assert adjusted[1] == pytest.approx(2 * min(raw), rel=0.05)  # the smaller p, doubled


def _finetune_state(task: str, scores_h8: list[float], scores_h32: list[float], majority: float | None) -> dict:
    """A masked sweep's state with Table 1 measured on fine-tuning: standard h=8 against h=32, one
    fine-tuning score per pretraining seed, each scored on ``task``'s dev set."""
    dev = {"sst2": 872, "cola": 1043}[task]
    runs = {}
    for h, scores in ((8, scores_h8), (32, scores_h32)):
        for i, v in enumerate(scores):
            runs[f"h{h}-{i}"] = dict(
                key=f"h{h}", seed=i, hidden_size=32, num_attention_heads=h, head_dim=32 // h, parameters=10_000,
                heldout_perplexity=100.0 + i + h, finetune={"score": v, "dev_examples": dev},
            )  # fmt: skip
    points = [dict(experiment="heads", series="standard", x=h, key=f"h{h}") for h in (8, 32)]
    meta = {"seeds": [0, 1, 2], "objective": "mlm", "finetune_task": task}
    return {"meta": meta | ({"majority_class_accuracy": majority} if majority else {}), "points": points, "runs": runs}


def _table1(state):
    return next(row for row in claims(state) if row[0].startswith("Table 1"))


def test_a_fine_tuning_claim_at_chance_is_untested():
    from fixedhead.studies.sweep.claims import chance_bar

    # Matthews correlation (CoLA): chance is 0; the bar is two standard errors, 2/√N, of a chance score
    cola = _finetune_state("cola", [0.0, 0.0, 0.03], [0.05, 0.0, 0.0], None)
    assert chance_bar(cola) == pytest.approx(2 / math.sqrt(1043))
    claim, text, verdict = _table1(cola)
    assert verdict == "untested (model at chance)" and "at chance" in text
    # accuracy (SST-2): the majority class plus two binomial standard errors on the dev set
    m = 0.5091743119266054
    weak = _finetune_state("sst2", [0.69, 0.70, 0.68], [0.53, 0.52, 0.54], m)
    assert chance_bar(weak) == pytest.approx(m + 2 * math.sqrt(m * (1 - m) / 872))  # 0.543
    assert _table1(weak)[2] == "untested (model at chance)"  # h = 32 at 0.53: not above the bar
    # both sides well above the majority class: the recorded rule decides as before
    clear = _finetune_state("sst2", [0.69, 0.70, 0.68], [0.60, 0.61, 0.59], m)
    assert _table1(clear)[2] == "agrees" and "at chance" not in _table1(clear)[1]
    # no majority-class accuracy recorded: no bar, no relabelling
    assert chance_bar(_finetune_state("sst2", [0.5] * 3, [0.5] * 3, None)) is None


def test_chance_bar_refuses_mixed_dev_sets():
    from fixedhead.studies.sweep.claims import chance_bar

    state = _finetune_state("cola", [0.0, 0.0, 0.03], [0.05, 0.0, 0.0], None)
    state["runs"]["h8-0"]["finetune"]["dev_examples"] = 500
    with pytest.raises(ValueError, match=r"different dev-set sizes \[500, 1043\]"):
        chance_bar(state)


def test_a_default_given_explicitly_is_the_same_sweep(tmp_path, capsys):
    """The preset's own task, architecture and corpus (by any path to it), or extensions without a grid, resolve
    to the plan of the defaults; --quick never runs a full preset."""
    from fixedhead.studies.kit.study import plan_file
    from fixedhead.studies.sweep import SweepStudy

    study = SweepStudy()
    corpus = get_sweep_preset("cpu-mlm").data.corpus
    require_data(corpus)  # a path is the default corpus only where that file exists
    explicit = SweepOptions(finetune_task="sst2", architecture="fixedhead", corpus=corpus, max_extensions=1)
    assert plan_file(study, study.resolve(explicit)) == plan_file(study, study.resolve(SweepOptions()))
    other = SweepOptions(finetune_task="cola")
    assert plan_file(study, study.resolve(other))["sha256"] != plan_file(study, study.resolve(SweepOptions()))["sha256"]
    out = tmp_path / "q"
    assert main(["sweep", "--quick", "--preset", "cpu-clm", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--quick trains preset tiny; with --preset cpu-clm it would train that full preset" in err
    assert not out.exists()


def test_a_missing_corpus_is_named_before_the_folder_is_made(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["sweep", "--quick", "--corpus", str(tmp_path / "nope.txt"), "--output-dir", str(out)]) == 2
    assert f"corpus '{tmp_path / 'nope.txt'}' does not exist" in capsys.readouterr().err and not out.exists()


def test_the_description_is_written_from_the_settings_the_runs_train_with():
    """The steps and the rate a sweep's runs train at, for every preset (the 300-step masked one too), and the
    recipe's own where the options leave them."""
    from fixedhead.studies.sweep import SweepStudy
    from fixedhead.studies.sweep.presets import SWEEP_PRESETS

    describe = lambda o: SweepStudy().describe(SweepStudy().resolve(o))  # noqa: E731
    for name in SWEEP_PRESETS:
        steps = get_sweep_preset(name).train.max_steps
        assert f"{steps} steps of" in describe(SweepOptions(preset=name)), name
        changed = describe(SweepOptions(preset=name, steps=7, learning_rates=(1e-3, 2e-3)))
        assert "7 steps of" in changed and "each model's own rate" in changed and " at lr " not in changed, name
    assert "300 steps of 32x64 tokens at lr 0.002 per run" in describe(SweepOptions(preset="cpu"))


def test_the_fine_tuning_seed_is_its_own_option(small_real_corpus, tmp_path, monkeypatch):
    """By default each checkpoint is fine-tuned with its pretraining seed; --finetune-seed fixes another, and a
    bad one is named."""
    from fixedhead.data.glue import glue_path

    if not glue_path("sst2", "train").is_file():
        pytest.skip("shared GLUE data not found")
    S = importlib.import_module("fixedhead.studies.sweep")
    seen = []

    def fake_finetune(run_dir, task, out, settings, overwrite=False):
        seen.append((Path(run_dir).name, settings.seed))
        return {"score": 0.5, "dev_examples": 24, "train_seconds": 0.0}

    monkeypatch.setattr(S, "finetune", fake_finetune)
    preset = _tiny_preset(small_real_corpus)
    options = _register(monkeypatch, preset, models=("d16-h2-dp8",))
    run_study(SweepStudy(tmp_path / "cache"), options, tmp_path / "a", progress=False)
    assert seen == [("d16-h2-dp8-s0", 0), ("d16-h2-dp8-s1", 1)]
    seen.clear()
    run_study(SweepStudy(tmp_path / "cache"), replace(options, finetune_seed=7), tmp_path / "b", progress=False)
    assert seen == [("d16-h2-dp8-s0", 7), ("d16-h2-dp8-s1", 7)]
    with pytest.raises(ValueError, match="finetune_seed"):
        replace(options, finetune_seed=-1)
