"""The paper's questions as resumable commands, on one skeleton (``core``: presets, overrides, the
output folder, the results file, a seed-major plan; ``stats``: mean ± std and verdict rules;
``render``: tables, "What was run", figures; ``recipes``: named training settings). One module per
study holds its plan, its one run, its summary and its rendering: ``compare``, ``sweep`` with its
claims ``report``, ``farthest_point`` (with ``set_attention``), ``widening`` (widen-experiment, with
``widening_arms``) and ``bottleneck``. Nothing below the studies imports them (tests/test_layering.py).
"""
