"""ONNX export of an encoder run, checked on ONNX Runtime against PyTorch.

The export is transformers' (``OnnxExporter``), batch and sequence axes dynamic; the graph runs on ONNX
Runtime's CPU provider at other shapes than the traced one, with padding, and the folder appears only when
its logits agree. Any head size exports (opset 20: MatMul and Softmax; from 23 ONNX's ``Attention``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..runs import claim_output_dir, environment_info, open_run, write_json_atomic

#: the model folder, whose modules an export carries as its code (as a run does)
MODEL_DIR = Path(__file__).resolve().parents[1] / "model"

#: the record a finished export writes last (its marker)
EXPORT_RECORD = "onnx_export.json"
#: the run classes exported: the encoders (a causal LM generates, which a single graph does not cover)
ENCODER_CLASSES = ("FixedHeadForMaskedLM", "FixedHeadForSequenceClassification")
#: the staging folder inside the output folder (files are renamed from it once checked)
STAGE_GLOB = ".export-onnx.*.tmp"
#: the opsets exported: torch.onnx's exporter writes opset 18 and up (lower ones only through onnx's
#: version converter, which fails on these graphs) and at most torch's ONNX_MAX_OPSET (23 in torch 2.13)
MIN_OPSET = 18


def max_opset() -> int:
    try:
        from torch.onnx._constants import ONNX_MAX_OPSET
    except ImportError:  # a private module: a torch that moved it keeps the value of torch 2.13
        return 23
    return ONNX_MAX_OPSET


def owned_files() -> tuple[str, ...]:
    """Every file an export folder holds, what ``--overwrite`` may replace."""
    from ..model.modeling import remote_code_files

    graph = ("model.onnx", "model.onnx.data", "export.json", "config.json", "generation_config.json")
    tokenizer = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
    return (*graph, *remote_code_files(), *tokenizer, EXPORT_RECORD)


@dataclass
class OnnxExportOptions:
    """How ``fixedhead export-onnx`` exports and checks a run."""

    opset_version: int | None = None
    """ONNX opset of the graph (default: the newest the installed onnxscript writes)"""
    atol: float = 1e-4
    """largest |ONNX Runtime - PyTorch| logit allowed, plus rtol times |PyTorch's logit|"""
    rtol: float = 1e-4
    """relative part of the tolerance (see atol)"""
    check_batch_size: int = 3
    """rows of each check batch (the trace uses 2; the last row is padded)"""


def _check_options(options: OnnxExportOptions) -> None:
    from ..checks import positive_float, positive_int

    positive_float("--atol", options.atol)
    positive_float("--rtol", options.rtol)
    positive_int("--check-batch-size", options.check_batch_size)
    top = max_opset()
    if options.opset_version is not None and not MIN_OPSET <= options.opset_version <= top:
        raise ValueError(
            f"--opset-version {options.opset_version!r}: torch.onnx exports opsets {MIN_OPSET} to {top} (default: "
            f"the newest onnxscript writes by default)"
        )


def _model_class(run):
    """The fixedhead class a run holds (config.json's ``architectures``), refused unless an encoder."""
    import fixedhead

    names = list(getattr(run.config, "architectures", None) or [])
    name = names[0] if names else None
    if name not in ENCODER_CLASSES:
        raise ValueError(
            f"{run.path}: holds {name or 'a model of unknown class'} ({run.config.model_type}); export-onnx exports "
            f"the encoders ({', '.join(ENCODER_CLASSES)}): a causal LM generates step by step, which one graph "
            f"does not cover (transformers' OnnxExporter.export_for_generation does)"
        )
    return getattr(fixedhead, name)


def _batch(tokenizer, vocab_size: int, batch: int, length: int, generator) -> dict[str, torch.Tensor]:
    """Random token ids [batch, length] of the tokenizer's own tokens, the last row padded after half its length,
    with the inputs the tokenizer gives a model."""
    ids = torch.randint(0, min(len(tokenizer), vocab_size), (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    if batch > 1 and length > 1:
        mask[-1, (length + 1) // 2 :] = 0
        ids[-1, (length + 1) // 2 :] = tokenizer.pad_token_id or 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in tokenizer.model_input_names:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return inputs


def check_on_onnxruntime(onnx_path, model, batches, atol: float, rtol: float) -> list[dict]:
    """Compare the graph's first output on ONNX Runtime's CPU provider with ``model(**batch)``'s logits: one
    record per batch with ``shape``, ``max_abs_diff``, ``allowed`` (atol + rtol × the largest |logit|) and ``ok``."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    records = []
    for batch in batches:
        if set(names) - set(batch):
            raise ValueError(f"{onnx_path}: the graph takes {names}, the check batch has {sorted(batch)}")
        got = torch.from_numpy(session.run(None, {k: batch[k].numpy() for k in names})[0])
        with torch.no_grad():
            want = model(**batch).logits
        if got.shape != want.shape:
            raise ValueError(
                f"{onnx_path}: ONNX Runtime gave logits of shape {list(got.shape)}, PyTorch {list(want.shape)}"
            )
        diff = (got - want).abs().max().item()
        allowed = atol + rtol * want.abs().max().item()
        records.append(
            dict(shape=list(batch["input_ids"].shape), max_abs_diff=diff, allowed=allowed, ok=bool(diff <= allowed))
        )
    return records


def export_onnx(run_dir, output_dir, options: OnnxExportOptions | None = None, overwrite: bool = False) -> dict:
    """Export a masked-LM or sequence-classification run to ONNX and check it on ONNX Runtime.

    Writes ``model.onnx`` and ``model.onnx.data``, transformers' ``export.json``, the config and tokenizer, and
    ``onnx_export.json`` (shapes, largest logit differences, tolerance, versions). Inputs int64 [batch, n],
    output ``logits``. Checked in a staging folder and moved into place only when every batch agrees.

    Raises:
        FileExistsError: ``output_dir`` holds something else (or an export, without ``overwrite``).
        RuntimeError: the logits differ by more than the tolerance (nothing is written).
        ImportError: onnx, onnxscript or onnxruntime is missing.
    """
    from transformers.exporters import OnnxConfig, OnnxExporter

    options = options or OnnxExportOptions()
    _check_options(options)
    run = open_run(run_dir)
    cls = _model_class(run)
    out, owned = Path(output_dir), owned_files()
    claim_output_dir(out, (EXPORT_RECORD,), (*owned, STAGE_GLOB), "export-onnx", create=False, exclusive=True)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"--output-dir {str(out)!r} holds an earlier export; pass --overwrite to replace it")

    model = run.load_model(cls, config=run.config).eval()
    n_max = model.config.max_position_embeddings
    generator = torch.Generator().manual_seed(0)
    sample = _batch(run.tokenizer, model.config.vocab_size, 2, min(8, n_max), generator)
    batch, sequence = torch.export.Dim("batch", max=1 << 16), torch.export.Dim("sequence", max=n_max)
    config = OnnxConfig(
        dynamic_shapes={k: {0: batch, 1: sequence} for k in sample}, opset_version=options.opset_version
    )
    exported = OnnxExporter().export(model, sample, config)
    written = exported.program.opset_imports.get("")
    if options.opset_version is not None and written != options.opset_version:
        raise ValueError(f"--opset-version {options.opset_version}: the exporter wrote opset {written} instead")

    checks = [
        _batch(run.tokenizer, model.config.vocab_size, options.check_batch_size, n, generator)
        for n in sorted({1, max(1, n_max // 2 + 1), n_max})
    ]
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(STAGE_GLOB):  # an interrupted export's staging folder
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=out, prefix=".export-onnx.", suffix=".tmp"))
    try:
        exported.save_pretrained(str(stage))
        run.tokenizer.save_pretrained(str(stage))
        for name in owned:  # the model code config.json's auto_map names, as a run folder carries it
            if name.endswith(".py") and not (stage / name).exists():
                shutil.copyfile(MODEL_DIR / name, stage / name)
        extra = sorted(p.name for p in stage.iterdir() if p.name not in owned)
        if extra:  # what --overwrite would not know to replace: refuse rather than leave it unowned
            raise RuntimeError(f"the export wrote files this command does not know: {extra}")
        records = check_on_onnxruntime(stage / "model.onnx", model, checks, options.atol, options.rtol)
        bad = [r for r in records if not r["ok"]]
        if bad:
            raise RuntimeError(f"ONNX Runtime's logits differ from PyTorch's beyond the tolerance: {json.dumps(bad)}")
        record = dict(
            run_dir=str(run.path.resolve()),
            model_class=cls.__name__,
            head_dim=getattr(model.config, "head_dim", None),
            inputs=list(sample),
            options=asdict(options),
            checks=records,
            provider="CPUExecutionProvider",
            versions={**environment_info(), **_onnx_versions()},
        )
        write_json_atomic(stage / EXPORT_RECORD, record)
        for name in owned:  # an earlier export's files (claim_output_dir let only those be there)
            (out / name).unlink(missing_ok=True)
        for path in sorted(stage.iterdir(), key=lambda p: p.name == EXPORT_RECORD):  # the record last
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created and not any(out.iterdir()):  # a failed export into a new folder leaves no folder
            out.rmdir()
    return record


def _onnx_versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in ("onnx", "onnxscript", "onnxruntime")}
