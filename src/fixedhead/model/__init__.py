"""The transformers model, with no files and no Trainer.

Imports nothing of fixedhead outside this folder (tests/test_layering.py): a saved model carries the modules
its modeling code imports, which transformers copies from one folder only. The public names are re-exported
by :mod:`fixedhead`.
"""
