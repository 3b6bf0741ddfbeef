"""Continuing a run's weights: ``pretrain(init_from=...)`` and ``fixedhead pretrain --init-from``
(what ``fixedhead widen-experiment`` continues its arms with)."""

from __future__ import annotations

import importlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from _tiny_run import tiny_config, tiny_settings
from fixedhead.cli import main
from fixedhead.runs import PRETRAIN_FILE
from fixedhead.training import identity, pretrain
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
    fingerprint = identity.run_settings_record(scratch, settings, tiny_prepared.settings)
    assert fingerprint["init_from"] is None
    older = {k: v for k, v in fingerprint.items() if k != "init_from"}  # runs saved before init_from was recorded
    assert not identity.settings_differences(older, fingerprint)


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
