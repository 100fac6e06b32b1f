"""regis indexer: folders of images -> a regis index (``regis index build``).

Public API: ``build_index`` (incremental, atomic) and ``BuildOptions`` / ``BuildReport``.
"""

from indexer.build import BuildOptions, BuildReport, build_index

__all__ = ["BuildOptions", "BuildReport", "build_index"]
