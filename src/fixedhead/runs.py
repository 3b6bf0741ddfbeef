"""Run folders: claim an output folder, open a saved run, write results.

A command takes a folder (:func:`claim_output_dir`) only when it is missing, empty or holds its own output
(a marker file written first); ``--overwrite`` removes only what the command writes. A trained model is
opened through :func:`open_run` or :func:`check_model_dir`: JSON that parses, whole safetensors, no pickle
unless asked. Results are keyed on content (:func:`model_fingerprint`), never on a path. Files are written
atomically with the user's umask.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SAFE_WEIGHTS = "model.safetensors"
PICKLE_WEIGHTS = ("pytorch_model.bin", "model.bin", "pytorch_model.bin.index.json")
PRETRAIN_FILE = "pretrain_settings.json"
METRICS_FILE = "metrics.json"


# ------------------------------------------------------------------------ permissions
def follow_umask(path: str | os.PathLike) -> None:
    """Give ``path`` the mode a plain ``open()``/``mkdir()`` would under the umask (``mkstemp``/``mkdtemp`` make
    0600/0700, which would lock colleagues out of a shared run folder or cache)."""
    mask = os.umask(0o022)  # the process umask: read by setting it and restoring it at once
    os.umask(mask)
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~mask)


# ----------------------------------------------------------------------------- writing
def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, rename over ``path``: a failure leaves ``path`` as
    it was and no temporary file."""
    path = Path(path)
    with staged_outputs(path.parent) as stage:
        stage(path.name).write_bytes(data)


def write_json_atomic(path: str | os.PathLike, value) -> None:
    """Write ``value`` as indented JSON, atomically (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, (json.dumps(value, indent=2) + "\n").encode("utf-8"))


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text``, atomically (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def create_json_exclusive(path: str | os.PathLike, value, what: str) -> None:
    """Write ``value`` as JSON to ``path`` only if no such file exists, atomically (a hard link from a staged copy),
    so of two processes claiming one folder exactly one succeeds.

    Raises:
        FileExistsError: ``path`` exists; nothing is changed.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".claim")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write((json.dumps(value, indent=2) + "\n").encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        follow_umask(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise FileExistsError(
                f"{what} {str(path.parent)!r} was claimed by another process while this one started "
                f"({path.name} appeared); choose another folder (nothing of the other run was changed)"
            ) from None
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextmanager
def staged_outputs(output_dir: str | os.PathLike):
    """Write several output files so that either all appear or none do: yields ``stage(name) -> Path``, a
    temporary path to write ``name`` to; at the end every staged file is renamed into place, and if the block
    raises they are deleted."""
    out = Path(output_dir)
    staged: dict[str, Path] = {}

    def stage(name: str) -> Path:
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp" + Path(name).suffix)
        os.close(fd)
        staged[name] = Path(tmp)
        return Path(tmp)

    try:
        yield stage
        for tmp in staged.values():
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            follow_umask(tmp)
        for name, tmp in staged.items():
            os.replace(tmp, out / name)
    except BaseException as e:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and staged and e.filename is None and e.strerror:
            # name the output being written when it failed (``f.write`` errors carry no path)
            raise type(e)(e.errno, e.strerror, str(out / list(staged)[-1])) from None
        raise


# ----------------------------------------------------------------------------- reading
def load_json_file(path: str | os.PathLike, what: str | None = None) -> dict:
    """Parse a JSON object from ``path``; ValueError naming the file when it is not UTF-8, not valid JSON (a
    truncated file) or not an object."""
    path = Path(path)
    label = str(path) if what is None else f"{path} ({what})"
    if not path.is_file():
        raise FileNotFoundError(f"{label} not found")
    try:
        value = json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{label} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{label} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{label} must hold a JSON object, got {type(value).__name__}")
    return value


def check_safetensors(path: str | os.PathLike) -> None:
    """Check that a safetensors file is whole: its header parses and covers the file exactly (only the header is
    read). Raises ValueError naming the file and the reason."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as e:  # SafetensorError derives from Exception only
        raise ValueError(f"{path} is truncated or corrupt ({path.stat().st_size} bytes; safetensors: {e})") from None


def check_model_dir(model_dir: str | os.PathLike, allow_pickle: bool = False) -> str:
    """Validate a saved transformers model folder before loading it; return ``"safetensors"`` or ``"pickle"``.

    ``config.json`` must parse and the weights be a whole ``model.safetensors``; pickle weights can run code in
    older tools and are refused unless ``allow_pickle`` (then loaded with ``weights_only=True``).

    Raises:
        FileNotFoundError: no folder, config.json or weights.
        ValueError: a bad config, truncated safetensors, or pickle weights without the opt-in.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        state = "is a file, not a directory" if model_dir.exists() else "does not exist"
        raise FileNotFoundError(f"model directory {str(model_dir)!r} {state}")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} holds no finished model (model.safetensors and config.json)")
    load_json_file(model_dir / "config.json")
    if (model_dir / SAFE_WEIGHTS).is_file():
        check_safetensors(model_dir / SAFE_WEIGHTS)
        return "safetensors"
    pickles = [n for n in PICKLE_WEIGHTS if (model_dir / n).is_file()]
    if pickles:
        if not allow_pickle:
            raise ValueError(
                f"{model_dir} holds pickle weights ({pickles[0]}), which can execute code when loaded; "
                f"refusing. Convert them to {SAFE_WEIGHTS}, or pass allow_pickle=True (--allow-pickle) "
                f"if you trust their source"
            )
        return "pickle"
    raise FileNotFoundError(f"{model_dir} holds no model weights ({SAFE_WEIGHTS})")


@dataclass
class OpenedRun:
    """A validated fixedhead run folder, nothing loaded yet: ``config`` (``FixedHeadConfig`` or ``LlamaConfig``),
    ``tokenizer``, ``settings`` (its ``pretrain_settings.json``, {} if absent) and the ``weights`` format."""

    path: Path
    config: object
    tokenizer: object
    weights: str
    settings: dict = field(default_factory=dict)

    @property
    def use_safetensors(self) -> bool:
        return self.weights == "safetensors"

    def load_model(self, cls, **kwargs):
        """``cls.from_pretrained`` on this run. Raises ValueError in one line naming the folder where the weights do
        not fit the config (a hand-edited ``config.json``) or pickle weights are refused."""
        import pickle

        try:
            return cls.from_pretrained(str(self.path), use_safetensors=self.use_safetensors, **kwargs)
        except pickle.UnpicklingError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"{self.path}: the pickle weights were refused by torch's safe loader ({first})") from None
        except RuntimeError as e:
            found = re.search(r"size mismatch for ([\w.]+)", str(e))
            if "size mismatch" not in str(e) and "ignore_mismatched_sizes" not in str(e):
                raise
            detail = f" (first: {found.group(1)})" if found else ""
            raise ValueError(
                f"{self.path}: config.json's sizes disagree with the weights{detail}; the config was edited or "
                f"belongs to another model"
            ) from None


def open_run(run_dir: str | os.PathLike, allow_pickle: bool = False) -> OpenedRun:
    """Validate a fixedhead run folder and load its config, tokenizer and settings: the one way every command
    opens a trained model.

    The config and tokenizer must describe a model of fixedhead's architectures whose vocabulary covers the
    tokenizer; ``trust_remote_code`` is never used; a transformers BERT checkpoint is refused with the way to
    convert it.

    Raises:
        FileNotFoundError: no such folder, or no finished model in it.
        ValueError: a bad config or tokenizer, truncated weights, pickle weights without ``allow_pickle``.
    """
    from transformers import AutoTokenizer, LlamaConfig

    from .model.configuration import FixedHeadConfig

    run_dir = Path(run_dir)
    weights = check_model_dir(run_dir, allow_pickle=allow_pickle)
    config_dict = load_json_file(run_dir / "config.json")
    model_type = config_dict.get("model_type")
    config_class = {"fixedhead": FixedHeadConfig, "llama": LlamaConfig}.get(model_type)
    if config_class is None:
        hint = "; convert a transformers BERT first with fixedhead.from_bert(model) and save_pretrained"
        raise ValueError(
            f"{run_dir / 'config.json'}: model_type is {model_type!r}, expected 'fixedhead' (or 'llama')"
            + (hint if model_type == "bert" else "")
        )
    try:
        config = config_class.from_dict(config_dict)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{run_dir / 'config.json'}: {e}") from None
    tok_file = run_dir / "tokenizer.json"
    tok = load_json_file(tok_file)
    if not isinstance(tok.get("model"), dict) or not isinstance(tok["model"].get("vocab"), dict):
        raise ValueError(f"{tok_file}: not a tokenizers file (no model.vocab)")
    for extra in ("tokenizer_config.json", "special_tokens_map.json"):
        if (run_dir / extra).is_file():
            load_json_file(run_dir / extra)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(run_dir), local_files_only=True)
    except Exception as e:  # the tokenizers library raises bare Exceptions on malformed files
        raise ValueError(f"{tok_file}: cannot be loaded as a WordPiece tokenizer ({type(e).__name__}: {e})") from None
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"{run_dir}: tokenizer has {len(tokenizer)} tokens but config.vocab_size={config.vocab_size}")
    settings_file = run_dir / PRETRAIN_FILE
    settings = load_json_file(settings_file) if settings_file.is_file() else {}
    for derived in ("widen.json", "shrink.json"):  # a widened or shrunk run: its source's data settings
        if not settings and (run_dir / derived).is_file():
            settings = load_json_file(run_dir / derived).get("source_settings") or {}
    return OpenedRun(run_dir, config, tokenizer, weights, settings)


# ------------------------------------------------------------------------- identities
def file_digest(paths, chunk: int = 1 << 20) -> str:
    """SHA-256 over the bytes of ``paths`` (in the order given), each prefixed by its size."""
    h = hashlib.sha256()
    for p in paths:
        p = Path(p)
        h.update(f"{p.stat().st_size}\0".encode())
        with open(p, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    return h.hexdigest()


def model_fingerprint(model_dir: str | os.PathLike) -> str:
    """A hash of a saved model's config, weights and tokenizer files, independent of the folder's name or place:
    what a result computed from it depends on (retrained in place: a new fingerprint)."""
    model_dir = Path(model_dir)
    names = ["config.json", SAFE_WEIGHTS, *PICKLE_WEIGHTS, "tokenizer.json", "vocab.txt"]
    return file_digest([model_dir / n for n in names if (model_dir / n).is_file()])


def tensors_sha256(tensors: dict) -> str:
    """SHA-256 of named tensors (names sorted, each with dtype, shape and bytes); the same on any device."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            continue
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def cpu_name() -> str | None:
    """The CPU's vendor, family and model from ``/proc/cpuinfo``, else :func:`platform.processor`, else None."""
    import platform

    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
        return f"{fields['model name']} ({fields['vendor_id']} family {fields['cpu family']} model {fields['model']})"
    except (OSError, KeyError):
        return platform.processor() or None


def environment_info() -> dict:
    """Software versions and the machine, recorded with every results file."""
    import platform

    import torch
    import transformers

    def version(name):
        try:
            return __import__(name).__version__
        except ImportError:
            return None

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "other_versions": {
            n: version(n) for n in ("tokenizers", "accelerate", "numpy", "scipy", "sklearn", "matplotlib")
        },
        "platform": platform.platform(),
        "cpu": cpu_name(),
        # the instruction set torch's own CPU kernels dispatch to (ATEN_CPU_CAPABILITY overrides it): runs
        # of one command on CPUs of different capability round differently and drift apart over training
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # the GPU the runs trained on (the Trainer uses one when present), None on a CPU-only machine
        "accelerator": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def invocation_commands(command: str | None, previous_meta: dict) -> tuple[str, list[str]]:
    """This invocation's command line and every distinct command of ``previous_meta["commands"]`` before it:
    what the results file of a resumed or shared folder lists."""
    import shlex
    import sys

    this = command or "fixedhead " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    return this, list(dict.fromkeys([*previous_meta.get("commands", []), this]))


def resolve_local_path(value: str | os.PathLike) -> str:
    """An existing local path as an absolute, symlink-free string; anything else (a dataset name) unchanged."""
    p = Path(value).expanduser()
    return str(p.resolve()) if p.exists() else str(value)


# -------------------------------------------------------------------- output folders
def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def results_owner(path: Path) -> str | None:
    """The command a study's results file names as its writer (``meta.study``, else the subcommand of
    ``meta.command``), or None."""
    try:
        meta = json.loads(path.read_text()).get("meta")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(meta, dict):
        return None
    found = re.match(r"fixedhead ([a-z][a-z-]*)(?:\s|$)", str(meta.get("command") or ""))
    return meta.get("study") or (found.group(1) if found else None)


def claim_output_dir(
    output_dir: str | os.PathLike,
    markers: tuple[str, ...],
    owned: tuple[str, ...],
    command: str,
    overwrite: bool = False,
    option: str = "--output-dir",
    create: bool = True,
    results_file: str | None = None,
    exclusive: bool = False,
) -> Path:
    """Take ``output_dir`` for a command's output, or refuse it; never touch what is not ours. Returns the folder.

    ``markers``: files saying the folder holds this command's output (written first); ``owned``: globs of
    every entry it writes; ``overwrite`` removes those first; ``create=False`` only checks; ``results_file``:
    its ``meta.study`` must name ``command``; ``exclusive``: the folder may hold only owned entries.

    Raises:
        FileExistsError: a file, or a non-empty folder without a marker, with another command's results,
            or (``exclusive``) with an entry not owned. Nothing is changed.
    """
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{option} {str(out)!r} is an existing file, not a directory")
    parent = next((p for p in out.absolute().parents if p.exists()), out)  # out: the root, which has none
    if not parent.is_dir():  # a folder below a file can never be created
        raise FileExistsError(f"{option} {str(out)!r} lies below {str(parent)!r}, which is a file")
    if out.is_dir():
        entries = sorted(out.iterdir())
        foreign = [e for e in entries if not _matches(e.name, owned)] if exclusive else []
        if entries and (foreign or not any((out / m).exists() for m in markers)):
            names = [e.name + ("/" if e.is_dir() else "") for e in foreign or entries]
            raise FileExistsError(
                f"{option} {str(out)!r} holds files that `fixedhead {command}` did not create "
                f"({', '.join(names[:5])}{' …' if len(names) > 5 else ''}); choose an empty or new folder "
                f"(nothing was changed)"
            )
        owner = results_owner(out / results_file) if results_file else None
        if owner not in (None, command):
            raise FileExistsError(
                f"{option} {str(out)!r} holds the output of `fixedhead {owner}` ({results_file}), not of "
                f"`fixedhead {command}`; choose an empty or new folder (nothing was changed)"
            )
        if overwrite and create:
            for e in entries:
                if _matches(e.name, owned):
                    shutil.rmtree(e) if e.is_dir() and not e.is_symlink() else e.unlink()
    if create:
        out.mkdir(parents=True, exist_ok=True)
    return out
