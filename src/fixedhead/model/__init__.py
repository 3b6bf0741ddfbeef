"""The transformers model, with no files and no Trainer.

``attention`` (the paper's equation, then the module), ``kernels`` (SDPA policy, the CPU
dropout-attention function), ``tensor_checks`` (tensor checks), ``checks`` (checks of the numbers a
user passes, imported by the rest of fixedhead as :mod:`fixedhead.checks`), ``configuration``,
``modeling`` (the models and their task heads), ``from_bert`` (from transformers' BERT), ``surgery``
(widening heads, function-preserving), ``flops`` (FLOP formulas) and ``paper_presets`` (the paper's
named model sizes). This layer imports nothing of fixedhead outside its folder
(tests/test_layering.py): a saved model carries the modules its modeling code imports, which
transformers copies from one folder only (:meth:`~fixedhead.model.modeling.FixedHeadPreTrainedModel.save_pretrained`).
The public names are re-exported by :mod:`fixedhead` itself.
"""
