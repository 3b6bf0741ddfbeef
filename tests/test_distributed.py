"""Distributed training, for real: two CPU processes (gloo) end where one process does.

Both models (masked and causal) train for a few AdamW steps under DistributedDataParallel and
under FSDP2 (``fully_shard`` on each block, then the root) in a two-process ``torch.distributed.run``
job, each process on half of every global batch (tests/_distributed_worker.py has the loop, the
data and the loss normalisation). The per-step losses and the final parameters must equal those of
one process trained on the whole global batch, to float32 rounding.

What FSDP2 wraps, and how, is read from ``configs/accelerate_fsdp.yaml`` (the classes named by
``fsdp_transformer_layer_cls_to_wrap``, ``fsdp_reshard_after_forward``), and the same file is also
given to ``accelerate launch`` itself, whose own FSDP2 preparation (``fsdp2_prepare_model``) must
end at the same place; only the machine-specific settings are overridden on the command line
(``--num_processes 2 --mixed_precision no``; on CPU accelerate launches through torchrun either way).

Finally, ``fixedhead pretrain --objective clm`` under torchrun (2 processes × batch 4) writes the
same model as one process with batch 8: the Trainer shards each global batch over the processes
and normalises the causal loss by the tokens of the whole global batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import _distributed_worker as worker

ROOT = Path(__file__).resolve().parents[1]
FSDP_CONFIG = ROOT / "configs" / "accelerate_fsdp.yaml"
WORKER = Path(worker.__file__)
LOSS_ATOL = 5e-6  # losses are ~4.6; float32 spacing there is 4.8e-7
PARAM_ATOL = 1e-5  # parameters move by ~1e-2 in these steps; a run that does not combine the ranks is off by ~2e-2

pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this PyTorch build"),
    pytest.mark.skipif(
        dist.is_available() and not dist.is_gloo_available(),
        reason="the gloo backend (CPU collectives) is not available in this PyTorch build",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The in-process runs on one thread: tiny models train several times faster so on shared CPUs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["FIXEDHEAD_CACHE"] = str(tmp_path / "cache")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _launch(cmd: list[str], env: dict) -> None:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0 and any(
        s in out.stderr
        for s in ("Address already in use", "EADDRINUSE", "Operation not permitted", "Connection refused")
    ):
        pytest.skip(f"this platform cannot run a local two-process gloo job: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr[-4000:]


@pytest.fixture(scope="module")
def torchrun_runs(tmp_path_factory) -> Path:
    """Both models under DDP and under FSDP2 (as the accelerate config says), in one 2-process job."""
    out = tmp_path_factory.mktemp("torchrun")
    _launch(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}",
            str(WORKER),
            "--wrappers",
            "ddp,fsdp2",
            "--fsdp-config",
            str(FSDP_CONFIG),
            "--mixed-precision",
            "no",
            "--out",
            str(out),
        ],
        _env(out),
    )
    return out


@pytest.fixture(scope="module")
def accelerate_runs(tmp_path_factory) -> Path:
    """Both models under ``accelerate launch --config_file configs/accelerate_fsdp.yaml``, accelerate applying FSDP2."""
    pytest.importorskip("accelerate")
    out = tmp_path_factory.mktemp("accelerate")
    _launch(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(FSDP_CONFIG),
            "--num_processes",
            "2",
            "--mixed_precision",
            "no",
            "--main_process_port",
            str(_free_port()),
            str(WORKER),
            "--wrappers",
            "accelerate-fsdp2",
            "--out",
            str(out),
        ],
        _env(out),
    )
    return out


@pytest.fixture(scope="module")
def references() -> dict:
    """The single-process reference: the same loop on the whole global batch."""
    return {objective: worker.train(objective, "none") for objective in worker.OBJECTIVES}


def _load(out: Path, objective: str, wrapper: str):
    from safetensors.torch import load_file

    info = json.loads((out / f"{objective}-{wrapper}.json").read_text())
    return info.pop("losses"), load_file(str(out / f"{objective}-{wrapper}.safetensors")), info


def _assert_same_training(losses, params, reference) -> None:
    ref_losses, ref_params, _ = reference
    assert len(losses) == worker.STEPS
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=LOSS_ATOL)
    assert params.keys() == ref_params.keys()
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=0, atol=PARAM_ATOL, msg=lambda m, name=name: f"{name}: {m}")


def _fsdp_settings() -> dict:
    import yaml

    return yaml.safe_load(FSDP_CONFIG.read_text())["fsdp_config"]


def _block_names(objective: str) -> list[str]:
    cls = worker.FixedHeadForMaskedLM if objective == "mlm" else worker.FixedHeadForCausalLM
    named = set(_fsdp_settings()["fsdp_transformer_layer_cls_to_wrap"].split(","))
    model = cls(worker.model_config())
    return [name for name, m in model.named_modules() if type(m).__name__ in named]


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
@pytest.mark.parametrize("objective", worker.OBJECTIVES)
def test_two_processes_end_where_one_process_does(torchrun_runs, references, objective, wrapper):
    losses, params, info = _load(torchrun_runs, objective, wrapper)
    assert info["world_size"] == 2 and info["rows_per_rank"] == worker.BATCH // 2
    assert info["max_diff_between_ranks"] == 0.0  # every process holds the same model
    assert info["tied"]  # the decoder still shares the word embeddings' parameter
    _assert_same_training(losses, params, references[objective])


@pytest.mark.parametrize("objective", worker.OBJECTIVES)
def test_fsdp2_shards_what_the_accelerate_config_names(torchrun_runs, objective):
    settings = _fsdp_settings()
    assert settings["fsdp_version"] == 2
    _, _, info = _load(torchrun_runs, objective, "fsdp2")
    blocks = _block_names(objective)
    assert blocks == [f"fixedhead.encoder.layer.{i}" for i in range(worker.model_config().num_hidden_layers)]
    assert info["fsdp_units"] == ["", *blocks]  # one unit per block; the rest (tied embeddings/decoder) in the root
    assert info["reshard_after_forward"] is settings["fsdp_reshard_after_forward"]


@pytest.mark.parametrize("objective", worker.OBJECTIVES)
def test_accelerate_launch_with_the_shipped_fsdp_config_ends_where_one_process_does(
    accelerate_runs, references, objective
):
    losses, params, info = _load(accelerate_runs, objective, "accelerate-fsdp2")
    assert info["world_size"] == 2 and info["max_diff_between_ranks"] == 0.0 and info["tied"]
    # accelerate's layout: a unit per block, the tied embeddings + decoder together in one more, the root
    assert set(_block_names(objective)) <= set(info["fsdp_units"]) and "" in info["fsdp_units"]
    assert {"fixedhead.embeddings.word_embeddings", "cls.decoder"} <= set(info["fsdp_units"])
    _assert_same_training(losses, params, references[objective])


@pytest.mark.parametrize("objective", worker.OBJECTIVES)
def test_the_comparison_notices_processes_that_do_not_combine(references, objective):
    """Control: training on one process's half alone is far outside the tolerances above."""
    ref_losses, ref_params, _ = references[objective]
    losses, params, _ = worker.train(objective, "none", rank=0, world=2)
    assert max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)) > 100 * LOSS_ATOL
    assert max((params[k] - ref_params[k]).abs().max().item() for k in params) > 100 * PARAM_ATOL


def test_trainer_causal_lm_on_two_processes_equals_one_process_with_the_global_batch(
    small_real_corpus, tmp_path, monkeypatch
):
    """``fixedhead pretrain --objective clm`` under torchrun: 2 × 4 rows per step = 1 × 8 rows.

    (The masked LM's Trainer run cannot be compared this way: its collator draws masks in each
    process, and its loss is each process's mean over its own masked tokens.)
    """
    from safetensors.torch import load_file

    from fixedhead import FixedHeadForCausalLM
    from fixedhead.cli import main

    common = [
        "pretrain",
        "--objective",
        "clm",
        "--corpus",
        str(small_real_corpus),
        "--hidden-size",
        "32",
        "--num-hidden-layers",
        "2",
        "--num-attention-heads",
        "4",
        "--head-dim",
        "16",
        "--max-seq-length",
        "32",
        "--vocab-size",
        "400",
        "--heldout-fraction",
        "0.1",
        "--max-steps",
        "6",
        "--eval-steps",
        "3",
        "--save-steps",
        "6",
        "--max-eval-tokens",
        "2000",
        "--report-to",
        "none",
    ]
    two, one = tmp_path / "two", tmp_path / "one"
    _launch(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}",
            "-m",
            "fixedhead",
            *common,
            "--output-dir",
            str(two),
            "--batch-size",
            "4",
        ],
        _env(tmp_path),
    )
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))  # the same tokenizer and data
    assert main([*common, "--output-dir", str(one), "--batch-size", "8"]) == 0
    m2, m1 = (json.loads((run / "metrics.json").read_text()) for run in (two, one))
    assert (m2["world_size"], m1["world_size"]) == (2, 1)
    assert m2["tokens_per_step"] == m1["tokens_per_step"] == 8 * 32
    w2, w1 = (load_file(str(run / "model.safetensors")) for run in (two, one))
    assert w2.keys() == w1.keys()
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert m2["heldout_loss"] == pytest.approx(m1["heldout_loss"], rel=1e-6, abs=0)
    assert FixedHeadForCausalLM.from_pretrained(str(two)).config.is_decoder
