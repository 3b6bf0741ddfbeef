"""The paper's questions as resumable commands: one kit and one unit per study.

``kit`` is the skeleton every study stands on (``core``: presets, overrides, the output folder, the
results file, a seed-major plan; ``stats``: differences with intervals and the verdict words;
``render``: tables, "What was run", figures; ``recipes``: named training settings;
``learning_rate``: a rate per arm and its record). Each study is one module or package:
``compare`` (with ``seq_len``, compare across sequence lengths), ``sweep`` (with ``presets``,
``claims``, ``report`` and ``finetune_seeds``), ``farthest_point`` (with ``set_attention`` and
``known_rank``), ``widening`` (widen-experiment, with ``arms`` and ``report``), ``scaling`` (with
``report``), ``bottleneck`` and ``coordcheck``. The kit imports no study and no study imports another;
nothing below the studies imports them (tests/test_layering.py).
"""
