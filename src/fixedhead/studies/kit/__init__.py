"""The study kit: what every study under :mod:`fixedhead.studies` stands on, and nothing study-specific.

``core`` (presets, the results file written atomically with its command and versions, run keys, a
seed-major plan), ``study`` (the Study shape and its driver: the output-folder claim, plan, resume, record),
``executor`` (points in this process or as Ray tasks), ``stats``
(mean ± std, paired and unpaired differences with 95% intervals, Holm, the verdict words),
``render`` (markdown tables, "What was run", figures), ``recipes`` (named data + training settings)
and ``learning_rate`` (each arm's own rate chosen on a validation split, and its record).
"""
