"""Diagnostics of a trained model: what its attention heads use.

* :mod:`~fixedhead.diagnostics.analysis`: each head's logit rank, pattern rank and entropy on text
  (``fixedhead analyze``);
* :mod:`~fixedhead.diagnostics.intervention`: the rank a model needs, its heads' logits cut to rank k and the
  held-out loss against k (``fixedhead rank-intervention``).
"""
