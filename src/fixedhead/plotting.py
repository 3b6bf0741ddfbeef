"""matplotlib set-up shared by every figure: the off-screen Agg backend and one way to finish a figure."""

from __future__ import annotations

import io
import os
from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` with the off-screen Agg backend selected."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, axes=(), legend: bool = True, grid: bool = True, dpi: int = 120) -> Path:
    """Grid and legend (where something is labelled) on ``axes``, tight layout, the PNG written to ``path``
    atomically, the figure closed (long sweeps do not leak); returns the path."""
    for ax in axes:
        if grid:
            ax.grid(alpha=0.3)
        if legend and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from .runs import write_bytes_atomic

    image = io.BytesIO()
    fig.savefig(image, format=path.suffix.lstrip(".") or "png", dpi=dpi)
    write_bytes_atomic(path, image.getvalue())
    pyplot().close(fig)
    return path
