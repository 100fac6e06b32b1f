"""Training and evaluation data: labelled image sets, the benchmark layouts, and batch samplers.

Import the submodules directly (``training.data.images``, ``training.data.registry``, ...); this package
imports nothing heavy.
"""
