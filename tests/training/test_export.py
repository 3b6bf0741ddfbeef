"""ONNX Runtime for the encoders (issue 44, item 3): ``fixedhead export-onnx`` and ``export_onnx``.

A masked-LM run and a sequence-classification run are exported (dynamic batch and length) and the
exported ``model.onnx`` is run here with ``onnxruntime.InferenceSession`` on real tokenized text, at
batch sizes and lengths the export never saw, with padding. Expected values are the PyTorch model's
logits (the run loaded with ``from_pretrained``). Tolerance: 1e-4 absolute plus 1e-4 relative to the
largest logit (float32; ONNX Runtime's MatMul and Softmax kernels round differently from PyTorch's,
observed differences ~1e-7). Head sizes: d_p = 16 (the tiny run) and 10 (not a multiple of 8, which
fused GPU kernels refuse): ONNX Runtime's CPU graph takes both.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from _tiny_run import snapshot
from fixedhead import FixedHeadForMaskedLM, FixedHeadForSequenceClassification
from fixedhead.cli import main
from fixedhead.runs import open_run
from fixedhead.training.export import OnnxExportOptions, export_onnx

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = [
    "The old house stood at the end of the lane, and nobody had lived in it for years.",
    "She laughed.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
]
#: the tiny runs' max_position_embeddings (texts are cut to it, as a user's pipeline would)
N_MAX = 32


def _ort_logits(folder, tokenizer, texts) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    enc = tokenizer(texts, padding=True, truncation=True, max_length=N_MAX, return_tensors="np")
    return session.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()})[0]


def _torch_logits(model, tokenizer, texts) -> np.ndarray:
    enc = tokenizer(texts, padding=True, truncation=True, max_length=N_MAX, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.numpy()


def _assert_close(got, want):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 + 1e-4 * np.abs(want).max())


@pytest.fixture(scope="module")
def classification_run(tiny_pretrained_run, tmp_path_factory):
    """The tiny masked-LM run as a 3-label classifier with head size 10 (the head newly initialised,
    as fine-tuning starts), saved as ``finetune`` saves: model, config and tokenizer."""
    run_dir, _, _ = tiny_pretrained_run
    run = open_run(run_dir)
    torch.manual_seed(0)
    config = run.config.__class__.from_dict({**run.config.to_dict(), "head_dim": 10, "num_labels": 3})
    model = FixedHeadForSequenceClassification(config)
    folder = tmp_path_factory.mktemp("cls") / "run"
    model.save_pretrained(str(folder))
    run.tokenizer.save_pretrained(str(folder))
    return folder


def test_masked_lm_run_gives_pytorchs_logits_on_onnxruntime(tiny_pretrained_run, tmp_path, capsys):
    run_dir, _, _ = tiny_pretrained_run
    out = tmp_path / "onnx"
    assert main(["export-onnx", str(run_dir), "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ONNX Runtime vs PyTorch" in printed and str(out) in printed
    run = open_run(run_dir)
    model = FixedHeadForMaskedLM.from_pretrained(str(run_dir)).eval()
    for texts in (TEXTS, TEXTS[:1]):  # batch 3 and 1, lengths the export never saw, padding in the batch of 3
        _assert_close(_ort_logits(out, run.tokenizer, texts), _torch_logits(model, run.tokenizer, texts))
    record = json.loads((out / "onnx_export.json").read_text())
    assert record["model_class"] == "FixedHeadForMaskedLM" and all(c["ok"] for c in record["checks"])
    assert run.config.max_position_embeddings == N_MAX
    assert max(c["shape"][1] for c in record["checks"]) == N_MAX
    assert {"model.onnx", "model.onnx.data", "config.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not list(tmp_path.glob(".onnx.*"))  # no staging folder left


@pytest.mark.parametrize("opset", [None, 23])  # 23: torch.onnx writes ONNX's Attention op, not MatMul + Softmax
def test_classification_run_with_head_size_10_gives_pytorchs_logits(classification_run, tmp_path, opset):
    out = tmp_path / "onnx"
    record = export_onnx(classification_run, out, OnnxExportOptions(opset_version=opset))
    assert record["model_class"] == "FixedHeadForSequenceClassification" and record["head_dim"] == 10
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = {node.op_type for node in graph.graph.node}
    assert ("Attention" in ops) == (opset == 23) and ("Softmax" in ops) == (opset is None)
    run = open_run(classification_run)
    model = FixedHeadForSequenceClassification.from_pretrained(str(classification_run)).eval()
    got = _ort_logits(out, run.tokenizer, TEXTS)
    assert got.shape == (3, 3)
    _assert_close(got, _torch_logits(model, run.tokenizer, TEXTS))


def test_a_causal_run_is_refused_by_name(tiny_causal_run, tmp_path):
    run_dir, _, _ = tiny_causal_run
    with pytest.raises(ValueError, match="FixedHeadForCausalLM.*export-onnx exports the encoders"):
        export_onnx(run_dir, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


def test_logits_that_disagree_write_nothing(tiny_pretrained_run, tmp_path, monkeypatch):
    """A graph whose logits differ from PyTorch's by more than the tolerance: a RuntimeError with the
    differences, and neither the output folder nor a staging folder is left."""
    run_dir, _, _ = tiny_pretrained_run
    run = onnxruntime.InferenceSession.run
    monkeypatch.setattr(onnxruntime.InferenceSession, "run", lambda self, *a: [x + 1e-2 for x in run(self, *a)])
    with pytest.raises(RuntimeError, match="differ from PyTorch's beyond the tolerance.*max_abs_diff"):
        export_onnx(run_dir, tmp_path / "onnx")
    assert list(tmp_path.iterdir()) == []


def test_an_occupied_folder_and_bad_options_are_refused_before_any_work(tiny_pretrained_run, tmp_path):
    run_dir, _, _ = tiny_pretrained_run
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    before = snapshot(mine)
    with pytest.raises(FileExistsError, match="did not create"):
        export_onnx(run_dir, mine)
    assert snapshot(mine) == before
    with pytest.raises(ValueError, match="atol"):
        export_onnx(run_dir, tmp_path / "x", OnnxExportOptions(atol=-1.0))
    assert main(["export-onnx", str(run_dir), "--output-dir", str(mine)]) == 2
    assert main(["export-onnx", str(run_dir), "--output-dir", str(mine), "--overwrite"]) == 2  # not ours to remove
    assert snapshot(mine) == before
    for opset in ("7", "99"):  # below what torch.onnx writes, above what it knows
        assert main(["export-onnx", str(run_dir), "--output-dir", str(tmp_path / "y"), "--opset-version", opset]) == 2
    assert not (tmp_path / "y").exists()


def test_overwrite_replaces_an_earlier_export_and_nothing_else(tiny_pretrained_run, tmp_path):
    """An earlier export is replaced file by file; the model code config.json's auto_map names is there."""
    run_dir, _, _ = tiny_pretrained_run
    out = tmp_path / "onnx"
    export_onnx(run_dir, out)
    first = snapshot(out)
    config = json.loads((out / "config.json").read_text())
    for target in config["auto_map"].values():
        assert (out / f"{target.split('.')[0]}.py").is_file(), target
    with pytest.raises(FileExistsError, match="--overwrite"):
        export_onnx(run_dir, out)
    (out / "model.onnx.data").write_bytes(b"stale")
    export_onnx(run_dir, out, overwrite=True)
    assert snapshot(out).keys() == first.keys() and snapshot(out)["model.onnx.data"] == first["model.onnx.data"]
    assert not list(out.glob(".export-onnx.*"))
