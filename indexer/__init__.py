"""regis indexer: folders of images -> a regis index (``regis index build``), uploads and deletes, and the
indexing worker (``regis worker``).

Public API: ``build_index`` (incremental, atomic) and ``BuildOptions`` / ``BuildReport``; ``add_images`` /
``delete_images`` (uploaded images in, images out by id); ``execute_job`` / ``JobContext`` (one job of
``regis.jobs``, as the worker and the embedded queue run it). Names load on first use, so importing the
package stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from indexer.build import BuildOptions, BuildReport, build_index
    from indexer.jobs import JobContext, execute_job
    from indexer.uploads import NewImage, add_images, delete_images

_EXPORTS = {
    "BuildOptions": "indexer.build", "BuildReport": "indexer.build", "build_index": "indexer.build",
    "JobContext": "indexer.jobs", "execute_job": "indexer.jobs",
    "NewImage": "indexer.uploads", "add_images": "indexer.uploads", "delete_images": "indexer.uploads",
}

__all__ = ["BuildOptions", "BuildReport", "JobContext", "NewImage", "add_images", "build_index", "delete_images",
           "execute_job"]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'indexer' has no attribute {name!r}")
