"""benchmarks/serve_check.py refuses, by name and before any server starts, a head size vLLM's CPU
attention cannot take (such a server reports ready, then fails its first request with HTTP 500)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SERVE_CHECK = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_check.py"


def load_serve_check():
    spec = importlib.util.spec_from_file_location("serve_check", SERVE_CHECK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("config", "named"),
    [({"head_dim": 8}, "head size 8"), ({"hidden_size": 160, "num_attention_heads": 16}, "head size 10")],
)
def test_a_head_size_vllm_cpu_cannot_take_is_refused_before_a_server_starts(
    tmp_path, monkeypatch, capsys, config, named
):
    serve_check = load_serve_check()
    run = tmp_path / "llama-dp8"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 8, **config}))
    vllm = tmp_path / "vllm"
    vllm.write_text("")

    def no_server(*args, **kw):
        raise AssertionError("a server was started")

    def no_model(*args, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(subprocess, "Popen", no_server)
    monkeypatch.setattr(serve_check, "reference_continuations", no_model)
    assert serve_check.main(["--run", str(run), "--vllm", str(vllm)]) == 2
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert named in out and "vLLM's CPU attention" in out and "HTTP 500" in out


def test_a_head_size_vllm_cpu_takes_passes_the_check(tmp_path):
    serve_check = load_serve_check()
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2, "head_dim": 32}))
    assert serve_check.head_size_refusal(tmp_path) is None
