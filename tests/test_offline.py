"""Nothing reaches a network at run time, whatever is installed.

A fresh Python (no HF_HUB_OFFLINE or telemetry switches in its environment) runs, behind a socket
guard that refuses and records every connection or name lookup other than loopback: a tiny causal
pretraining run and its evaluation through the ``fixedhead`` command, ``generate`` on the saved
model, and the attention-implementation switch (FlashAttention by name, which transformers answers
with a hub kernel download when the ``kernels`` package is installed). The guard sits below every
client (the hub, datasets, telemetry, kernels), so the test holds whatever versions are installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, socket, sys

attempts = []
LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0", None}

def refused(address):
    host = address[0] if isinstance(address, tuple) else None  # AF_UNIX paths are local
    if isinstance(address, tuple) and host not in LOOPBACK:
        attempts.append(str(address))
        raise OSError(f"network access refused by the test's guard: {address}")

for name in ("connect", "connect_ex"):
    original = getattr(socket.socket, name)
    def guarded(self, address, _original=original):
        refused(address)
        return _original(self, address)
    setattr(socket.socket, name, guarded)
original_getaddrinfo = socket.getaddrinfo
def getaddrinfo(host, *args, **kwargs):
    if host not in LOOPBACK:
        attempts.append(f"lookup {host}")
        raise socket.gaierror(f"name lookup refused by the test's guard: {host}")
    return original_getaddrinfo(host, *args, **kwargs)
socket.getaddrinfo = getaddrinfo

import torch
from fixedhead import FixedHeadForCausalLM
from fixedhead.cli import main

corpus, run = sys.argv[1], sys.argv[2]
tiny = ["--corpus", corpus, "--objective", "clm", "--vocab-size", "200", "--max-seq-length", "16",
        "--hidden-size", "32", "--num-hidden-layers", "1", "--num-attention-heads", "4", "--head-dim", "8",
        "--max-steps", "2", "--batch-size", "4", "--eval-steps", "2", "--save-steps", "2",
        "--heldout-fraction", "0.1", "--max-eval-tokens", "500", "--report-to", "tensorboard"]
assert main(["pretrain", "--output-dir", run, *tiny]) == 0
assert main(["evaluate", run]) == 0
model = FixedHeadForCausalLM.from_pretrained(run).eval()
tokens = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, do_sample=False)
switch = {}
for name in ("flash_attention_2", "kernels-community/flash-attn2", "flex_attention", "sdpa"):
    try:
        model.set_attn_implementation(name)
        switch[name] = "set"
    except Exception as e:  # on a CPU: FlashAttention is refused (no package, and no hub to fetch it from)
        switch[name] = type(e).__name__
print("RESULT " + json.dumps({"attempts": attempts, "generated": tokens.shape[1], "switch": switch}))
"""


@pytest.mark.usefixtures("one_thread")
def test_pretrain_evaluate_generate_and_the_attention_switch_touch_no_network(small_real_corpus, tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "TRANSFORMERS_", "DISABLE_TELEMETRY")) and k != "HUGGINGFACE_HUB_CACHE"
    }
    env["HF_HOME"] = str(tmp_path / "hf-home")  # an empty hub cache: nothing can be found there either
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(small_real_corpus), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    assert result["attempts"] == [], f"network access attempted: {result['attempts']}"
    assert result["generated"] == 7
    assert result["switch"]["flex_attention"] == result["switch"]["sdpa"] == "set"
    # FlashAttention has no package and no reachable hub here: refused with an error, never fetched
    assert result["switch"]["flash_attention_2"] != "set"
    assert result["switch"]["kernels-community/flash-attn2"] != "set"
