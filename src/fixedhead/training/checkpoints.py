"""Safe checkpoints: atomic writes, truncation checks, and loading that never runs what it loads.

The Trainer writes ``checkpoint-STEP`` in place, so a kill while saving leaves a partial newest checkpoint
that resume would pick. Here each is staged and renamed into place when complete
(:func:`atomic_checkpoint_trainer`), and resume skips an incomplete one with a warning
(:func:`find_resume_checkpoint`). Nothing calls ``torch.load``.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path

from ..runs import SAFE_WEIGHTS, check_safetensors, follow_umask, load_json_file

FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""the errors of a write that found the disk or a file-size limit full"""

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")  # Trainer's own pattern (trainer_utils._re_checkpoint)
STAGING_PREFIX = ".staging-checkpoint-"
#: files Trainer writes with torch.save (zip archives); each must be a complete archive
TORCH_SAVED = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


class CheckpointWarning(UserWarning):
    """A checkpoint was found incomplete or corrupt and skipped."""


def check_checkpoint(checkpoint: str | os.PathLike) -> None:
    """Check that a Trainer checkpoint folder can be resumed from: ``trainer_state.json`` (written last) parses,
    ``model.safetensors`` is whole, and each of ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth`` present is a
    complete zip. Raises ValueError saying what is missing or damaged."""
    checkpoint = Path(checkpoint)
    state = checkpoint / "trainer_state.json"
    if not state.is_file():
        raise ValueError(f"{checkpoint}: no trainer_state.json (the checkpoint was not finished)")
    load_json_file(state)
    try:
        check_safetensors(checkpoint / SAFE_WEIGHTS)
    except FileNotFoundError:
        raise ValueError(f"{checkpoint}: no {SAFE_WEIGHTS}") from None
    for name in TORCH_SAVED:
        p = checkpoint / name
        if p.exists() and not zipfile.is_zipfile(p):
            raise ValueError(f"{p} is truncated or corrupt (not a complete torch.save archive)")


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """``checkpoint-STEP`` directories in ``run_dir``, oldest (lowest step) first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def find_resume_checkpoint(run_dir: str | os.PathLike) -> str | None:
    """The newest complete checkpoint in ``run_dir``, or None; newer incomplete ones are skipped with a
    :class:`CheckpointWarning` and left for the next save at that step to replace."""
    for checkpoint in reversed(list_checkpoints(run_dir)):
        try:
            check_checkpoint(checkpoint)
            return str(checkpoint)
        except ValueError as e:
            warnings.warn(f"skipping incomplete checkpoint {checkpoint.name}: {e}", CheckpointWarning, stacklevel=2)
    return None


def remove_staging(run_dir: str | os.PathLike) -> None:
    """Delete staging directories left by a run killed while saving a checkpoint."""
    run_dir = Path(run_dir)
    if run_dir.is_dir():
        for p in run_dir.iterdir():
            if p.name.startswith(STAGING_PREFIX) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    """fsync every file under ``root`` and give it the umask's permissions (safetensors writes 0600)."""
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            follow_umask(p)


def apply_learning_rate_multipliers(optimizer, model) -> None:
    """Give the parameters the parametrization lists (μP's output projections) their own parameter groups at
    ``lr × factor`` before the first step; the scheduler scales every group alike."""
    from ..model.parametrization import learning_rate_multipliers

    multipliers = learning_rate_multipliers(model)
    factors = {id(p): multipliers[n] for n, p in model.named_parameters() if n in multipliers}
    if not factors:
        return
    groups = []
    for group in optimizer.param_groups:
        by_factor: dict[float, list] = {}
        for p in group["params"]:
            by_factor.setdefault(factors.get(id(p), 1.0), []).append(p)
        groups += [{**group, "params": ps, "lr": group["lr"] * f} for f, ps in sorted(by_factor.items(), reverse=True)]
    optimizer.param_groups = groups


@functools.cache
def parametrized_trainer():
    """A ``Trainer`` subclass applying :func:`apply_learning_rate_multipliers` (Trainer itself under the standard
    parametrization)."""
    from transformers import Trainer

    class ParametrizedTrainer(Trainer):
        def create_optimizer(self, model=None):
            optimizer = super().create_optimizer(model)
            apply_learning_rate_multipliers(optimizer, self.model if model is None else model)
            return optimizer

    return ParametrizedTrainer


@functools.cache
def atomic_checkpoint_trainer():
    """A ``Trainer`` subclass whose checkpoints appear atomically.

    Each checkpoint is written into ``RUN_DIR/.staging-checkpoint-*/``, fsynced and renamed to
    ``checkpoint-STEP`` (one ``os.replace``), then old ones are rotated as Trainer would: a kill leaves the old
    set or the new one, plus at most a staging folder. With several processes Trainer's own save is kept and
    only the check at resume protects.
    """
    from transformers.trainer_utils import rotate_checkpoints

    class AtomicCheckpointTrainer(parametrized_trainer()):
        _staging_dir: str | None = None

        def _get_output_dir(self, trial):
            return self._staging_dir if self._staging_dir is not None else super()._get_output_dir(trial)

        def _save_checkpoint(self, model, trial):
            if self.args.world_size > 1:
                # several processes write into one checkpoint (per-rank RNG states, sharded
                # optimizers): keep Trainer's in-place save; resume still checks completeness
                return super()._save_checkpoint(model, trial)
            run_dir = super()._get_output_dir(trial)
            name = f"checkpoint-{self.state.global_step}"
            os.makedirs(run_dir, exist_ok=True)
            self._staging_dir = tempfile.mkdtemp(dir=run_dir, prefix=STAGING_PREFIX)
            try:
                super()._save_checkpoint(model, trial)
            except (RuntimeError, OSError) as e:  # torch's zip writer reports a full disk or a file-size limit
                # as a RuntimeError; the modeling code's copy and the other files as an OSError
                if (e.errno not in FULL_DISK) if isinstance(e, OSError) else ("write" not in str(e).lower()):
                    raise
                shutil.rmtree(self._staging_dir, ignore_errors=True)
                first = (e.strerror if isinstance(e, OSError) else str(e)).strip().splitlines()[0]
                raise OSError(
                    f"could not write {name} into {run_dir} ({first}): is the disk full or a file-size limit "
                    f"reached? The earlier checkpoints are intact; free space and resume with --resume"
                ) from None
            finally:
                staging, self._staging_dir = self._staging_dir, None
            _fsync_tree(Path(staging))
            final = os.path.join(run_dir, name)
            if os.path.isdir(final):  # an incomplete copy that resume skipped; the new one replaces it
                shutil.rmtree(final)
            os.replace(os.path.join(staging, name), final)
            shutil.rmtree(staging, ignore_errors=True)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )

    return AtomicCheckpointTrainer
