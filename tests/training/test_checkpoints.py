"""Interrupted runs and untrusted files: nothing lost, nothing half-written, nothing executed.

* a ``fixedhead pretrain`` process killed with SIGKILL and rerun with ``--resume`` ends with the
  same held-out loss as an uninterrupted run (deterministic CPU seeds, within 1e-6);
* checkpoints appear atomically (staging directory + rename); a truncated newest checkpoint is
  detected and the previous one used, with a warning;
* no ``torch.load`` without ``weights_only=True``, no ``trust_remote_code``, pickle weights
  refused unless opted in, and files placed in a model directory are never imported.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from _tiny_run import tiny_config, tiny_settings
from fixedhead.training import load_run, pretrain
from fixedhead.training.checkpoints import (
    STAGING_PREFIX,
    CheckpointWarning,
    check_checkpoint,
    find_resume_checkpoint,
    list_checkpoints,
)

SRC = Path(__file__).resolve().parents[2] / "src"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(tiny_prepared, tmp_path_factory):
    """An uninterrupted 20-step run (checkpoints every 5 steps): its directory and result."""
    run = tmp_path_factory.mktemp("ref") / "run"
    return run, pretrain(tiny_config(), tiny_prepared, run, tiny_settings())


# ------------------------------------------------------------------------- SIGKILL + resume
def _pretrain_args(out: Path, corpus: Path, *extra: str) -> list[str]:
    return [
        "pretrain",
        "--output-dir",
        str(out),
        "--corpus",
        str(corpus),
        "--vocab-size",
        "400",
        "--max-seq-length",
        "32",
        "--hidden-size",
        "32",
        "--num-hidden-layers",
        "1",
        "--num-attention-heads",
        "4",
        "--head-dim",
        "16",
        "--max-steps",
        "120",
        "--batch-size",
        "16",
        "--save-steps",
        "10",
        "--eval-steps",
        "40",
        "--report-to",
        "none",
        "--heldout-fraction",
        "0.1",
        "--max-eval-tokens",
        "4000",
        *extra,
    ]


def test_sigkill_then_resume_matches_uninterrupted_run(small_real_corpus, tmp_path, monkeypatch, capsys):
    """``fixedhead pretrain`` killed with SIGKILL after checkpoint-20, rerun with --resume: same final loss.

    The killed and resumed runs are ``python -m fixedhead.cli`` processes; the uninterrupted one
    runs the same ``main()`` in this process (one thread, like the subprocesses) while the other
    is being killed, to save an interpreter start-up.
    """
    from fixedhead.cli import main
    from fixedhead.training import DataSettings, prepare_data

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC), TOKENIZERS_PARALLELISM="false")
    # train the run's tokenizer once (same settings as the CLI), so the runs below share it
    prepare_data(
        DataSettings(
            corpus=str(small_real_corpus), vocab_size=400, max_seq_length=32, heldout_fraction=0.1, max_eval_tokens=4000
        ),
        progress=False,
    )
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    cli = [sys.executable, "-m", "fixedhead.cli"]
    victim = subprocess.Popen(
        cli + _pretrain_args(killed_dir, small_real_corpus), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    killed_at: list[list[str]] = []

    def kill_after_checkpoint_20():
        deadline = time.time() + 120
        while victim.poll() is None and time.time() < deadline:
            if (killed_dir / "checkpoint-20").is_dir():
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                killed_at.append(sorted(p.name for p in killed_dir.iterdir()))
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_after_checkpoint_20)
    killer.start()
    try:
        assert torch.get_num_threads() == 1  # as OMP_NUM_THREADS=1 in the subprocesses
        assert main(_pretrain_args(full_dir, small_real_corpus)) == 0
    finally:
        killer.join(timeout=150)
        if victim.poll() is None:
            victim.kill()
    capsys.readouterr()
    assert victim.returncode == -signal.SIGKILL, victim.stderr.read().decode()[-2000:]
    assert killed_at and "metrics.json" not in killed_at[0], f"nothing was interrupted: {killed_at}"
    steps = [int(p.name.split("-")[1]) for p in list_checkpoints(killed_dir)]
    assert 20 <= max(steps) < 120, steps
    for checkpoint in list_checkpoints(killed_dir):  # whatever was visible at the kill is complete
        check_checkpoint(checkpoint)

    resumed = subprocess.run(
        cli + _pretrain_args(killed_dir, small_real_corpus, "--resume"),
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {killed_dir / f'checkpoint-{max(steps)}'}" in resumed.stdout
    assert not any(p.name.startswith(STAGING_PREFIX) for p in killed_dir.iterdir())
    a = json.loads((full_dir / "metrics.json").read_text())
    b = json.loads((killed_dir / "metrics.json").read_text())
    print(f"uninterrupted {a['heldout_loss']!r}, killed at step {max(steps)} and resumed {b['heldout_loss']!r}")
    assert abs(a["heldout_loss"] - b["heldout_loss"]) <= 1e-6, (a["heldout_loss"], b["heldout_loss"])
    assert a["heldout_accuracy"] == b["heldout_accuracy"]
    assert [s for s, _ in a["eval_curve"]] == [s for s, _ in b["eval_curve"]] == [40, 80, 120]
    assert [x for _, x in a["eval_curve"]] == pytest.approx([x for _, x in b["eval_curve"]], abs=1e-6)


# ------------------------------------------------------------ truncated newest checkpoint
def test_truncated_newest_checkpoint_is_skipped_with_a_warning(reference, tiny_prepared, tmp_path, monkeypatch):
    from transformers import Trainer

    resumed_from = []
    real_train = Trainer.train

    def recording_train(self, resume_from_checkpoint=None, **kw):
        resumed_from.append(resume_from_checkpoint)
        return real_train(self, resume_from_checkpoint, **kw)

    monkeypatch.setattr(Trainer, "train", recording_train)
    ref_dir, ref = reference
    run = tmp_path / "run"
    shutil.copytree(ref_dir, run)
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-15", "checkpoint-20"]
    (run / "metrics.json").unlink()  # killed while saving its last checkpoint: not finished
    weights = run / "checkpoint-20" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.warns(CheckpointWarning, match=r"skipping incomplete checkpoint checkpoint-20: .*truncated"):
        result = pretrain(tiny_config(), tiny_prepared, run, tiny_settings(), resume=True)
    # resumed from step 15: it trained steps 16-20 again and ended where the reference ended
    assert resumed_from == [str(run / "checkpoint-15")]
    assert result["heldout_loss"] == pytest.approx(ref["heldout_loss"], abs=1e-6)
    check_checkpoint(run / "checkpoint-20")  # the broken copy was replaced by a complete one


def test_checkpoint_checks_name_what_is_wrong(reference, tmp_path):
    ref_dir, _ = reference
    ck = tmp_path / "checkpoint-20"
    shutil.copytree(ref_dir / "checkpoint-20", ck)
    check_checkpoint(ck)
    opt = ck / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"optimizer.pt is truncated or corrupt"):
        check_checkpoint(ck)
    (ck / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match="no trainer_state.json"):
        check_checkpoint(ck)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert find_resume_checkpoint(tmp_path) is None
    assert any("checkpoint-20" in str(w.message) for w in caught)


def test_crash_while_saving_leaves_no_partial_checkpoint(reference, tiny_prepared, tmp_path, monkeypatch):
    """Die half-way through writing checkpoint-10: only a staging directory is left; resume is exact."""
    from transformers import Trainer

    _, ref = reference
    run = tmp_path / "run"
    real = Trainer._save_rng_state

    def dying(self, output_dir):
        if self.state.global_step == 10:
            raise RuntimeError("simulated crash while saving")
        return real(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", dying)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain(tiny_config(), tiny_prepared, run, tiny_settings())
    monkeypatch.setattr(Trainer, "_save_rng_state", real)
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-5"]
    staged = [p for p in run.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert len(staged) == 1 and (staged[0] / "checkpoint-10" / "model.safetensors").is_file()
    result = pretrain(tiny_config(), tiny_prepared, run, tiny_settings(), resume=True)
    assert not any(p.name.startswith(STAGING_PREFIX) for p in run.iterdir())
    assert result["heldout_loss"] == pytest.approx(ref["heldout_loss"], abs=1e-6)


def test_overwrite_discards_the_old_runs_checkpoints(reference, tiny_prepared, tmp_path):
    """--overwrite must not leave the replaced run's checkpoints for a later --resume to pick up."""
    ref_dir, _ = reference
    run = tmp_path / "run"
    shutil.copytree(ref_dir, run)
    pretrain(tiny_config(head_dim=8), tiny_prepared, run, tiny_settings(max_steps=5, eval_steps=5), overwrite=True)
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-5"]
    assert json.loads((run / "checkpoint-5" / "config.json").read_text())["head_dim"] == 8


# ------------------------------------------------------------------------ untrusted files
def _calls(source: str, name: str) -> list[str]:
    """The full text of each call ``name(...)`` in ``source`` (balanced parentheses)."""
    calls = []
    for m in re.finditer(re.escape(name) + r"\(", source):
        depth, i = 0, m.end() - 1
        while True:
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            if depth == 0:
                break
            i += 1
        calls.append(source[m.start() : i + 1])
    return calls


def test_no_unsafe_torch_load_and_no_remote_code_in_fixedhead():
    sources = {p: p.read_text() for p in (SRC / "fixedhead").rglob("*.py")}
    for path, text in sources.items():
        for call in _calls(text, "torch.load"):
            assert "weights_only=True" in call, f"{path}: {call}"
        # no call passes trust_remote_code (docstrings and the model card may tell users about it)
        passed = [
            node.lineno
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Call) and any(k.arg == "trust_remote_code" for k in node.keywords)
        ]
        assert not passed, f"{path}: trust_remote_code passed at lines {passed}"


def test_trainer_loads_its_checkpoint_pickles_with_weights_only():
    """Trainer's resume path reads optimizer.pt / scheduler.pt / rng_state.pth only with weights_only=True."""
    import transformers.trainer as trainer_module

    text = Path(trainer_module.__file__).read_text()
    calls = _calls(text, "torch.load")
    assert calls, "transformers.trainer no longer calls torch.load; revisit this check"
    for call in calls:
        assert "weights_only=True" in call, call
    assert "training_args.bin" not in re.sub(r'TRAINING_ARGS_NAME = "training_args.bin"', "", text)
    assert not re.search(r"load\([^)]*TRAINING_ARGS_NAME", text)  # training_args.bin is written, never read


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.sentinel}",))


def test_pickle_weights_never_execute(reference, tmp_path):
    ref_dir, _ = reference
    run = tmp_path / "run"
    shutil.copytree(ref_dir, run, ignore=shutil.ignore_patterns("checkpoint-*"))
    model, _, _ = load_run(run)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    (run / "model.safetensors").unlink()
    torch.save(state, run / "pytorch_model.bin")
    with pytest.raises(ValueError, match="refusing"):
        load_run(run)
    # opted in: transformers loads it with torch.load(weights_only=True), same weights
    trusted, _, _ = load_run(run, allow_pickle=True)
    for k, v in trusted.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    # a malicious pickle is refused by default and, even opted in, never runs
    _Evil.sentinel = tmp_path / "pwned"
    torch.save({"x": _Evil()}, run / "pytorch_model.bin")
    with pytest.raises(ValueError, match="refusing"):
        load_run(run)
    with pytest.raises(Exception, match="Weights only load failed"):
        load_run(run, allow_pickle=True)
    assert not _Evil.sentinel.exists()


def test_code_in_a_model_directory_is_never_imported(reference, tmp_path):
    ref_dir, _ = reference
    run = tmp_path / "run"
    shutil.copytree(ref_dir, run, ignore=shutil.ignore_patterns("checkpoint-*"))
    sentinel = tmp_path / "imported"
    (run / "evil_model.py").write_text(f"open({str(sentinel)!r}, 'w').write('x')\n")
    config = json.loads((run / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil_model.Config", "AutoModelForMaskedLM": "evil_model.Model"}
    (run / "config.json").write_text(json.dumps(config))
    model, _, _ = load_run(run)
    assert type(model).__name__ == "FixedHeadForMaskedLM"
    assert not sentinel.exists()


def test_runs_saved_before_a_setting_existed_still_resume():
    """A TrainSettings field added later (bf16) is left out of the fingerprint at its old default,
    so a run directory written before it existed still matches; turning it on is a difference."""
    from dataclasses import replace

    from fixedhead.training.identity import run_settings_record, settings_differences

    config, settings = tiny_config(), tiny_settings()
    now = run_settings_record(config, settings, None)
    assert "bf16" not in now["train"]
    old = json.loads(json.dumps(now))  # what an older version saved: no bf16 key at all
    assert settings_differences(old, now) == []
    assert settings_differences(old, run_settings_record(config, replace(settings, bf16=True), None)) == [
        "train.bf16: False → True"
    ]
