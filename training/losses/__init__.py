"""The multi-vector triplet loss in swappable pieces: a score function, a miner, the margin loss, a reducer.

Import the submodules directly (``training.losses.triplet`` ...); this package imports nothing heavy.
"""
