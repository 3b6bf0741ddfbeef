"""Ecosystem: Auto classes and pipelines, attention implementations, model card and tracking,
two-process training, and the attention diagnostics (``fixedhead analyze``) — issue 6."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fixedhead
from fixedhead import FixedHeadConfig, FixedHeadForMaskedLM
from fixedhead.cli import main
from fixedhead.training import DataSettings, TrainSettings, prepare_data, pretrain

SRC = Path(fixedhead.__file__).resolve().parents[1]


def _env(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["FIXEDHEAD_CACHE"] = str(tmp_path / "cache")
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="module")
def tiny_run(small_real_corpus, tmp_path_factory):
    """A 30-step pretraining run on real text with the default tracking (TensorBoard)."""
    tmp = tmp_path_factory.mktemp("eco")
    data = prepare_data(
        DataSettings(corpus=str(small_real_corpus), vocab_size=400, max_seq_length=32, heldout_fraction=0.1,
                     tokenizer_max_chars=None, max_eval_tokens=3000),
        cache_dir=tmp / "cache", progress=False,
    )
    config = FixedHeadConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
                             intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)
    settings = TrainSettings(batch_size=16, max_steps=30, learning_rate=3e-3, logging_steps=10, eval_steps=15,
                             save_steps=30, progress=False)  # report_to: the default
    run = tmp / "run"
    result = pretrain(config, data, run, settings)
    return run, data, result


@pytest.fixture(scope="module")
def heldout_text(tiny_run, small_real_corpus, tmp_path_factory):
    """The held-out documents of the tiny run, as a .txt file."""
    from fixedhead.data import read_corpus

    _, data, _ = tiny_run
    titles = set(data.info["heldout_documents"])
    docs = [d.text for d in read_corpus(str(small_real_corpus)) if (d.title or d.source) in titles]
    assert docs, "no held-out documents found"
    path = tmp_path_factory.mktemp("text") / "heldout.txt"
    path.write_text("\n\n".join(docs))
    return path


# ------------------------------------------------------------------ 1. Auto classes, pipeline
def test_auto_classes_registered_on_import_without_remote_code(tiny_run, tmp_path):
    run, _, _ = tiny_run
    code = f"""
import transformers
from transformers import AutoConfig
try:
    AutoConfig.from_pretrained({str(run)!r})
    print("loaded-before-import")
except (ValueError, KeyError):
    print("unknown-before-import")
import fixedhead
from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification
print(type(AutoConfig.from_pretrained({str(run)!r})).__name__)
print(type(AutoModel.from_pretrained({str(run)!r})).__name__)
print(type(AutoModelForMaskedLM.from_pretrained({str(run)!r})).__name__)
print(type(AutoModelForSequenceClassification.from_pretrained({str(run)!r}, num_labels=3)).__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["unknown-before-import", "FixedHeadConfig", "FixedHeadModel",
                                  "FixedHeadForMaskedLM", "FixedHeadForSequenceClassification"]


def test_auto_masked_lm_loads_the_trained_weights(tiny_run):
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM

    run, _, _ = tiny_run
    model = AutoModelForMaskedLM.from_pretrained(str(run))
    assert isinstance(model, FixedHeadForMaskedLM) and model.config.head_dim == 16
    saved = load_file(str(run / "model.safetensors"))
    qkv = "fixedhead.encoder.layer.1.attention.qkv.weight"
    assert torch.equal(model.state_dict()[qkv], saved[qkv])


def test_fill_mask_pipeline_on_a_heldout_sentence(tiny_run, heldout_text):
    from transformers import AutoTokenizer, pipeline

    run, _, _ = tiny_run
    words = heldout_text.read_text().split()[:6]  # short: the tiny vocabulary splits words into many pieces
    words[3] = "[MASK]"
    sentence = " ".join(words)
    fill = pipeline("fill-mask", model=str(run), top_k=5)
    preds = fill(sentence)
    assert len(preds) == 5
    scores = [p["score"] for p in preds]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    # the pipeline's numbers are the model's own: softmax of the logits at the [MASK] position
    tok = AutoTokenizer.from_pretrained(str(run))
    enc = tok(sentence, return_tensors="pt")
    with torch.no_grad():
        logits = fill.model(**enc).logits[0, enc["input_ids"][0].tolist().index(tok.mask_token_id)]
    top = torch.softmax(logits, -1).topk(5)
    assert [p["token"] for p in preds] == top.indices.tolist()
    assert scores == pytest.approx(top.values.tolist(), abs=1e-5)
    assert all(p["sequence"] and "[MASK]" not in p["sequence"] for p in preds)


def _example(name):
    import importlib.util

    path = SRC.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fill_mask_example_scores_heldout_sentences(tiny_run, capsys):
    """examples/fill_mask.py: masked held-out sentences, the pipeline's top-5, a frequency baseline."""
    from transformers import AutoTokenizer

    run, data, _ = tiny_run
    summary = _example("fill_mask").main([str(run), "--sentences", "20", "--show", "2", "--write"])
    out = capsys.readouterr().out
    assert f"{summary['sentences']} held-out sentences" in out
    saved = json.loads((run / "fill_mask.json").read_text())
    items = saved["items"]
    assert saved["summary"] == summary and len(items) == summary["sentences"] > 0
    held = set(data.info["heldout_documents"])
    tok = AutoTokenizer.from_pretrained(str(run))
    for it in items:
        assert it["book"] in held and it["text"].count("[MASK]") == 1 and it["answer"] in tok.get_vocab()
    # the reported shares are recomputed from the saved predictions
    top1 = sum(it["predictions"][0][0] == it["answer"] for it in items) / len(items)
    top5 = sum(it["answer"] in [g for g, _ in it["predictions"]] for it in items) / len(items)
    assert summary["top1"] == top1 and summary["top5"] == top5 and 0 <= top1 <= top5 <= 1
    # and the first prediction is the model's own argmax at the mask
    enc = tok(items[0]["text"], return_tensors="pt")
    model = FixedHeadForMaskedLM.from_pretrained(str(run)).eval()
    with torch.no_grad():
        logits = model(**enc).logits[0, enc["input_ids"][0].tolist().index(tok.mask_token_id)]
    assert tok.decode([int(logits.argmax())]).strip() == items[0]["predictions"][0][0]
    # a single sentence (the pipeline unwraps one-element lists), and the held-out books as text
    heldout_txt = run.parent / "heldout.txt"
    one = _example("fill_mask").main([str(run), "--sentences", "1", "--save-heldout-text", str(heldout_txt)])
    assert one["sentences"] == 1 and one["top1"] <= one["top5"]
    assert items[0]["text"].split("[MASK]")[0].split()[0] in heldout_txt.read_text()


def test_fill_mask_example_refuses_another_corpus(tiny_run, tmp_path, capsys):
    run, _, _ = tiny_run
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"title": f"doc {i}", "text": f"Some other text here, part {i}. " * 20}) + "\n"
                             for i in range(10)))
    with pytest.raises(SystemExit) as info:
        _example("fill_mask").main([str(run), "--corpus", str(other)])
    assert "is not the one" in str(info.value) and "doc " in str(info.value)


def test_timed_pretraining_example_fits_steps_to_the_budget(small_real_corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    args = ["--output-dir", str(tmp_path / "run"), "--minutes", "0.05", "--calibration-steps", "3",
            "--corpus", str(small_real_corpus), "--vocab-size", "400", "--max-seq-length", "32",
            "--heldout-fraction", "0.1", "--max-eval-tokens", "2000", "--hidden-size", "32",
            "--num-hidden-layers", "1", "--num-attention-heads", "4", "--head-dim", "16", "--batch-size", "8",
            "--report-to", "none", "--bf16"]
    result = _example("pretrain_timed").main(args)
    out = capsys.readouterr().out
    steps = json.loads((tmp_path / "run" / "pretrain_settings.json").read_text())["train"]
    assert f"-> max_steps {steps['max_steps']:,}" in out and steps["max_steps"] >= 1 and steps["bf16"] is True
    assert result["training_tokens"] == steps["max_steps"] * 8 * 32
    assert "| precision | bf16 autocast" in (tmp_path / "run" / "README.md").read_text()
    with pytest.raises(SystemExit):
        _example("pretrain_timed").main(args + ["--max-steps", "5"])  # steps come from --minutes only
    assert "--max-steps is set from --minutes" in capsys.readouterr().err
    # refused before any data preparation: the run exists, a bad count, an unknown tracker
    for extra, message in ((["--minutes", "1"], "already holds a run; pass --overwrite to replace it"),
                           (["--evaluations", "0"], "--evaluations must be >= 1, got 0"),
                           (["--report-to", "nosuchtracker"], "--report-to nosuchtracker: unknown integration")):
        before = sorted(p.name for p in (tmp_path / "run").iterdir())
        with pytest.raises(SystemExit):
            _example("pretrain_timed").main(args + extra)
        assert message in capsys.readouterr().err
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


def test_eager_and_sdpa_agree_and_attentions_are_probabilities(tiny_run):
    from transformers import AutoModelForMaskedLM

    run, data, _ = tiny_run
    eager = AutoModelForMaskedLM.from_pretrained(str(run), attn_implementation="eager").eval()
    sdpa = AutoModelForMaskedLM.from_pretrained(str(run), attn_implementation="sdpa").eval()
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    ids = data.heldout[:3].clone()
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0  # padding on one row
    with torch.no_grad():
        a = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
        b = sdpa(input_ids=ids, attention_mask=mask, output_attentions=True)
        c = sdpa(input_ids=ids, attention_mask=mask)  # the SDPA kernel path
    torch.testing.assert_close(c.logits, a.logits, atol=1e-5, rtol=1e-5)
    assert len(a.attentions) == 2
    for pa, pb in zip(a.attentions, b.attentions):
        assert pa.shape == (3, 4, 32, 32)  # [batch, heads, query, key]
        torch.testing.assert_close(pa.sum(-1), torch.ones(3, 4, 32))
        assert float(pa[1, :, :, 20:].max()) == 0.0  # padded keys get no attention
        torch.testing.assert_close(pa, pb)


# ------------------------------------------------------------------ 4. tracking and cards
def test_run_directory_has_model_card_and_tensorboard_logs(tiny_run):
    run, data, result = tiny_run
    card = (run / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: fill-mask\n")
    for section in ("## Configuration", "## Data", "## Training budget", "## Metrics"):
        assert section in card
    assert "| head_dim | 16 |" in card and "| num_attention_heads | 4 |" in card
    assert data.info["corpus"] in card and data.info["heldout_documents"][0] in card
    assert f"| training tokens | {30 * 16 * 32:,} |" in card and "| processes (world size) | 1 |" in card
    assert f"| masked-LM loss (nats) | {result['heldout_loss']:.4g} |" in card
    events = list((run / "runs").rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_report_to_is_passed_to_the_trainer_and_checked_early(tmp_path, capsys):
    from fixedhead.cli import _report_to
    from fixedhead.training.pretrain import _training_args

    assert _training_args(tmp_path, TrainSettings(report_to=["tensorboard"])).report_to == ["tensorboard"]
    assert _training_args(tmp_path, TrainSettings(report_to=[])).report_to == []
    assert _report_to(["none"]) == [] and _report_to(["tensorboard"]) == ["tensorboard"]
    rc = main(["pretrain", "--output-dir", str(tmp_path / "r"), "--report-to", "nosuchtracker"])
    assert rc == 2 and "--report-to nosuchtracker: unknown integration" in capsys.readouterr().err
    from transformers.integrations import is_wandb_available

    if not is_wandb_available():
        rc = main(["pretrain", "--output-dir", str(tmp_path / "r"), "--report-to", "wandb"])
        assert rc == 2 and "wandb package is not installed" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before any work


# ------------------------------------------------------------------ 2. distributed training
def test_cli_runs_as_a_module(monkeypatch, capsys):
    """``python -m fixedhead.cli`` (what torchrun / accelerate launch run) reaches main()."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["fixedhead", "--help"])
    monkeypatch.delitem(sys.modules, "fixedhead.cli", raising=False)  # run it fresh, as `python -m` does
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("fixedhead.cli", run_name="__main__")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("pretrain", "analyze", "compare"):
        assert command in out


def test_shipped_launcher_configs_parse():
    from accelerate.commands.config.config_args import ClusterConfig

    root = SRC.parent / "configs"
    fsdp = ClusterConfig.from_yaml_file(str(root / "accelerate_fsdp.yaml"))  # unknown keys raise
    assert fsdp.distributed_type.value == "FSDP"
    assert fsdp.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "FixedHeadLayer"
    from fixedhead.modeling import FixedHeadLayer  # the class named there exists

    assert FixedHeadLayer.__name__ in FixedHeadForMaskedLM._no_split_modules
    ds = ClusterConfig.from_yaml_file(str(root / "accelerate_deepspeed.yaml"))
    assert ds.distributed_type.value == "DEEPSPEED"
    ds_json = json.loads((SRC.parent / ds.deepspeed_config["deepspeed_config_file"]).read_text())
    assert ds_json["zero_optimization"]["stage"] == 2
    assert ds_json["train_micro_batch_size_per_gpu"] == "auto"  # filled in by the Trainer from --batch-size


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_pretraining_with_torchrun(small_real_corpus, tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this PyTorch build")
    if not dist.is_gloo_available():
        pytest.skip("the gloo backend (CPU collectives) is not available in this PyTorch build")
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "-m", "fixedhead.cli", "pretrain", "--output-dir", str(run),
           "--corpus", str(small_real_corpus), "--hidden-size", "32", "--num-hidden-layers", "1",
           "--num-attention-heads", "4", "--head-dim", "16", "--max-seq-length", "32", "--vocab-size", "400",
           "--heldout-fraction", "0.1", "--max-steps", "8", "--batch-size", "8", "--eval-steps", "4",
           "--save-steps", "8", "--max-eval-tokens", "2000", "--report-to", "none"]
    out = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    if out.returncode != 0 and any(s in out.stderr for s in ("Address already in use", "EADDRINUSE",
                                                               "Operation not permitted", "Connection refused")):
        pytest.skip(f"this platform cannot run a local two-process gloo job: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr[-3000:]
    # the same kind of run directory as a single-process run
    for name in ("model.safetensors", "config.json", "tokenizer.json", "metrics.json", "README.md", "checkpoint-8"):
        assert (run / name).exists(), name
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    assert metrics["tokens_per_step"] == 2 * 8 * 32 and math.isfinite(metrics["heldout_loss"])
    # it really ran data-parallel: each optimizer step consumed 2 × 8 sequences
    state = json.loads((run / "checkpoint-8" / "trainer_state.json").read_text())
    train_sequences = json.loads((run / "pretrain_settings.json").read_text())["data_info"]["train_sequences"]
    assert state["global_step"] == 8
    assert state["epoch"] == pytest.approx(8 * 8 * 2 / train_sequences, abs=0.006)  # stored rounded to 0.01
    assert "| processes (world size) | 2 |" in (run / "README.md").read_text()
    FixedHeadForMaskedLM.from_pretrained(str(run))  # loadable


# ------------------------------------------------------------------ 3. attention diagnostics
def test_hooked_logits_reproduce_fixedhead_attentions(tiny_run):
    from fixedhead.analysis import attention_logits

    run, data, _ = tiny_run
    model = FixedHeadForMaskedLM.from_pretrained(str(run)).eval()
    ids = data.heldout[:2]
    logits = attention_logits(model, ids)
    with torch.no_grad():
        probs = model(input_ids=ids, output_attentions=True).attentions
    assert len(logits) == len(probs) == 2
    for s, p in zip(logits, probs):
        assert s.dtype == torch.float64 and s.shape == (2, 4, 32, 32)
        torch.testing.assert_close(torch.softmax(s, -1).float(), p, atol=1e-6, rtol=1e-5)


def _bert_checkpoint(tiny_run, directory: Path) -> Path:
    """A transformers BertForMaskedLM written by save_pretrained, with the tiny run's tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    run, _, _ = tiny_run
    tok = AutoTokenizer.from_pretrained(str(run))
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=8,
                                      intermediate_size=64, max_position_embeddings=32, initializer_range=0.5))
    bert.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return directory


def test_analyze_a_transformers_bert_checkpoint(tiny_run, heldout_text, tmp_path):
    from transformers import BertModel

    from fixedhead.analysis import analyze, attention_logits

    bert_dir = _bert_checkpoint(tiny_run, tmp_path / "bert")
    result = analyze(bert_dir, heldout_text, max_sequences=3)
    assert (result.model_type, result.num_layers, result.num_heads, result.head_dims) == ("bert", 2, 8, [4, 4])
    assert result.seq_len == 32 and result.num_sequences == 3
    for row in result.rows():
        # d_p = 32/8 = 4 < n = 32: the logits of every head have rank at most 4 (paper Section 3) and
        # generic weights reach it; softmax needs one dimension less or the same
        assert row["logit_rank_max"] == 4 and row["rank_cap"] == 4
        assert row["logit_rank"] - 1 <= row["min_head_dim"] <= row["logit_rank"]
        assert 0.0 <= row["entropy"] <= math.log(32) + 1e-9
    # the hooks read BERT's real logits: their softmax is BERT's own (eager) attention
    model = BertModel.from_pretrained(str(bert_dir), attn_implementation="eager").eval()
    ids = torch.randint(5, 400, (2, 16))
    with torch.no_grad():
        probs = model(input_ids=ids, output_attentions=True).attentions
    for s, p in zip(attention_logits(model, ids), probs):
        torch.testing.assert_close(torch.softmax(s, -1).float(), p, atol=1e-6, rtol=1e-5)


def test_head_statistics_on_known_heads():
    from fixedhead.analysis import head_statistics, numerical_rank

    n = 12
    zero = head_statistics(torch.zeros(n, n))  # every query uniform: rank 0, entropy ln n, one dimension suffices
    assert zero["logit_rank"] == 0 and zero["min_head_dim"] == 1
    assert zero["entropy"] == pytest.approx(math.log(n))
    torch.manual_seed(1)
    q, k = torch.randn(n, 3, dtype=torch.float64), torch.randn(n, 3, dtype=torch.float64)
    low = head_statistics(q @ k.T)  # a head of size 3
    assert low["logit_rank"] == 3 and low["min_head_dim"] in (2, 3)
    assert 0 < low["entropy"] < math.log(n)
    shift = head_statistics(q @ k.T + torch.randn(n, 1, dtype=torch.float64))  # + per-query shift: same P
    assert shift["logit_rank"] == 4 and shift["min_head_dim"] == low["min_head_dim"]
    sharp = head_statistics(50.0 * torch.eye(n))  # each query attends to itself
    assert sharp["entropy"] < 1e-15
    with pytest.raises(ValueError, match="rtol must be in"):
        numerical_rank(torch.eye(3), rtol=0.0)


def test_analyze_cli_on_a_run_writes_table_json_and_heatmap(tiny_run, heldout_text, tmp_path, capsys):
    run, _, _ = tiny_run
    out = tmp_path / "analysis"
    rc = main(["analyze", str(run), "--text", str(heldout_text), "--max-sequences", "2", "--output-dir", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert len(lines) == 2 * 4  # one row per (layer, head)
    assert all(line.split()[2] == "16" for line in lines)  # d_p column
    saved = json.loads((out / "analysis.json").read_text())
    assert saved["num_heads"] == 4 and len(saved["table"]) == 8 and saved["rtol"] == 1e-5
    assert all(r["logit_rank_max"] <= 16 for r in saved["table"])
    png = (out / "attention_heatmap.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_analyze_errors_name_the_problem(tiny_run, heldout_text, tmp_path, capsys):
    from transformers import BertConfig, BertForMaskedLM

    run, _, _ = tiny_run
    no_tok = tmp_path / "no_tokenizer"
    BertForMaskedLM(BertConfig(vocab_size=400, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32, max_position_embeddings=32)).save_pretrained(str(no_tok))
    assert main(["analyze", str(no_tok), "--text", str(heldout_text)]) == 2
    assert "holds no tokenizer" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "nowhere"), "--text", str(heldout_text)]) == 2
    assert "nowhere' does not exist" in capsys.readouterr().err
    assert main(["analyze", str(run), "--text", str(tmp_path / "missing.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["analyze", str(run), "--text", str(heldout_text), "--max-seq-length", "64"]) == 2
    assert "exceeds the model's max_position_embeddings=32" in capsys.readouterr().err
    shutil.rmtree(no_tok)
