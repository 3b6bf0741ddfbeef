"""What the studies' reports share: the report spec (:class:`Report` of :class:`Section` blocks, :class:`Table`
declared by its columns, :class:`Figure`) and its markdown, the "What was run" lines, the learning-curve plot and
small figure helpers. Each study's own prose and plots stay in its module.
"""

from __future__ import annotations

import csv
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...plotting import pyplot, save_figure


# ------------------------------------------------------------------------------ markdown
def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table: the header row, the rule, one line per row (cells as ``str``)."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


# ------------------------------------------------------------------------------ report specs
@dataclass
class Table:
    """A table: ``columns`` are headers (``rows`` then hold the cells) or ``(header, cell)`` pairs, ``cell`` a
    format string read against each row (a dict: ``"{hit_rate:.3f}"``) or a function of the row."""

    columns: Sequence[str | tuple[str, str | Callable]]
    rows: Iterable

    def lines(self) -> list[str]:
        if all(isinstance(c, str) for c in self.columns):
            return table(list(self.columns), list(self.rows))

        def cell(c, r):
            return c(r) if callable(c) else c.format_map(r)

        return table([h for h, _ in self.columns], [[cell(c, r) for _, c in self.columns] for r in self.rows])


@dataclass
class Section:
    """``## title`` and its blocks: a paragraph (``str``), lines (a list: bullets), a :class:`Table`, a
    :class:`Figure`; a falsy block is left out."""

    title: str
    blocks: Sequence = ()


@dataclass
class Figure:
    file: str
    alt: str


@dataclass
class Report:
    """A study's report: ``# title``, the opening blocks, then the sections (blocks as in :class:`Section`;
    a falsy section is left out)."""

    title: str
    blocks: Sequence = ()
    sections: Sequence[Section | list[str] | None] = ()


def markdown(report: Report) -> str:
    """The report as markdown: each block followed by one blank line."""
    lines = [f"# {report.title}", "", *_blocks(report.blocks)]
    for s in filter(None, report.sections):  # a list: a section rendered already (lines ending in "")
        lines += s if isinstance(s, list) else [f"## {s.title}", "", *_blocks(s.blocks)]
    return "\n".join(lines)


def _blocks(blocks) -> list[str]:
    out = []
    for b in filter(None, blocks):
        if isinstance(b, Table):
            out += b.lines()
        elif isinstance(b, Figure):
            out.append(f"![{b.alt}]({b.file})")
        elif isinstance(b, str):
            out.append(b)
        else:
            out += b
        out.append("")
    return out


def what_was_run(meta: dict, lines: Sequence[str] = (), *blocks, several: str = "", **wall) -> Section:
    """The "What was run" section: the commands, wall time and software lines (:func:`commands_line`,
    :func:`wall_time_line`, :func:`software_line`), then ``lines`` (the study's own bullets) and ``blocks``."""
    run = [commands_line(meta, several), wall_time_line(meta, **wall), software_line(meta)]
    return Section("What was run", [[*run, *lines], *blocks])


def commands_line(meta: dict, several: str = "") -> str:
    """``- command(s): `...` `` from ``meta.commands`` (``several`` explains why there are several)."""
    commands = meta.get("commands") or [meta["command"]]
    return f"- command{'s' + several if len(commands) > 1 else ''}: " + ", ".join(f"`{c}`" for c in commands)


def wall_time_line(meta: dict, work: str = "training", on: str = "", per_process: str = "") -> str:
    """``- wall time: ...`` while invocations ran, the runs' own ``work`` time, cores, kernels and torch threads,
    and the accelerator where one trained. A results file without ``meta.active`` reads "from the first start to
    the last result", as its wall time was measured."""
    compute = meta.get("compute_seconds")
    accelerator = f"{meta['accelerator']} and " if on and meta.get("accelerator") else ""
    span = (
        f" while an invocation ran ({len(meta['active'])} span{'s' if len(meta['active']) > 1 else ''}, "
        "workers side by side counted once)"
        if meta.get("active")
        else " from the first start to the last result"
    )
    return (
        f"- wall time: {meta['total_seconds'] / 60:.1f} min{span}"
        + (f"; the runs' own {work} time sums to {compute / 60:.1f} min" if compute is not None else "")
        + f"; {on}{accelerator}{meta.get('cpu_count')} CPU cores "
        f"({cpu_text(meta)}{meta.get('platform', '')}), torch threads "
        f"{meta.get('torch_threads')}{per_process}"
    )


def cpu_text(meta: dict) -> str:
    """``"CPU, torch kernels CAPABILITY; "`` where ``meta`` records them, else empty."""
    kernels = f", torch kernels {meta['cpu_capability']}" if meta.get("cpu_capability") else ""
    return f"{meta['cpu']}{kernels}; " if meta.get("cpu") else ""


def software_line(meta: dict) -> str:
    """``- software: Python ..., torch ..., transformers ...`` and the other recorded versions."""
    return f"- software: Python {meta['python']}, torch {meta['torch']}, transformers {meta['transformers']}" + "".join(
        f", {k} {v}" for k, v in (meta.get("other_versions") or {}).items() if v
    )


def write_csv(path: Path, keys: list[str], rows: list[dict]) -> None:
    """``keys`` as the header, then each row's values for them (a missing value: an empty cell)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        w.writerows([r.get(k) for k in keys] for r in rows)


# ------------------------------------------------------------------------------- figures
def plain_ticks(ax, xs) -> None:
    """Ticks at exactly ``xs``, labelled as plain numbers (log axes otherwise print powers)."""
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.minorticks_off()


def plot_learning_curves(results: list[dict], path: Path, title: str = "") -> None:
    """Training loss and held-out loss against training tokens, one colour per language-model run
    (each a :func:`fixedhead.training.pretrain` result with its curves)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for r in results:
        tokens_per_step = r["tokens_per_step"]
        label = (
            f"{r['name']} (d={r['hidden_size']}, h={r['num_attention_heads']}, d_p={r['head_dim']}, "
            f"{r['parameters'] / 1e6:.2f}M)"
        )
        for ax, curve in ((axes[0], r["train_curve"]), (axes[1], r["eval_curve"])):
            if curve:
                steps, losses = zip(*curve, strict=True)
                ax.plot(
                    [s * tokens_per_step / 1e6 for s in steps],
                    losses,
                    marker="." if ax is axes[1] else None,
                    label=label,
                )
    causal = any(r.get("objective") == "clm" for r in results)
    what = "causal-LM loss per token" if causal else "MLM loss"
    axes[0].set_title(f"training {what}")
    axes[1].set_title(f"held-out {what}" + ("" if causal else " (fixed masking)"))
    for ax in axes:
        ax.set_xlabel("training tokens (millions)")
    axes[0].set_ylabel("cross-entropy (nats)")
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 140)), fontsize=9)
    axes[0].grid(alpha=0.3)
    save_figure(fig, path, [axes[1]])  # one legend, on the held-out panel
