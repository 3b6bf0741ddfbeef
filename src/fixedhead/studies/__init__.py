"""The paper's questions as resumable commands, one module per study: ``compare``, ``sweep`` and its
claims ``report``, ``farthest_point`` (the synthetic task), ``widening`` (widen-experiment) and
``bottleneck`` (the theory's bottleneck curve). Studies use the training, data and model layers and
run folders; nothing below them imports a study (tests/test_layering.py).
"""
