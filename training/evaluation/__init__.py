"""Retrieval evaluation: Recall@K, mAP@R, R-precision (METHODS.md section 3), single- and multi-vector.

Import the submodules directly; this package imports nothing heavy.
"""
