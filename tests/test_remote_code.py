"""Runs that open anywhere (issue 44, item 1): a saved fixedhead model carries its modeling code.

``save_pretrained`` of every fixedhead class writes the model folder's modules (transformers'
``custom_object_save``) and an ``auto_map`` naming every class, so ``AutoConfig`` / ``AutoModel*``
``.from_pretrained(folder, trust_remote_code=True)`` works in a Python where fixedhead cannot be
imported. The loading side runs in a subprocess whose import system refuses ``fixedhead*`` (a
``sys.meta_path`` finder that raises ImportError, and ``src/`` taken off ``sys.path``), from a
working folder outside the repository, with the Hugging Face Hub offline and every cache in the
test's temporary folder. Expected values are the original models' own outputs in this process.

Tolerance: none. Both sides run the same code on the same weights with one thread, so logits,
hidden states and greedy tokens must be equal bit for bit (JSON carries float32 values exactly).
A Llama-style run is transformers' own ``LlamaForCausalLM``: it must open with no fixedhead and no
``trust_remote_code``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

import fixedhead
from fixedhead import (
    FixedHeadConfig,
    FixedHeadForCausalLM,
    FixedHeadForMaskedLM,
    FixedHeadForSequenceClassification,
    FixedHeadModel,
)
from fixedhead.model.architectures import llama_config, new_model
from fixedhead.model.modeling import AUTO_CLASSES, auto_map, remote_code_files

pytestmark = pytest.mark.usefixtures("one_thread")

SRC = Path(fixedhead.__file__).resolve().parents[1]  # src/
MODEL_DIR = Path(fixedhead.__file__).resolve().parent / "model"

#: the child process: fixedhead blocked, then the jobs read from argv[1], results to argv[2]
CHILD = r"""
import importlib.abc, json, os, sys

SRC = os.path.realpath(sys.argv[3])
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != SRC]  # the editable install's entry


class NoFixedhead(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "fixedhead" or name.startswith("fixedhead."):
            raise ImportError(f"fixedhead is blocked in this process ({name})")
        return None


sys.meta_path.insert(0, NoFixedhead())
try:
    import fixedhead  # noqa: F401
    blocked = False
except ImportError:
    blocked = True

import torch
import transformers

torch.set_num_threads(1)
results = {"fixedhead_blocked": blocked, "src_on_path": any(os.path.realpath(p or ".") == SRC for p in sys.path),
           "jobs": []}
for job in json.load(open(sys.argv[1])):
    kwargs = {"trust_remote_code": True} if job["trust_remote_code"] else {}
    config = transformers.AutoConfig.from_pretrained(job["path"], **kwargs)
    model = getattr(transformers, job["auto"]).from_pretrained(job["path"], **kwargs)
    out = {"config_class": f"{type(config).__module__}.{type(config).__name__}",
           "model_class": f"{type(model).__module__}.{type(model).__name__}", "outputs": {}}
    with torch.no_grad():
        if job.get("input_ids") is not None:
            result = model(input_ids=torch.tensor(job["input_ids"]), attention_mask=torch.tensor(job["attention_mask"]))
            out["outputs"] = {name: getattr(result, name).tolist() for name in job["outputs"]}
        if job.get("prompt") is not None:
            tokens = model.generate(torch.tensor(job["prompt"]), do_sample=False, max_new_tokens=8, pad_token_id=0)
            out["generated"] = tokens.tolist()
        if job.get("tokenize_text") is not None:  # AutoTokenizer reads config.json too: the guide's line
            tokenizer = transformers.AutoTokenizer.from_pretrained(job["path"], **kwargs)
            out["token_ids"] = tokenizer(job["tokenize_text"])["input_ids"]
        if job.get("pipeline_text") is not None:
            generate = transformers.pipeline("text-generation", model=job["path"], **kwargs)
            out["pipeline"] = generate(job["pipeline_text"], max_new_tokens=8, do_sample=False)[0]["generated_text"]
    results["jobs"].append(out)
json.dump(results, open(sys.argv[2], "w"))
"""


def run_without_fixedhead(jobs: list[dict], tmp_path: Path) -> list[dict]:
    """Run ``jobs`` in a fresh Python where fixedhead cannot be imported; return each job's results.

    The child's working folder is ``tmp_path``, ``PYTHONPATH`` is unset, the Hub is offline
    (``HF_HUB_OFFLINE=1``) and the transformers caches (remote-code modules included) are under
    ``tmp_path``. Fails the test if fixedhead could be imported there or ``src/`` was on its path.
    """
    job_file, out_file, script = tmp_path / "jobs.json", tmp_path / "results.json", tmp_path / "child.py"
    job_file.write_text(json.dumps(jobs))
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_")) and k != "PYTHONPATH"}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf_home"),
        HF_MODULES_CACHE=str(tmp_path / "hf_modules"),
        OMP_NUM_THREADS="1",
    )
    done = subprocess.run(
        [sys.executable, str(script), str(job_file), str(out_file), str(SRC)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out_file.read_text())
    assert results["fixedhead_blocked"] and not results["src_on_path"], results
    return results["jobs"]


def tiny_config(**kw) -> FixedHeadConfig:
    """d = 32, 4 heads of the fixed size 16 (not d/h = 8), two layers, 99 tokens."""
    fields = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=16,
        intermediate_size=37,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    return FixedHeadConfig(**{**fields, **kw})


def inputs(vocab: int = 99) -> dict:
    """A batch of two rows of 7 tokens, the second ending in two padding positions."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


PROMPT = [[1, 5, 17, 42, 8], [1, 60, 3, 3, 71]]  # two prompts of five tokens, no padding

#: the four classes, a config for each that exercises its own code (per-layer head sizes, μP,
#: queries and keys of one size and values of another through the key/value cache, three labels),
#: and the outputs compared
CASES = [
    (FixedHeadModel, "AutoModel", dict(head_dim=[16, 8]), ["last_hidden_state", "pooler_output"]),
    (FixedHeadForMaskedLM, "AutoModelForMaskedLM", dict(parametrization="mup", mup_base_head_dim=8), ["logits"]),
    (FixedHeadForCausalLM, "AutoModelForCausalLM", dict(qk_head_dim=6, v_head_dim=20), ["logits"]),
    (FixedHeadForSequenceClassification, "AutoModelForSequenceClassification", dict(num_labels=3), ["logits"]),
]


def saved_models(tmp_path: Path) -> list[tuple[Path, object, str, list[str]]]:
    """One tiny random model of each class saved under ``tmp_path``: (folder, model, Auto class, outputs)."""
    out = []
    for cls, auto, fields, names in CASES:
        model = cls(tiny_config(**fields)).eval()
        folder = tmp_path / cls.__name__
        model.save_pretrained(folder)
        out.append((folder, model, auto, names))
    return out


def expect_equal(got, want: torch.Tensor, what: str) -> None:
    got = torch.tensor(got, dtype=want.dtype)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (got - want).abs().max().item()
    assert torch.equal(got, want), f"{what}: differs from the original by up to {diff:.3g}"


def test_save_pretrained_writes_the_package_modules_and_an_auto_map_of_every_class(tmp_path):
    """The code a run carries is the package's own files, byte for byte (one source of truth), and
    config.json's auto_map names every class, each defined in the file it names."""
    assert set(remote_code_files()) >= {"modeling.py", "configuration.py", "attention.py", "checks.py"}
    expected_map = {
        "AutoConfig": "configuration.FixedHeadConfig",
        "AutoModel": "modeling.FixedHeadModel",
        "AutoModelForMaskedLM": "modeling.FixedHeadForMaskedLM",
        "AutoModelForCausalLM": "modeling.FixedHeadForCausalLM",
        "AutoModelForSequenceClassification": "modeling.FixedHeadForSequenceClassification",
    }
    assert auto_map() == expected_map
    for folder, _, _, _ in saved_models(tmp_path):
        code = sorted(p.name for p in folder.glob("*.py"))
        assert code == list(remote_code_files()), folder.name
        for name in code:
            assert (folder / name).read_bytes() == (MODEL_DIR / name).read_bytes(), f"{folder.name}/{name}"
        saved_map = json.loads((folder / "config.json").read_text())["auto_map"]
        assert saved_map == expected_map, folder.name
        for ref in saved_map.values():
            module, name = ref.split(".")
            tree = ast.parse((folder / f"{module}.py").read_text())
            assert name in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}, ref


def test_with_fixedhead_imported_the_package_classes_still_load(tmp_path):
    """Where fixedhead is imported its registered classes win over the run's copy of the code,
    with or without trust_remote_code (transformers prefers explicitly registered local code)."""
    model = FixedHeadForCausalLM(tiny_config()).eval()
    model.save_pretrained(tmp_path / "clm")
    for kwargs in ({}, {"trust_remote_code": True}):
        assert type(AutoConfig.from_pretrained(tmp_path / "clm", **kwargs)) is FixedHeadConfig
        assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "clm", **kwargs)) is FixedHeadForCausalLM
        assert type(AutoModel.from_pretrained(tmp_path / "clm", **kwargs)) is FixedHeadModel
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "clm", num_labels=2)
    assert type(classifier) is AUTO_CLASSES["AutoModelForSequenceClassification"]


def test_every_class_opens_without_fixedhead_with_the_same_outputs(tmp_path):
    """Each class saved, then loaded with its Auto class and trust_remote_code=True where fixedhead
    cannot be imported: same outputs (padding included), same greedy tokens for the causal LM; the
    causal run also opens as the bare model (AutoModel) with the original's encoder states."""
    batch = inputs()
    jobs, want = [], []
    for folder, model, auto, names in saved_models(tmp_path):
        with torch.no_grad():
            out = model(**batch)
        jobs.append({"path": str(folder), "auto": auto, "trust_remote_code": True, "outputs": names, **_lists(batch)})
        want.append({name: getattr(out, name) for name in names})
        if auto == "AutoModelForCausalLM":
            causal, causal_folder = model, folder
            with torch.no_grad():
                jobs[-1]["prompt"] = PROMPT
                want[-1]["generated"] = model.generate(
                    torch.tensor(PROMPT), do_sample=False, max_new_tokens=8, pad_token_id=0
                )
    with torch.no_grad():
        base = causal.fixedhead(**batch).last_hidden_state
    jobs.append(
        {
            "path": str(causal_folder),
            "auto": "AutoModel",
            "trust_remote_code": True,
            "outputs": ["last_hidden_state"],
            **_lists(batch),
        }
    )
    want.append({"last_hidden_state": base})

    got = run_without_fixedhead(jobs, tmp_path)
    for job, expected, result in zip(jobs, want, got, strict=True):
        what = f"{Path(job['path']).name} via {job['auto']}"
        assert result["config_class"].startswith("transformers_modules.") and result["config_class"].endswith(
            ".configuration.FixedHeadConfig"
        ), result["config_class"]
        assert result["model_class"].startswith("transformers_modules."), (what, result["model_class"])
        for name, tensor in expected.items():
            if name == "generated":
                assert result["generated"] == tensor.tolist(), what
                assert len(result["generated"][0]) > len(PROMPT[0]), what  # it did generate
            else:
                expect_equal(result["outputs"][name], tensor, f"{what}: {name}")


def test_a_trained_run_and_its_checkpoint_open_without_fixedhead(tiny_causal_run, tmp_path):
    """A causal run trained by pretrain, and its Trainer checkpoint (written atomically), carry the
    code: both open where fixedhead cannot be imported with the trained model's logits and greedy
    tokens, and the text-generation pipeline of the model card gives the text it gives here."""
    from transformers import pipeline

    run, _, _ = tiny_causal_run
    checkpoint = run / "checkpoint-6"
    assert checkpoint.is_dir(), sorted(p.name for p in run.iterdir())
    for folder in (run, checkpoint):
        for name in remote_code_files():
            assert (folder / name).read_bytes() == (MODEL_DIR / name).read_bytes(), f"{folder.name}/{name}"
    assert not list(run.glob(".staging-checkpoint-*"))
    batch = inputs(AutoConfig.from_pretrained(run).vocab_size)
    jobs, want = [], []
    for folder in (run, checkpoint):
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        assert type(model) is FixedHeadForCausalLM
        with torch.no_grad():
            logits = model(**batch).logits
            tokens = model.generate(torch.tensor(PROMPT), do_sample=False, max_new_tokens=8, pad_token_id=0)
        job = {"path": str(folder), "auto": "AutoModelForCausalLM", "trust_remote_code": True, "outputs": ["logits"]}
        jobs.append({**job, **_lists(batch), "prompt": PROMPT})
        want.append({"logits": logits, "generated": tokens})
    text = "the old man walked slowly to the"
    jobs[0]["pipeline_text"] = jobs[0]["tokenize_text"] = text
    want[0]["pipeline"] = pipeline("text-generation", model=str(run))(text, max_new_tokens=8, do_sample=False)[0][
        "generated_text"
    ]

    got = run_without_fixedhead(jobs, tmp_path)
    for job, expected, result in zip(jobs, want, got, strict=True):
        what = Path(job["path"]).name
        assert result["model_class"].startswith("transformers_modules."), (what, result["model_class"])
        expect_equal(result["outputs"]["logits"], expected["logits"], f"{what}: logits")
        assert result["generated"] == expected["generated"].tolist(), what
    assert got[0]["pipeline"] == want[0]["pipeline"] and len(want[0]["pipeline"]) > len(text)
    assert got[0]["token_ids"] == AutoTokenizer.from_pretrained(run)(text)["input_ids"]


def test_a_llama_run_opens_with_plain_transformers(tmp_path):
    """A Llama-style model (fixedhead.model.architectures) saves as transformers' own checkpoint: no
    code, no auto_map; it opens with no fixedhead and no trust_remote_code, with the same logits and
    greedy tokens."""
    config = llama_config(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=16,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = new_model(config, "clm").eval()
    folder = tmp_path / "llama"
    model.save_pretrained(folder)
    assert not list(folder.glob("*.py"))
    assert "auto_map" not in json.loads((folder / "config.json").read_text())
    batch = inputs()
    with torch.no_grad():
        logits = model(**batch).logits
        tokens = model.generate(torch.tensor(PROMPT), do_sample=False, max_new_tokens=8, pad_token_id=0)
    job = {"path": str(folder), "auto": "AutoModelForCausalLM", "trust_remote_code": False, "outputs": ["logits"]}
    (result,) = run_without_fixedhead([{**job, **_lists(batch), "prompt": PROMPT}], tmp_path)
    assert result["model_class"] == "transformers.models.llama.modeling_llama.LlamaForCausalLM"
    expect_equal(result["outputs"]["logits"], logits, "llama: logits")
    assert result["generated"] == tokens.tolist()


def _lists(batch: dict) -> dict:
    return {k: v.tolist() for k, v in batch.items()}
