"""regis: multi-vector (late-interaction) image retrieval.

The shared package: the encoder (``regis.models``), MaxSim scoring (``regis.scores``), the on-disk index
format (``regis.indexes``), candidate generation + rerank (``regis.retrieve``) and image decoding
(``regis.images``). Importing ``regis`` is cheap: torch, timm and faiss load only when a submodule that
needs them is imported.
"""

__version__ = "0.1.0"
