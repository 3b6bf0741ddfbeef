"""Ecosystem: Auto classes and pipelines, attention implementations, model card and tracking,
two-process training, launcher configs and the examples — issue 6. The shared run is conftest's
``tiny_pretrained_run``; the attention diagnostics are in test_analysis.py."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fixedhead
from fixedhead import FixedHeadForMaskedLM

SRC = Path(fixedhead.__file__).resolve().parents[1]


def _env(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["FIXEDHEAD_CACHE"] = str(tmp_path / "cache")
    env["OMP_NUM_THREADS"] = "1"
    return env


# ------------------------------------------------------------------ Auto classes, pipeline, examples
def test_auto_classes_registered_on_import_without_remote_code(tiny_pretrained_run, tmp_path):
    run, _, _ = tiny_pretrained_run
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
    # stdin closed: transformers' question "trust this run's code?" (the run carries its code and
    # auto_map) is answered by nobody, so it refuses at once, as it must without trust_remote_code
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()  # the refusal's question ends without a newline, before our line
    assert lines[-5].endswith("unknown-before-import"), out.stdout
    assert lines[-4:] == [
        "FixedHeadConfig",
        "FixedHeadModel",
        "FixedHeadForMaskedLM",
        "FixedHeadForSequenceClassification",
    ]


def test_auto_masked_lm_loads_the_trained_weights(tiny_pretrained_run):
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM

    run, _, _ = tiny_pretrained_run
    model = AutoModelForMaskedLM.from_pretrained(str(run))
    assert isinstance(model, FixedHeadForMaskedLM) and model.config.head_dim == 16
    saved = load_file(str(run / "model.safetensors"))
    qkv = "fixedhead.encoder.layer.1.attention.qkv.weight"
    assert torch.equal(model.state_dict()[qkv], saved[qkv])


def test_fill_mask_pipeline_on_a_heldout_sentence(tiny_pretrained_run, heldout_text):
    from transformers import AutoTokenizer, pipeline

    run, _, _ = tiny_pretrained_run
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


def test_fill_mask_example_scores_heldout_sentences(tiny_pretrained_run, capsys):
    """examples/fill_mask.py: masked held-out sentences, the pipeline's top-5, a frequency baseline."""
    from transformers import AutoTokenizer

    run, data, _ = tiny_pretrained_run
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


def test_fill_mask_example_refuses_another_corpus(tiny_pretrained_run, tmp_path, capsys):
    run, _, _ = tiny_pretrained_run
    other = tmp_path / "other.jsonl"
    other.write_text(
        "".join(
            json.dumps({"title": f"doc {i}", "text": f"Some other text here, part {i}. " * 20}) + "\n"
            for i in range(10)
        )
    )
    with pytest.raises(SystemExit) as info:
        _example("fill_mask").main([str(run), "--corpus", str(other)])
    assert "is not the one" in str(info.value) and "doc " in str(info.value)


def test_timed_pretraining_example_fits_steps_to_the_budget(small_real_corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    args = [
        "--output-dir",
        str(tmp_path / "run"),
        "--minutes",
        "0.05",
        "--calibration-steps",
        "3",
        "--corpus",
        str(small_real_corpus),
        "--vocab-size",
        "400",
        "--max-seq-length",
        "32",
        "--heldout-fraction",
        "0.1",
        "--max-eval-tokens",
        "2000",
        "--hidden-size",
        "32",
        "--num-hidden-layers",
        "1",
        "--num-attention-heads",
        "4",
        "--head-dim",
        "16",
        "--batch-size",
        "8",
        "--report-to",
        "none",
        "--bf16",
    ]
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
    for extra, message in (
        (["--minutes", "1"], "already holds a run; pass --overwrite to replace it"),
        (["--evaluations", "0"], "--evaluations must be >= 1, got 0"),
        (["--report-to", "nosuchtracker"], "report_to nosuchtracker: unknown integration"),
    ):
        before = sorted(p.name for p in (tmp_path / "run").iterdir())
        with pytest.raises(SystemExit):
            _example("pretrain_timed").main(args + extra)
        assert message in capsys.readouterr().err
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


def test_eager_and_sdpa_agree_and_attentions_are_probabilities(tiny_pretrained_run):
    from transformers import AutoModelForMaskedLM

    run, data, _ = tiny_pretrained_run
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
    for pa, pb in zip(a.attentions, b.attentions, strict=True):
        assert pa.shape == (3, 4, 32, 32)  # [batch, heads, query, key]
        torch.testing.assert_close(pa.sum(-1), torch.ones(3, 4, 32))
        assert float(pa[1, :, :, 20:].max()) == 0.0  # padded keys get no attention
        torch.testing.assert_close(pa, pb)


# ------------------------------------------------------------------ tracking and cards
def test_run_directory_has_model_card_and_tensorboard_logs(tiny_pretrained_run):
    run, data, result = tiny_pretrained_run
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


# ------------------------------------------------------------------ distributed training
def test_shipped_launcher_configs_parse():
    from accelerate.commands.config.config_args import ClusterConfig

    root = SRC.parent / "configs"
    fsdp = ClusterConfig.from_yaml_file(str(root / "accelerate_fsdp.yaml"))  # unknown keys raise
    assert fsdp.distributed_type.value == "FSDP"
    assert fsdp.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "FixedHeadLayer"
    from fixedhead.model.modeling import FixedHeadLayer  # the class named there exists

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
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        "-m",
        "fixedhead.cli",
        "pretrain",
        "--output-dir",
        str(run),
        "--corpus",
        str(small_real_corpus),
        "--hidden-size",
        "32",
        "--num-hidden-layers",
        "1",
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
        "8",
        "--batch-size",
        "8",
        "--eval-steps",
        "4",
        "--save-steps",
        "8",
        "--max-eval-tokens",
        "2000",
        "--report-to",
        "none",
    ]
    out = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    if out.returncode != 0 and any(
        s in out.stderr
        for s in ("Address already in use", "EADDRINUSE", "Operation not permitted", "Connection refused")
    ):
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


def test_the_guide_names_the_modules_lora_can_target():
    """The guide's LoRA paragraph names real module suffixes (peft matches `target_modules` against the
    ends of module names) and says a BERT recipe's `query` / `value` match nothing."""
    import re

    from _tiny_run import tiny_config

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    section = guide.split("### LoRA (peft) and lm-eval", 1)[1].split("\n#", 1)[0]
    suffixes = {
        name.rsplit(".", 1)[-1]
        for name, m in FixedHeadForMaskedLM(tiny_config()).named_modules()
        if isinstance(m, torch.nn.Linear)
    }
    named = set(re.findall(r"`(?:attention\.)?(qkv|out_proj|intermediate|output)`", section))
    assert named == {"qkv", "out_proj", "intermediate", "output"} <= suffixes
    assert not {"query", "value", "key"} & suffixes and '["query", "value"]' in section
