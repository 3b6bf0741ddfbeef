import json
from dataclasses import replace

import pytest
from scipy.stats import spearmanr

from _tiny_run import TINY
from fixedhead.cli import main
from fixedhead.studies.claims import claims
from fixedhead.studies.finetune_seeds import (
    RESULTS_FILE,
    as_sweep_state,
    rank_correlation,
    run_finetune_seeds,
    write_report,
)
from fixedhead.studies.sweep import SWEEP_FILE, SweepPoint, SweepPreset, run_sweep
from fixedhead.training.finetune import FINETUNE_FILE, FinetuneSettings

FT = FinetuneSettings(
    max_seq_length=16, batch_size=8, max_steps=2, eval_steps=2, validation_size=16, max_train_examples=16,
    max_dev_examples=24, save_model=False, progress=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def masked_sweep(small_real_corpus, tmp_path_factory):
    """Two tiny masked models (standard and fixed at h = 4) x seeds 0, 1: four checkpoints, no fine-tuning."""
    from fixedhead.data.glue import glue_path

    if not glue_path("sst2", "train").is_file():
        pytest.skip("shared GLUE data not found")
    root = tmp_path_factory.mktemp("ft-seeds")
    preset = SweepPreset(
        description="test",
        data=replace(TINY.data, corpus=str(small_real_corpus), max_seq_length=16, max_eval_tokens=2000),
        train=replace(TINY.train, batch_size=8, max_steps=3, logging_steps=1, eval_steps=3, save_steps=3),
        common=dict(num_hidden_layers=1, max_position_embeddings=16),
        points=[
            SweepPoint("heads", "standard", 4, dict(hidden_size=16, num_attention_heads=4)),
            SweepPoint("heads", "fixed", 4, dict(hidden_size=16, num_attention_heads=4, head_dim=8)),
        ],
        seeds=(0, 1),
        finetune=None,
    )
    run_sweep(preset, root / "sweep", progress=False, cache_dir=root / "cache")
    return root / "sweep"


def test_each_checkpoint_chooses_its_rate_then_every_seed_trains_at_it(masked_sweep, tmp_path):
    out = tmp_path / "ft"
    kw = dict(seeds=[0, 1], learning_rates=[1e-4, 1e-3], max_extensions=0, settings=FT, progress=False)
    state = run_finetune_seeds(masked_sweep, "sst2", out, **kw)
    sweep = json.loads((masked_sweep / SWEEP_FILE).read_text())
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
    report = write_report(masked_sweep, out)
    assert "| paper claim | our measurement | verdict |" in report.read_text()
    assert (out / "learning_rates.png").stat().st_size > 5000

    # a rerun reuses every fine-tuning run
    ft_file = next(out.glob(f"runs/*/{FINETUNE_FILE}"))
    mtime = ft_file.stat().st_mtime_ns
    again = run_finetune_seeds(masked_sweep, "sst2", out, **kw)
    assert ft_file.stat().st_mtime_ns == mtime
    assert again["runs"] == state["runs"]
    # another plan in the same folder is refused rather than mixed in
    with pytest.raises(FileExistsError, match="fine-tuning plan"):
        run_finetune_seeds(masked_sweep, "sst2", out, **kw | {"seeds": [2, 0]})
    assert json.loads((out / RESULTS_FILE).read_text())["runs"] == state["runs"]


def test_bad_input_fails_before_any_work(masked_sweep, tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown GLUE task 'sst3'"):
        run_finetune_seeds(masked_sweep, "sst3", tmp_path / "a")
    with pytest.raises(ValueError, match="at least 2 rates"):
        run_finetune_seeds(masked_sweep, "sst2", tmp_path / "b", learning_rates=[1e-3])
    with pytest.raises(FileNotFoundError, match="sweep.json"):
        run_finetune_seeds(tmp_path, "sst2", tmp_path / "c")
    assert not any((tmp_path / d).exists() for d in "abc")
    assert main(["finetune-sweep", str(tmp_path), "--task", "sst2"]) == 2
    assert "sweep.json" in capsys.readouterr().err
