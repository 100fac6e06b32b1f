"""The training engine: optimiser and schedule, checkpoints, the metrics log, and the loop.

Import the submodules directly; this package imports nothing heavy.
"""
