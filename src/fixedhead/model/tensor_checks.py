"""Input checks that name the bad value (docs/reliability.md), and where they run.

Metadata checks (dimensions, shape, dtype) are free and always run, compiled and exported models included
(evaluated once while tracing). Value checks (a token id outside the vocabulary, a mask other than 0/1, NaN in
``inputs_embeds``, a label out of range) read values on the host: a graph break under ``torch.compile``,
refused by ``torch.export``, baked in by ``torch.jit.trace`` and a sync on a GPU. So they run only in eager
mode on CPU tensors by default (``"auto"``); ``set_value_checks("always")`` adds GPU tensors (eager only),
``"never"`` turns them off.
"""

from __future__ import annotations

import torch
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

_MODES = ("auto", "always", "never")
_mode = "auto"


def set_value_checks(mode: str) -> str:
    """Choose where value checks run: ``"auto"`` (eager, CPU tensors; the default), ``"always"`` (eager, every
    device: one host sync per check on a GPU) or ``"never"``. Returns the previous mode."""
    global _mode
    if mode not in _MODES:
        raise ValueError(f"value-check mode must be one of {_MODES}, got {mode!r}")
    previous, _mode = _mode, mode
    return previous


def tracing() -> bool:
    """True under ``torch.compile``, ``torch.export``, ``torch.jit`` tracing/scripting or ``torch.fx`` tracing."""
    return (
        torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting() or is_fx_symbolic_tracing()
    )


def host_reads_allowed(tensor: torch.Tensor) -> bool:
    """Whether reading ``tensor``'s values on the host is free here (see the module docstring)."""
    if _mode == "never" or tracing():
        return False
    return _mode == "always" or tensor.device.type == "cpu"


def require_tensor(name: str, value) -> torch.Tensor:
    """``value`` itself if it is a tensor. Raises TypeError naming ``name`` and the type otherwise."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_integer(name: str, tensor: torch.Tensor, what: str = "an integer tensor") -> None:
    """Raise ValueError unless ``tensor`` has an integer dtype (bool, float and complex are refused)."""
    require_tensor(name, tensor)
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ValueError(f"{name} must be {what}, got dtype {tensor.dtype}")


def first_out_of_range(tensor: torch.Tensor, low: int, high: int, ignore: int | None = None):
    """Value check: ``(value, index)`` of the first element of an integer ``tensor`` outside ``[low, high)``
    (``ignore`` allowed), or None, also where host reads are not free; the caller raises in its own words."""
    if tensor.numel() == 0 or not host_reads_allowed(tensor):
        return None
    bad = (tensor < low) | (tensor >= high)
    if ignore is not None:
        bad &= tensor != ignore
    if not bool(bad.any()):
        return None
    where = tuple(bad.nonzero()[0].tolist())
    return tensor[where].item(), where


def check_finite(name: str, tensor: torch.Tensor) -> None:
    """Value check: no NaN or ±inf in a float ``tensor``; the message names the first one and its index."""
    if tensor.numel() == 0 or not tensor.is_floating_point() or not host_reads_allowed(tensor):
        return
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        where = tuple((~finite).nonzero()[0].tolist())
        raise ValueError(f"{name} holds non-finite values (first at index {where}: {tensor[where].item()})")


def check_broadcast_ids_shape(name: str, tensor: torch.Tensor, batch: int, seq: int) -> None:
    """Shapes BERT accepts for per-token ids added to [batch, seq, hidden]: [seq], [1, seq], [batch, seq]."""
    shape = tuple(tensor.shape)
    if shape not in ((seq,), (1, seq), (batch, seq)):
        raise ValueError(
            f"{name} must have shape [batch, seq] = {(batch, seq)} (or [1, seq] / [seq] to share one row), got {shape}"
        )


def first_outside_interval(tensor: torch.Tensor, low: float, high: float):
    """Value check: ``(value, index)`` of the first element of ``tensor`` outside the closed ``[low, high]``,
    or None (also where host reads are not free)."""
    if tensor.numel() == 0 or not host_reads_allowed(tensor):
        return None
    bad = (tensor < low) | (tensor > high)
    if not bool(bad.any()):
        return None
    where = tuple(bad.nonzero()[0].tolist())
    return tensor[where].item(), where
