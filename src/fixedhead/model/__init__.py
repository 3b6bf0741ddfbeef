"""The transformers model, with no files and no Trainer.

``attention`` (the paper's equation, then the module), ``kernels`` (SDPA policy, the CPU
dropout-attention function), ``checks`` (tensor checks), ``configuration``, ``modeling`` (the
models and their task heads), ``from_bert`` (from transformers' BERT), ``surgery`` (widening
heads, function-preserving), ``flops`` (FLOP formulas) and ``paper_presets`` (the paper's named
model sizes). Of the rest of fixedhead this layer imports only :mod:`fixedhead.checks`
(tests/test_layering.py); the public names are re-exported by :mod:`fixedhead` itself.
"""
