"""The paper's questions as resumable commands, on one skeleton (``core``: presets, overrides, the
output folder, the results file, a seed-major plan; ``stats``: mean ± std and verdict rules;
``render``: tables, "What was run", figures; ``recipes``: named training settings;
``learning_rate``: a rate per model). Each study is its plan, its one run, its summary and its
rendering, in one module or split beside it: ``compare``, ``sweep`` (with ``sweep_presets``,
``claims`` and ``report``; ``finetune_seeds``), ``farthest_point`` (with ``set_attention``),
``widening`` (widen-experiment, with ``widening_arms`` and ``widening_report``), ``bottleneck``,
``coordcheck`` and ``scaling`` (with ``scaling_report``). Nothing below the studies imports them
(tests/test_layering.py).
"""
