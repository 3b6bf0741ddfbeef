"""Faults a user can meet while pretraining: two processes racing for one new folder, a rate
that diverges, a batch larger than the data, a resume after training had finished. Each ends in
one clear line or a correct record, and nothing saved is lost."""

from __future__ import annotations

import importlib
import json

import pytest

from _tiny_run import snapshot, tiny_config, tiny_settings
from fixedhead.runs import PRETRAIN_FILE
from fixedhead.training import pretrain

pytestmark = pytest.mark.usefixtures("one_thread")
pretrain_module = importlib.import_module("fixedhead.training.pretrain")  # the module, not the function


def test_two_pretrains_into_one_new_folder_one_is_refused_and_the_other_untouched(tiny_prepared, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_check = pretrain_module.check_run_dir

    def other_process_wins(run_dir, *args, **kw):
        # both processes found the folder new; the other one writes its settings first
        real_check(run_dir, *args, **kw)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / PRETRAIN_FILE).write_text(json.dumps({"other": "run"}))
        (run_dir / "data_order.json").write_text("{}")

    monkeypatch.setattr(pretrain_module, "check_run_dir", other_process_wins)
    with pytest.raises(FileExistsError, match="claimed by another process"):
        pretrain(tiny_config(), tiny_prepared, run, tiny_settings(max_steps=2, save_steps=2, eval_steps=2))
    assert json.loads((run / PRETRAIN_FILE).read_text()) == {"other": "run"}
    assert sorted(snapshot(run)) == ["data_order.json", PRETRAIN_FILE]


def test_a_diverged_rate_is_recorded_as_diverged_and_a_rerun_says_so_without_training(
    tiny_prepared, tmp_path, monkeypatch
):
    from pathlib import Path

    from fixedhead.training.evaluate import DivergedError

    monkeypatch.chdir(tmp_path)
    run = Path("run")  # relative, as on the command line
    settings = tiny_settings(max_steps=10, save_steps=10, eval_steps=10, learning_rate=10.0)
    with pytest.raises(DivergedError, match="diverged") as e:
        pretrain(tiny_config(), tiny_prepared, run, settings)
    assert "\n" not in str(e.value)
    assert not (run / "metrics.json").exists()
    assert "diverged" in json.loads((run / "diverged.json").read_text())["reason"]

    def no_training(*a, **kw):
        raise AssertionError("a diverged run was trained again")

    monkeypatch.setattr(pretrain_module, "atomic_checkpoint_trainer", no_training)
    with pytest.raises(DivergedError, match="diverged"):
        pretrain(tiny_config(), tiny_prepared, run, settings, resume=True)


def test_a_loss_past_exp_overflow_is_diverged_not_a_traceback():
    import torch

    from fixedhead.model.modeling import FixedHeadForMaskedLM
    from fixedhead.training.evaluate import DivergedError, check_not_diverged, evaluate_lm

    torch.manual_seed(0)
    model = FixedHeadForMaskedLM(tiny_config(vocab_size=50))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e3)  # logits in the thousands: a loss far past 709 nats
    ids = torch.randint(5, 50, (2, 8))
    result = evaluate_lm(model, ids, ids.clone())  # a perplexity that cannot overflow, not a traceback
    assert result["loss"] > 709 and result["perplexity"] == float("inf")
    with pytest.raises(DivergedError, match=r"above 2·ln V"):  # and pretraining records such a run as diverged
        check_not_diverged(result["loss"], 50)


def test_a_batch_larger_than_the_training_set_is_refused_before_anything_is_written(tiny_prepared, tmp_path):
    run = tmp_path / "run"
    too_big = tiny_prepared.train.shape[0] + 1
    with pytest.raises(ValueError, match=f"--batch-size {too_big} is larger than the training set"):
        pretrain(tiny_config(), tiny_prepared, run, tiny_settings(max_steps=2, batch_size=too_big))
    assert snapshot(run) == {}


def test_resuming_a_run_whose_training_had_finished_writes_only_what_is_missing(tiny_prepared, tmp_path):
    import shutil

    settings = tiny_settings(max_steps=4, save_steps=2, eval_steps=2, logging_steps=1)
    whole = tmp_path / "whole"
    uninterrupted = pretrain(tiny_config(), tiny_prepared, whole, settings)
    killed = tmp_path / "killed"  # killed between its last checkpoint and metrics.json
    shutil.copytree(whole, killed)
    for name in ("metrics.json", "model.safetensors", "README.md"):
        (killed / name).unlink()
    checkpoints = snapshot(killed / "checkpoint-4")
    resumed = pretrain(tiny_config(), tiny_prepared, killed, settings, resume=True)
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == sorted(p.name for p in whole.glob("checkpoint-*"))
    assert snapshot(killed / "checkpoint-4") == checkpoints
    assert resumed["train_curve"] == uninterrupted["train_curve"]
    assert resumed["eval_curve"] == uninterrupted["eval_curve"]
    assert resumed["heldout_loss"] == uninterrupted["heldout_loss"]
    assert snapshot(killed)["model.safetensors"] == snapshot(whole)["model.safetensors"]


def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_keeps_the_earlier_ones(
    tiny_prepared, tmp_path, monkeypatch
):
    import torch

    from fixedhead.cli import _error_message

    run = tmp_path / "run"
    real_save = torch.save

    def save_until_full(obj, f, *a, **kw):
        if "checkpoint-4" in str(f):  # the second checkpoint: the disk is full
            raise RuntimeError(
                "[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file data/0: "
                "file write failed"
            )
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", save_until_full)
    settings = tiny_settings(max_steps=4, save_steps=2, eval_steps=2)
    with pytest.raises(OSError, match="could not write checkpoint-4") as e:
        pretrain(tiny_config(), tiny_prepared, run, settings)
    assert "\n" not in _error_message(e.value)
    assert sorted(p.name for p in run.iterdir() if p.name.startswith((".staging", "checkpoint"))) == ["checkpoint-2"]


@pytest.mark.parametrize("where", ["model", "checkpoint"])
def test_a_full_disk_while_copying_the_modeling_code_names_the_folder_being_written(
    tiny_prepared, tmp_path, monkeypatch, where
):
    """save_pretrained copies the modeling code (shutil.copyfile, whose error names the source file first):
    a full disk there names the run folder (or the checkpoint) being written, in one line."""
    import errno
    import shutil

    from fixedhead.cli import _error_message

    run, real_copy = tmp_path / "run", shutil.copyfile

    def copy_until_full(src, dst, *a, **kw):
        if str(dst).endswith(".py") and (where == "checkpoint") == ("checkpoint-" in str(dst)):
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))  # as shutil raises it
        return real_copy(src, dst, *a, **kw)

    monkeypatch.setattr(shutil, "copyfile", copy_until_full)
    settings = tiny_settings(max_steps=2, save_steps=2 if where == "checkpoint" else 10, eval_steps=2)
    with pytest.raises(OSError) as e:
        pretrain(tiny_config(), tiny_prepared, run, settings)
    line = _error_message(e.value)
    assert "\n" not in line and ".py" not in line and str(run) in line and "No space left on device" in line
    if where == "model":
        assert e.value.filename == str(run)
    else:
        assert line.startswith("could not write checkpoint-2 into")
        assert not [p for p in run.iterdir() if p.name.startswith((".staging", "checkpoint"))]


def test_weights_that_disagree_with_config_or_pickles_refused_by_torch_are_one_line(tiny_pretrained_run, tmp_path):
    import shutil

    from fixedhead.runs import open_run
    from fixedhead.training.evaluate import load_model

    run = tmp_path / "edited"
    shutil.copytree(tiny_pretrained_run[0], run, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    config = json.loads((run / "config.json").read_text())
    config["intermediate_size"] += 8
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json's sizes disagree with the weights") as e:
        load_model(open_run(run))
    assert "\n" not in str(e.value)

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_pretrained_run[0], pickled, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    (pickled / "model.safetensors").unlink()
    import pickle

    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(print))  # a global torch's safe loader refuses
    with pytest.raises(ValueError, match="refused by torch's safe loader") as e:
        load_model(open_run(pickled, allow_pickle=True))
    assert "\n" not in str(e.value)


def test_a_checkpoint_state_refused_by_torchs_safe_loader_on_resume_is_one_line(tiny_prepared, tmp_path):
    import shutil

    import torch

    settings = tiny_settings(max_steps=4, save_steps=2, eval_steps=2)
    run = tmp_path / "run"
    pretrain(tiny_config(), tiny_prepared, run, settings)
    shutil.rmtree(run / "checkpoint-4")  # killed after its first checkpoint
    (run / "metrics.json").unlink()
    torch.save({"state": print}, run / "checkpoint-2" / "optimizer.pt")  # a whole archive holding a global
    with pytest.raises(ValueError, match="refused by torch's safe loader") as e:
        pretrain(tiny_config(), tiny_prepared, run, settings, resume=True)
    assert "\n" not in str(e.value) and "checkpoint-2" in str(e.value)
