"""The paper's questions as resumable commands: one kit and one unit per study.

``kit`` is the skeleton every study stands on (``study``: the Study shape and :func:`run_study`;
``core``: the results file, run keys, a seed-major plan; ``stats``: differences with intervals and the
verdict words; ``render``: tables, "What was run", figures; ``recipes``: named training settings;
``learning_rate``: a rate per arm and its record). Each study is one module or package, registered in
:data:`STUDIES`. The kit imports no study and no study imports another; nothing below the studies
imports them (tests/test_layering.py).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

#: every study command: its name -> ``module:Class`` of its :class:`~fixedhead.studies.kit.study.Study`
STUDIES = {
    "compare": "fixedhead.studies.compare:CompareStudy",
    "bottleneck": "fixedhead.studies.bottleneck:BottleneckStudy",
    "known-rank": "fixedhead.studies.farthest_point.known_rank:KnownRankStudy",
    "seq-len": "fixedhead.studies.compare.seq_len:SeqLenStudy",
    "qk-v": "fixedhead.studies.compare.qk_v:QkVStudy",
    "sweep": "fixedhead.studies.sweep:SweepStudy",
    "finetune-sweep": "fixedhead.studies.sweep.finetune_seeds:FinetuneSweepStudy",
    "farthest-point": "fixedhead.studies.farthest_point:FarthestPointStudy",
    "widen-experiment": "fixedhead.studies.widening:WideningStudy",
    "coordcheck": "fixedhead.studies.coordcheck:CoordCheckStudy",
    "scaling": "fixedhead.studies.scaling:ScalingStudy",
}


def study_class(name: str) -> type:
    """The Study class of the command ``name`` (:data:`STUDIES`), imported on first use.

    Raises:
        ValueError: a name :data:`STUDIES` does not register (a study run from its own script).
    """
    if name not in STUDIES:
        raise ValueError(f"no fixedhead command runs the study {name!r}; the registered ones: {', '.join(STUDIES)}")
    module, _, cls = STUDIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def study_help(name: str) -> str:
    """The one-line help of the study ``name`` (its class's ``help``), for a study of this package read from its
    module's source without importing it: ``fixedhead --help`` lists every study without importing torch.

    Raises:
        ValueError: a name :data:`STUDIES` does not register, or a class whose ``help`` is not a string literal.
    """
    if name not in STUDIES:
        raise ValueError(f"no fixedhead command runs the study {name!r}; the registered ones: {', '.join(STUDIES)}")
    module, _, cls = STUDIES[name].partition(":")
    if not module.startswith(f"{__name__}."):  # registered from elsewhere (examples/toy_study.py)
        return study_class(name).help
    where = Path(__file__).parent.joinpath(*module.split(".")[2:])  # not find_spec: it imports the parents
    source = (where / "__init__.py" if where.is_dir() else where.with_suffix(".py")).read_text(encoding="utf-8")
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls).body
    for node in body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["help"]:
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    raise ValueError(f"{STUDIES[name]}: its help is not a string literal in its class body")
