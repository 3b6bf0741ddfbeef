import json

import pytest

from fixedhead import FixedHeadConfig, FixedHeadForMaskedLM
from fixedhead.cli import main
from fixedhead.data import train_tokenizer
from fixedhead.data.glue import glue_path, read_glue_tsv
from fixedhead.training.finetune import FINETUNE_FILE, FinetuneSettings, finetune, split_train_validation

SMALL = dict(
    max_seq_length=32,
    batch_size=8,
    learning_rate=1e-3,
    max_steps=4,
    eval_steps=2,
    patience=2,
    validation_size=24,
    max_train_examples=48,
    max_dev_examples=40,
    progress=False,
    save_model=False,
)


def _save_tiny_run(root, **config):
    """A pretraining-run directory under ``root``: untrained weights (``config`` overrides) and a
    WordPiece tokenizer learnt on SST-2 text."""
    if not glue_path("sst2", "train").is_file():
        pytest.skip("shared GLUE data not found")
    texts = [e["text_a"] for e in read_glue_tsv(glue_path("sst2", "train"), "sst2")[:3000]]
    tok = train_tokenizer([" ".join(texts)], vocab_size=300, cache_dir=root / "cache", model_max_length=32)
    cfg = FixedHeadConfig(
        **{
            **dict(
                vocab_size=len(tok),
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=4,
                head_dim=16,
                intermediate_size=64,
                max_position_embeddings=32,
            ),
            **config,
        }
    )
    run = root / "run"
    FixedHeadForMaskedLM(cfg).save_pretrained(run)
    tok.save_pretrained(run)
    return run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return _save_tiny_run(tmp_path_factory.mktemp("tiny"))


def test_split_is_seeded_and_disjoint():
    ex = [{"text_a": str(i), "text_b": None, "label": i % 2} for i in range(50)]
    train, val = split_train_validation(ex, 10, seed=3)
    assert len(train) == 40 and len(val) == 10
    assert {e["text_a"] for e in train}.isdisjoint(e["text_a"] for e in val)
    assert split_train_validation(ex, 10, seed=3) == (train, val)
    assert split_train_validation(ex, 10, seed=4)[1] != val
    with pytest.raises(ValueError, match="validation_size"):
        split_train_validation(ex, 50)


def test_finetune_sst2_scores_dev_and_resumes(tiny_run, tmp_path):
    out = tmp_path / "sst2"
    r = finetune(tiny_run, "sst2", out, FinetuneSettings(**SMALL))
    assert r["metric"] == "accuracy" and r["score"] == r["dev"]["accuracy"]
    assert 0.0 <= r["score"] <= 1.0
    assert (r["train_examples"], r["validation_examples"], r["dev_examples"]) == (48, 24, 40)
    assert r["best_step"] in (2, 4) and r["steps"] <= 4
    assert not list(out.glob("checkpoint-*")), "checkpoints are removed once the best one is scored"
    saved = json.loads((out / FINETUNE_FILE).read_text())
    assert saved["score"] == r["score"]
    # the same request again is answered from disk, without training
    mtime = (out / FINETUNE_FILE).stat().st_mtime_ns
    assert finetune(tiny_run, "sst2", out, FinetuneSettings(**SMALL))["train_seconds"] == r["train_seconds"]
    assert (out / FINETUNE_FILE).stat().st_mtime_ns == mtime
    with pytest.raises(FileExistsError, match="another model, data or settings"):
        finetune(tiny_run, "sst2", out, FinetuneSettings(**{**SMALL, "learning_rate": 5e-4}))


def test_finetune_keeps_a_mup_models_output_projection_rates(tmp_path, monkeypatch):
    """A μP checkpoint (d_p = 16 based at 8) fine-tunes its W_o at lr × 8/16, as it pretrained."""
    from fixedhead.training import checkpoints

    run = _save_tiny_run(tmp_path, parametrization="mup", mup_base_head_dim=8)
    seen = []
    real = checkpoints.apply_learning_rate_multipliers

    def recording(optimizer, model):
        real(optimizer, model)
        params = dict(model.named_parameters())
        w_o = [params[n] for n in params if n.endswith("attention.out_proj.weight")]
        seen.append(sorted((g["lr"], any(p is w for w in w_o for p in g["params"])) for g in optimizer.param_groups))

    monkeypatch.setattr(checkpoints, "apply_learning_rate_multipliers", recording)
    finetune(run, "sst2", tmp_path / "ft", FinetuneSettings(**SMALL))
    # W_o alone in its group at 5e-4 (with and without weight decay the other groups stay at 1e-3)
    assert len(seen) == 1 and (SMALL["learning_rate"] / 2, True) in seen[0]
    assert all(lr == SMALL["learning_rate"] for lr, has_w_o in seen[0] if not has_w_o)


def test_a_quiet_finetune_leaves_transformers_bars_and_logging_as_they_were(tiny_run, tmp_path, monkeypatch):
    """progress=False turns transformers' bars off and its logging down (the load report) for the fine-tuning
    only: both are as they were after it returns, and after it raises."""
    import logging

    from transformers import Trainer
    from transformers.utils import logging as hf_logging

    from fixedhead.training.settings import transformers_progress_bars, transformers_verbosity

    with transformers_progress_bars(True), transformers_verbosity(logging.INFO):
        finetune(tiny_run, "sst2", tmp_path / "sst2", FinetuneSettings(**{**SMALL, "save_model": True}))
        assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == logging.INFO

        def interrupted(self, *args, **kwargs):
            assert hf_logging.get_verbosity() == logging.ERROR and not hf_logging.is_progress_bar_enabled()
            raise KeyboardInterrupt

        monkeypatch.setattr(Trainer, "train", interrupted)
        with pytest.raises(KeyboardInterrupt):
            finetune(tiny_run, "sst2", tmp_path / "stopped", FinetuneSettings(**SMALL))
        assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == logging.INFO


def test_finetune_stsb_is_regression(tiny_run, tmp_path):
    r = finetune(tiny_run, "stsb", tmp_path / "stsb", FinetuneSettings(**SMALL))
    assert r["metric"] == "pearson" and set(r["dev"]) >= {"pearson", "spearman"}
    assert -1.0 <= r["score"] <= 1.0


def test_cli_finetune_mrpc_and_errors(tiny_run, tmp_path, capsys):
    rc = main(
        [
            "finetune",
            "--task",
            "mrpc",
            "--model",
            str(tiny_run),
            "--output-dir",
            str(tmp_path / "m"),
            "--max-steps",
            "2",
            "--eval-steps",
            "2",
            "--batch-size",
            "8",
            "--validation-size",
            "16",
            "--max-train-examples",
            "16",
            "--max-seq-length",
            "32",
        ]
    )
    assert rc == 0
    result = json.loads((tmp_path / "m" / FINETUNE_FILE).read_text())
    assert result["metric"] == "f1" and {"f1", "accuracy"} <= set(result["dev"])
    assert (tmp_path / "m" / "model.safetensors").is_file()  # the CLI keeps the fine-tuned model
    assert main(["finetune", "--task", "qnli", "--model", str(tiny_run)]) == 2
    assert "'qnli'" in capsys.readouterr().err
    assert main(["finetune", "--task", "sst2", "--model", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
