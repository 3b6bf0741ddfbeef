"""The package's folders are its layers: each imports only the layers above it, and no import cycles.

Every module's imports are read with ``ast`` (function-level and ``TYPE_CHECKING`` imports
included), so the test needs no import to succeed and sees the imports a run may never reach. The
order, top to bottom:

    theory       the paper's mathematics (imports nothing of fixedhead at all)
    model        the transformers model: no files, no Trainer, nothing of fixedhead outside its
                 folder (a saved run carries the modules its modeling code imports as its remote code,
                 and transformers copies relative imports within one folder only)
    checks       checks of numbers a user passes (defined in the model folder, which uses them)
    fixedhead    the package itself (its __init__: the public API, names from model)
    runs         run folders: claim an output folder, open a saved run, atomic writes
    data         text to batches (uses run-folder helpers: cache files, the recorded tokenizer)
    training     transformers' Trainer on run folders
    plotting     matplotlib set-up shared by every figure (used by diagnostics and studies, so it is
                 part of neither)
    diagnostics  what a trained model's heads use: head-rank diagnostics of a checkpoint (analysis), the
                 rank it needs: its heads' logits cut to rank k, held-out loss against k (intervention)
    shrink       a run whose queries and keys are cut to size K (the intervention's realisable cut as weights)
    studies      the paper's questions as resumable commands (the scaling study reads its trained
                 runs' ranks with analysis)
    options      command-line options derived from the settings dataclasses
    cli          the ``fixedhead`` command (and ``python -m fixedhead``)

A module may import its own layer (within a folder) and the layers above it, never one below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fixedhead

SRC = Path(fixedhead.__file__).resolve().parent  # src/fixedhead

LAYERS = [
    "_lazy",  # the packages' names imported on first use; imports nothing of the package
    "theory",
    "model",
    "checks",
    "fixedhead",
    "runs",
    "data",
    "training",
    "plotting",
    "diagnostics",
    "shrink",
    "studies",
    "options",
    "cli",
]
RANK = {layer: i for i, layer in enumerate(LAYERS)}
RANK["__main__"] = RANK["cli"]  # `python -m fixedhead` is the command


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its __init__)."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = ("fixedhead",) + path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The fixedhead modules ``name`` imports: ``from X import y`` counts as X.y where that is a
    module (a submodule imported by name), else as X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "fixedhead")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "fixedhead":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "fixedhead"


def test_every_module_is_in_a_known_layer_and_every_import_resolves():
    assert {layer(m) for m in MODULES} <= set(RANK), sorted({layer(m) for m in MODULES} - set(RANK))
    unresolved = {(m, t) for m, targets in GRAPH.items() for t in targets if t not in MODULES}
    assert not unresolved, sorted(unresolved)


def test_no_module_imports_a_layer_below_it():
    upward = sorted(
        f"{m} ({layer(m)}) imports {t} ({layer(t)})"
        for m, targets in GRAPH.items()
        for t in targets
        if RANK[layer(t)] > RANK[layer(m)]
    )
    assert not upward, "\n".join(upward)


def test_theory_imports_nothing_of_fixedhead():
    outside = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if layer(m) == "theory"
        for t in targets
        if layer(t) != "theory"
    )
    assert not outside, "\n".join(outside)


def test_model_imports_nothing_outside_its_folder():
    """``save_pretrained`` writes the modeling code beside the weights with transformers'
    ``custom_object_save``, which follows relative imports within one folder only: an import of
    another layer would be missing from a saved run (tests/test_remote_code.py loads one)."""
    outside = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if layer(m) == "model"
        for t in targets
        if layer(t) != "model"
    )
    assert not outside, "\n".join(outside)


def test_no_import_cycle_between_modules():
    """Tarjan's strongly connected components: every component must be a single module that does
    not import itself."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in GRAPH.get(v, ()):
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def _study_unit(name: str) -> str | None:
    """The study unit of a module under studies/ (``kit``, ``compare``, ``sweep``, ...), else None."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "studies" else None


def test_studies_are_one_kit_and_units_that_do_not_import_each_other():
    """studies/ is the kit (``studies.kit``: the skeleton every study stands on) and one module or
    package per study: the kit imports no study, and no study imports another (what two studies share
    belongs in the kit)."""
    crossing = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if _study_unit(m)
        for t in targets
        if _study_unit(t) and _study_unit(t) not in (_study_unit(m), "kit")
    )
    assert not crossing, "\n".join(crossing)
    assert {_study_unit(m) for m in MODULES} - {None} >= {"kit", "compare", "sweep", "widening", "scaling"}


def test_the_checker_sees_a_cycle_and_an_upward_import():
    """The checks above would pass on an empty graph; this one shows they read real imports."""
    assert "fixedhead.model.modeling" in GRAPH["fixedhead.model.from_bert"]
    assert "fixedhead.model.attention" in GRAPH["fixedhead.model.modeling"]
    assert "fixedhead.runs" in GRAPH["fixedhead.training.widen"]
    assert "fixedhead.studies.sweep" in GRAPH["fixedhead.cli"]  # a function-level import
    assert "fixedhead.studies.kit.core" in GRAPH["fixedhead.studies.compare.seq_len"]  # ..kit from a subpackage
