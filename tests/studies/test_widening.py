"""``fixedhead widen-experiment`` (fixedhead.studies.widening, widening_arms and widening_report): the arms, the
widened feed-forward control, and the tiny preset end to end."""

from __future__ import annotations

import importlib
import math
from dataclasses import replace

import pytest
import torch

import fixedhead.studies.widening as W
import fixedhead.studies.widening.arms as A
import fixedhead.studies.widening.report as WR
from _tiny_run import TINY, tiny_config
from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, count_parameters
from fixedhead.cli import main
from fixedhead.model.surgery import widen_feed_forward
from fixedhead.studies.kit.recipes import RECIPES
from fixedhead.studies.kit.study import run_study
from fixedhead.theory import causal_threshold
from fixedhead.training.evaluate import DivergedError

P = importlib.import_module("fixedhead.training.pretrain")  # the module (fixedhead.training.pretrain is the function)
pytestmark = pytest.mark.usefixtures("one_thread")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# -------------------------------------------------------------------------------- the design
def test_arms_and_their_parameter_counts_for_make_runs_model():
    config = FixedHeadConfig(**W.spec(W.WideningOptions()).model, vocab_size=8192)
    assert config.layer_head_dims == [8, 8] and causal_threshold(32) == 16
    arms = {a.name: a for a in A.make_arms(config, 16)}
    assert list(arms) == ["as-is", "wide-all", "wide-early", "wide-late", "ffn-matched"]
    assert arms["wide-early"].head_dim == (16, None) and arms["wide-late"].head_dim == (None, 16)

    def params(arm):
        a = arms[arm]
        return count_parameters(
            A.replace_config(
                config,
                head_dim=list(a.head_dim) if a.head_dim else None,
                intermediate_size=a.intermediate_size or config.intermediate_size,
            ),
            pooler=False,
        )

    base = params("as-is")
    assert params("wide-all") - base == 2 * (3 * 16 * 8 * (128 + 1) + 16 * 8 * 128)  # q, k, v rows and W_o columns
    assert params("wide-early") == params("wide-late")
    assert arms["ffn-matched"].intermediate_size == 768  # 256 more units of 2·128 + 1 parameters per layer
    assert abs(params("ffn-matched") - params("wide-all")) <= 2 * 128 + 1
    with pytest.raises(ValueError, match="wide_head_dim=8 must be larger than the base's head size 8"):
        A.make_arms(config, 8)


def test_widened_feed_forward_computes_the_same_and_every_new_weight_learns():
    torch.manual_seed(0)
    config = tiny_config(head_dim=None, num_hidden_layers=2, vocab_size=50, is_decoder=True)
    model = FixedHeadForCausalLM(config).eval()
    wide = widen_feed_forward(model, 80, seed=3)
    ids = torch.randint(0, 50, (3, 12))
    with torch.no_grad():
        assert (wide(input_ids=ids).logits - model(input_ids=ids).logits).abs().max() <= 1e-5
    assert wide.config.intermediate_size == 80 and model.config.intermediate_size == 64
    start = {k: v.clone() for k, v in wide.state_dict().items()}
    rows = [k for k in start if k.endswith("intermediate.weight")]
    cols = [k for k in start if k.endswith("output.weight") and start[k].shape[1] == 80]
    assert len(rows) == len(cols) == 2
    assert all(start[k][64:].abs().sum() > 0 for k in rows) and all(start[k][:, 64:].abs().sum() == 0 for k in cols)
    opt = torch.optim.SGD(wide.parameters(), lr=0.1)
    wide.train()

    def step():
        opt.zero_grad()
        wide(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        return wide.state_dict()

    after = step()  # the zero output columns get gradients at once; the random rows wait for them
    assert all(after[k][:, 64:].abs().sum() > 0 for k in cols)
    assert all(torch.equal(after[k][64:], start[k][64:]) for k in rows)
    after = step()
    assert all(not torch.equal(after[k][64:], start[k][64:]) for k in rows)
    with pytest.raises(ValueError, match="intermediate_size=32 is smaller than the model's 64"):
        widen_feed_forward(model, 32)


# -------------------------------------------------------------------------------- end to end
def _options(monkeypatch, corpus, **kw) -> W.WideningOptions:
    """Options of a two-step study on ``corpus`` (n = 16, FFN 32: a recipe registered for this test)."""
    data = replace(TINY.data, corpus=str(corpus), max_seq_length=16, max_eval_tokens=2000)
    recipe = replace(TINY, name="test-tiny", data=data, layers=2, shared_model=dict(intermediate_size=32))
    monkeypatch.setitem(RECIPES, "test-tiny", lambda: recipe)
    start = dict(recipe="test-tiny", hidden_size=16, num_attention_heads=4, batch_size=8, learning_rate=3e-3)
    start |= dict(logging_steps=(1, 1), seeds=(1, 2), base_steps=3, steps=2)
    return W.WideningOptions(preset="tiny", **(start | kw))


def _state(options, record):
    return W.state_of(W.spec(options), record["runs"].values(), record["meta"])


def test_tiny_experiment_end_to_end_and_resume(small_real_corpus, tmp_path, monkeypatch):
    out = tmp_path / "wx"
    options = _options(monkeypatch, small_real_corpus)
    kw = dict(progress=False, command="test")
    record = run_study(W.WideningStudy(tmp_path / "cache"), options, out, **kw)
    state = _state(options, record)
    assert state["meta"]["wide_head_dim"] == 8  # ⌈(16 − 1)/2⌉
    runs = state["runs"]
    arms = ["as-is", "wide-all", "wide-early", "wide-late", "ffn-matched"]
    assert sorted(runs) == sorted(f"{a}-s{s}" for a in arms for s in (1, 2))
    assert list(record["runs"])[0] == "base" and not record["missing"]
    dims = {r["arm"]: r["layer_head_dims"] for r in runs.values()}
    assert dims == {
        "as-is": [4, 4],
        "wide-all": [8, 8],
        "wide-early": [8, 4],
        "wide-late": [4, 8],
        "ffn-matched": [4, 4],
    }
    for r in runs.values():
        assert r["start_max_logit_change"] <= 1e-5 and math.isfinite(r["heldout_loss"])
        assert r["init_from"]["model_sha256"] and r["training_tokens"] == 2 * 8 * 16
    rows = {r["arm"]: r for r in WR.summarise(state)}
    assert rows["wide-early"]["parameters"] == rows["wide-late"]["parameters"]
    assert rows["as-is"]["flops_ratio"] == 1.0 and rows["wide-all"]["flops_ratio"] > 1.0
    assert rows["ffn-matched"]["intermediate_size"] > 32
    verdicts = {"lower loss", "higher loss", "no measurable difference"}
    assert len(WR.comparisons(state)) == len(WR.COMPARISONS)
    assert all(c["verdict"] in verdicts for c in WR.comparisons(state))  # two seeds: every pair is decided
    assert (out / "report.md").stat().st_size > 0 and (out / "widening.png").stat().st_size > 0
    assert record["plan_sha256"] in (out / "report.md").read_text()

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(P, "atomic_checkpoint_trainer", no_training)
    again = _state(options, run_study(W.WideningStudy(tmp_path / "cache"), options, out, **kw))
    assert {k: v["heldout_loss"] for k, v in again["runs"].items()} == {k: v["heldout_loss"] for k, v in runs.items()}
    with pytest.raises(FileExistsError, match="other settings"):
        run_study(W.WideningStudy(tmp_path / "cache"), replace(options, steps=3), out, **kw)


def test_cli_errors_are_one_line_and_come_before_any_work(tmp_path, capsys):
    (tmp_path / "foreign.txt").write_text("x")
    assert main(["widen-experiment", "--output-dir", str(tmp_path), "--no-progress"]) == 2
    assert "did not create (foreign.txt)" in _one_line(capsys)
    for extra, message in (
        (["--head-dim", "8"], "--head-dim 8 must be larger than the base's head size 8"),
        (["--steps", "0"], "--steps must be a positive int, got 0"),
        (["--threads", "0"], "threads must be a positive int, got 0"),
        (["--seeds", "-1"], "seeds must be an int >= 0, got -1"),
        (["--learning-rates", "1e-3,2e-3", "--max-extensions", "-1"], "--max-extensions must be"),
    ):
        out = tmp_path / "new"
        assert main(["widen-experiment", "--output-dir", str(out), *extra]) == 2
        assert message in _one_line(capsys)
        assert not out.exists()


def test_each_arm_chooses_its_rate_on_the_validation_split(small_real_corpus, tmp_path, monkeypatch):
    out = tmp_path / "wx"
    options = _options(monkeypatch, small_real_corpus, seeds=(1, 2), learning_rates=(2e-3, 8e-3), max_extensions=0)
    kw = dict(progress=False, command="test")
    real_pretrain = W.pretrain

    def wide_all_diverges_at_8e3(config, data, run_dir, train, **k):
        if run_dir.name == "wide-all-lr0.008-s1":
            raise DivergedError("loss is nan")
        return real_pretrain(config, data, run_dir, train, **k)

    monkeypatch.setattr(W, "pretrain", wide_all_diverges_at_8e3)
    record = run_study(W.WideningStudy(tmp_path / "cache"), options, out, **kw)
    state = _state(options, record)
    arms = [a["name"] for a in state["meta"]["arms"]]
    runs, tuning = state["runs"], state["tuning"]
    assert set(tuning) == set(arms)
    assert tuning["wide-all"]["chosen"] == 2e-3 and tuning["wide-all"]["validation_loss"]["0.008"] is None
    for arm in [a for a in arms if a != "wide-all"]:
        # seed 1 at both rates; the chosen one is the lower validation loss of those two runs
        losses = {lr: runs[f"{arm}-lr{lr:g}-s1"]["validation_loss"] for lr in (2e-3, 8e-3)}
        assert tuning[arm]["chosen"] == min(losses, key=losses.get)
        assert tuning[arm]["validation_loss"] == {f"{lr:g}": v for lr, v in losses.items()}
        assert not tuning[arm]["bracketed"]  # a two-rate grid without extensions always ends at an edge
    for arm in arms:
        chosen = tuning[arm]["chosen"]
        assert runs[f"{arm}-lr{chosen:g}-s2"]["learning_rate"] == chosen
    assert len(runs) == len(arms) * 3 - 1  # seed 2 only at each arm's chosen rate; the diverged run left none
    # results: each arm's seeds at its chosen rate only
    rows = {r["arm"]: r for r in WR.summarise(state)}
    for arm in arms:
        chosen = tuning[arm]["chosen"]
        expected = [runs[f"{arm}-lr{chosen:g}-s{s}"]["heldout_loss"] for s in (1, 2)]
        assert rows[arm]["losses"] == expected
    report = (out / "report.md").read_text()
    assert "## A learning rate per arm" in report and "each arm its own (below)" in report
    assert (out / "learning_rates.png").stat().st_size > 1000
    assert state["meta"]["settings"]["data"]["validation_fraction"] > 0  # no run trains on the validation split

    def no_training(*a, **k):
        raise AssertionError("a finished or diverged run was trained again")

    monkeypatch.setattr(W, "pretrain", no_training)
    again = _state(options, run_study(W.WideningStudy(tmp_path / "cache"), options, out, **kw))
    assert again["tuning"] == tuning
    with pytest.raises(FileExistsError, match="other settings"):
        run_study(W.WideningStudy(tmp_path / "cache"), replace(options, learning_rates=(1e-3, 2e-3)), out, **kw)
