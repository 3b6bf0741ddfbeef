"""Continuing a run's weights (``pretrain(init_from=...)``, ``fixedhead pretrain --init-from``) and the
``fixedhead widen-experiment`` built on it: does widening a trained standard-head model help?"""

from __future__ import annotations

import importlib
import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

import fixedhead.studies.widening as W
from _tiny_run import tiny_config, tiny_settings
from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, count_parameters
from fixedhead.cli import main
from fixedhead.data import DataSettings
from fixedhead.runs import PRETRAIN_FILE
from fixedhead.theory import causal_threshold
from fixedhead.training import pretrain
from fixedhead.training.widen import widen_run

P = importlib.import_module("fixedhead.training.pretrain")  # the module (fixedhead.training.pretrain is the function)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def source(tiny_prepared, tmp_path_factory):
    """A finished 3-step causal run with standard heads (d_p = 8), and its data."""
    out = tmp_path_factory.mktemp("src") / "run"
    pretrain(
        tiny_config(head_dim=None, num_hidden_layers=2),
        tiny_prepared,
        out,
        tiny_settings(max_steps=3, save_steps=3, eval_steps=3, objective="clm"),
    )
    return out


def _recording_trainer(monkeypatch) -> dict:
    """Make pretrain's Trainer record the weights it starts training from."""
    original = P.atomic_checkpoint_trainer
    seen: dict = {}

    def recording():
        cls = original()

        class Recording(cls):
            def train(self, *args, **kwargs):
                seen.clear()
                seen.update({k: v.detach().clone() for k, v in self.model.state_dict().items()})
                return super().train(*args, **kwargs)

        return Recording

    monkeypatch.setattr(P, "atomic_checkpoint_trainer", recording)
    return seen


# --------------------------------------------------------------------------- pretrain(init_from)
def test_continued_training_starts_at_the_source_weights(source, tiny_prepared, tmp_path, monkeypatch):
    wide = tmp_path / "wide"
    widen_run(source, [16, None], wide)  # a `fixedhead widen` output is a valid start as well
    seen = _recording_trainer(monkeypatch)
    settings = tiny_settings(max_steps=2, save_steps=2, eval_steps=2, objective="clm", seed=5)
    for start in (source, wide):
        out = tmp_path / f"from-{start.name}"
        result = pretrain(None, tiny_prepared, out, settings, init_from=start)
        weights = load_file(str(start / "model.safetensors"))
        assert weights and all(torch.equal(seen[k], v) for k, v in weights.items())  # step 0 = the source
        recorded = json.loads((out / PRETRAIN_FILE).read_text())
        assert recorded["init_from"]["path"] == str(start.resolve())
        assert recorded["init_from"]["model_sha256"] == result["init_from"]["model_sha256"]
        assert len(recorded["init_from"]["model_sha256"]) == 64
        assert "started from | " + str(start.resolve()) in (out / "README.md").read_text()
    assert json.loads((tmp_path / "from-wide" / "config.json").read_text())["head_dim"] == [16, 8]
    # a model trained from scratch does not start there (the check above can fail)
    pretrain(tiny_config(head_dim=None, num_hidden_layers=2), tiny_prepared, tmp_path / "scratch", settings)
    assert any(not torch.equal(seen[k], v) for k, v in load_file(str(source / "model.safetensors")).items())


def test_the_start_is_part_of_the_fingerprint(source, tiny_prepared, tmp_path):
    settings = tiny_settings(max_steps=2, save_steps=2, eval_steps=2, objective="clm")
    out = tmp_path / "cont"
    first = pretrain(None, tiny_prepared, out, settings, init_from=source)
    moved = tmp_path / "moved"
    shutil.copytree(source, moved)  # the same weights elsewhere: the same start
    again = pretrain(None, tiny_prepared, out, settings, resume=True, init_from=moved)
    assert again["heldout_loss"] == first["heldout_loss"]
    other = tmp_path / "other"
    widen_run(source, 12, other)  # other weights: not this run
    with pytest.raises(FileExistsError, match="init_from.model_sha256"):
        pretrain(None, tiny_prepared, out, settings, resume=True, init_from=other)
    scratch = tiny_config(head_dim=None, num_hidden_layers=2)
    P.lm_config(scratch, tiny_prepared.tokenizer, "clm")
    with pytest.raises(FileExistsError, match="init_from"):  # from scratch is not a continued run either
        pretrain(scratch, tiny_prepared, out, settings, resume=True)
    fingerprint = P.run_settings_record(scratch, settings, tiny_prepared.settings)
    assert fingerprint["init_from"] is None
    assert P.same_run_settings({k: v for k, v in fingerprint.items() if k != "init_from"}, fingerprint)  # older runs


def test_continued_training_refuses_what_contradicts_the_source(source, tiny_prepared, tmp_path):
    settings = tiny_settings(max_steps=2, objective="clm")
    with pytest.raises(ValueError, match="brings its own model config; pass config=None"):
        pretrain(tiny_config(), tiny_prepared, tmp_path / "a", settings, init_from=source)
    with pytest.raises(ValueError, match="holds a causal LM; continue it with objective='clm', not 'mlm'"):
        pretrain(None, tiny_prepared, tmp_path / "b", tiny_settings(max_steps=2), init_from=source)
    with pytest.raises(FileExistsError, match="is the run being continued"):
        pretrain(None, tiny_prepared, source, settings, init_from=source, overwrite=True)
    other = P.PreparedData(
        tokenizer=P.causal_tokenizer(tiny_prepared.tokenizer),
        train=tiny_prepared.train,
        heldout=tiny_prepared.heldout,
        info=tiny_prepared.info,
        settings=tiny_prepared.settings,
    )
    other.tokenizer.add_tokens(["zzzunseen"])
    with pytest.raises(ValueError, match="tokenised with another vocabulary"):
        pretrain(None, other, tmp_path / "c", settings, init_from=source)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pretrain(None, tiny_prepared, tmp_path / "d", settings, init_from=tmp_path / "missing")
    with pytest.raises(ValueError, match="needs a config"):
        pretrain(None, tiny_prepared, tmp_path / "e", settings)
    assert not any((tmp_path / n).exists() for n in "abcde")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_cli_init_from_continues_on_the_recorded_data(source, tmp_path, capsys):
    out = tmp_path / "cont"
    argv = ["pretrain", "--init-from", str(source), "--output-dir", str(out), "--max-steps", "2"]
    assert main([*argv, "--batch-size", "8", "--save-steps", "2", "--eval-steps", "2", "--report-to", "none"]) == 0
    recorded = json.loads((out / PRETRAIN_FILE).read_text())
    original = json.loads((source / PRETRAIN_FILE).read_text())
    assert recorded["init_from"]["path"] == str(source.resolve())
    assert recorded["data"] == original["data"] and recorded["train"]["objective"] == "clm"
    assert recorded["train"]["max_steps"] == 2 and recorded["config"]["is_decoder"]
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2  # the source's model


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--hidden-size", "64"], "drop --hidden-size"),
        (["--head-dim", "32"], "drop --head-dim"),
        (["--num-hidden-layers", "3", "--dropout", "0.1"], "drop --dropout, --num-hidden-layers"),
        (["--max-seq-length", "16"], "drop --max-seq-length"),
        (["--preset", "table2a-fixed-h32"], "drop --preset"),
        (["--objective", "mlm"], "holds a causal LM; drop --objective mlm"),
    ],
)
def test_cli_init_from_refuses_model_and_data_options(source, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert main(["pretrain", "--init-from", str(source), "--output-dir", str(out), *extra]) == 2
    assert message in _one_line(capsys)
    assert not out.exists()


def test_cli_bad_init_from_is_one_line_naming_the_path(source, tmp_path, capsys):
    out = tmp_path / "out"
    missing = tmp_path / "no-such-run"
    assert main(["pretrain", "--init-from", str(missing), "--output-dir", str(out)]) == 2
    assert f"--init-from {str(missing)!r}" in _one_line(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["pretrain", "--init-from", str(empty), "--output-dir", str(out)]) == 2
    err = _one_line(capsys)
    assert str(empty) in err and "holds no finished model" in err
    assert main(["pretrain", "--init-from", str(source), "--output-dir", str(source)]) == 2
    assert "is the run being continued" in _one_line(capsys)
    assert not out.exists()


# -------------------------------------------------------------------------------- the design
def test_arms_and_their_parameter_counts_for_make_runs_model():
    config = FixedHeadConfig(**W.get_widening_preset("cpu").model, vocab_size=8192)
    assert config.layer_head_dims == [8, 8] and causal_threshold(32) == 16
    arms = {a.name: a for a in W.make_arms(config, 16)}
    assert list(arms) == ["as-is", "wide-all", "wide-early", "wide-late", "ffn-matched"]
    assert arms["wide-early"].head_dim == (16, None) and arms["wide-late"].head_dim == (None, 16)

    def params(arm):
        a = arms[arm]
        return count_parameters(
            W.replace_config(
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
        W.make_arms(config, 8)


@pytest.mark.parametrize(
    "a, b, verdict",
    [
        ([5.00, 5.01, 4.99], [4.90, 4.91, 4.89], "lower loss"),
        ([4.90, 4.91, 4.89], [5.00, 5.01, 4.99], "higher loss"),
        ([5.00, 5.01, 4.99], [4.99, 5.00, 4.98], "no measurable difference"),
        ([5.0], [4.0], "undecided (one seed)"),
    ],
)
def test_verdict_rule(a, b, verdict):
    c = W.compare_arms(a, b)
    assert c["verdict"] == verdict
    assert c["difference"] == pytest.approx(sum(a) / len(a) - sum(b) / len(b))
    if len(a) > 1:
        assert c["threshold"] == pytest.approx(2 * 0.01)  # both stds are 0.01


def test_widened_feed_forward_computes_the_same_and_every_new_weight_learns():
    torch.manual_seed(0)
    config = tiny_config(head_dim=None, num_hidden_layers=2, vocab_size=50, is_decoder=True)
    model = FixedHeadForCausalLM(config).eval()
    wide = W.widen_feed_forward(model, 80, seed=3)
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
        W.widen_feed_forward(model, 32)


# -------------------------------------------------------------------------------- end to end
def _tiny_preset(corpus) -> W.WideningPreset:
    base, cont = W._recipes(3, 2, 8, 3e-3, (1, 1))
    return W.WideningPreset(
        description="test",
        data=DataSettings(
            corpus=str(corpus),
            vocab_size=400,
            max_seq_length=16,
            heldout_fraction=0.1,
            tokenizer_max_chars=None,
            max_eval_tokens=2000,
        ),
        model=dict(
            hidden_size=16,
            num_attention_heads=4,
            head_dim=None,
            num_hidden_layers=2,
            intermediate_size=32,
            max_position_embeddings=16,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
        base=base,
        continuation=cont,
        seeds=(1, 2),
    )


def test_tiny_experiment_end_to_end_and_resume(small_real_corpus, tmp_path, monkeypatch):
    out = tmp_path / "wx"
    preset = _tiny_preset(small_real_corpus)
    state = W.run_widening(preset, out, progress=False, cache_dir=tmp_path / "cache", command="test")
    assert state["meta"]["wide_head_dim"] == 8  # ⌈(16 − 1)/2⌉
    runs = state["runs"]
    arms = ["as-is", "wide-all", "wide-early", "wide-late", "ffn-matched"]
    assert sorted(runs) == sorted(f"{a}-s{s}" for a in arms for s in (1, 2))
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
    rows = {r["arm"]: r for r in W.summarize(state)}
    assert rows["wide-early"]["parameters"] == rows["wide-late"]["parameters"]
    assert rows["as-is"]["flops_ratio"] == 1.0 and rows["wide-all"]["flops_ratio"] > 1.0
    assert rows["ffn-matched"]["intermediate_size"] > 32
    assert len(W.comparisons(state)) == len(W.COMPARISONS)
    report = (out / "report.md").read_text()
    assert "**Verdict rule**" in report and "| base (3 steps) |" in report and "**In one sentence:**" in report
    assert (out / "widening.png").stat().st_size > 0
    assert json.loads((out / "results.json").read_text())["runs"].keys() == runs.keys()

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(P, "atomic_checkpoint_trainer", no_training)
    again = W.run_widening(preset, out, progress=False, cache_dir=tmp_path / "cache", command="test")
    assert {k: v["heldout_loss"] for k, v in again["runs"].items()} == {k: v["heldout_loss"] for k, v in runs.items()}
    with pytest.raises(FileExistsError, match="other settings"):
        W.run_widening(preset, out, steps=3, progress=False, cache_dir=tmp_path / "cache")


def test_cli_errors_are_one_line_and_come_before_any_work(tmp_path, capsys):
    (tmp_path / "foreign.txt").write_text("x")
    assert main(["widen-experiment", "--output-dir", str(tmp_path), "--no-progress"]) == 2
    assert "did not create (foreign.txt)" in _one_line(capsys)
    for extra, message in (
        (["--head-dim", "8"], "wide_head_dim=8 must be larger than the base's head size 8"),
        (["--steps", "0"], "steps must be a positive int, got 0"),
        (["--threads", "0"], "threads must be a positive int, got 0"),
        (["--seeds", "-1"], "seed must be an int >= 0, got -1"),
    ):
        out = tmp_path / "new"
        assert main(["widen-experiment", "--output-dir", str(out), *extra]) == 2
        assert message in _one_line(capsys)
        assert not out.exists()
