"""A query engine that imports neither torch nor timm: ``regis search``'s path when the index's encoder has a
query bundle on disk (``regis.models.query_bundle``), and for a search by an indexed image's id (no encoder).

Same answers as ``QueryEngine`` (``SnapshotSearch`` does the searching; the rerank runs in numpy,
``Searcher(device=None)``); the query tokens equal the torch encoder's to float32 rounding
(tests/test_query_bundle.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from regis.errors import ConfigError
from regis.images.decode import DEFAULT_MAX_PIXELS, decode_image
from regis.indexes.snapshot import IndexSnapshot
from regis.models.np_transforms import eval_pixels
from regis.models.query_bundle import OnnxQueryEncoder, load_bundle
from regis.retrieve.answers import SnapshotSearch
from regis.retrieve.searcher import Searcher


class LightQueryEngine(SnapshotSearch):
    """Searcher over one snapshot, with the torch-free query encoder (or none: search by id only).

    Args:
        snapshot: the index version to search.
        encoder: the index encoder's ``OnnxQueryEncoder`` (its config must be the manifest's), or None.
        max_pixels: decompression-bomb limit for query images, pixels.

    Raises:
        ConfigError: the encoder's config is not the index's.
    """

    def __init__(self, snapshot: IndexSnapshot, encoder: OnnxQueryEncoder | None,
                 max_pixels: int = DEFAULT_MAX_PIXELS):
        if encoder is not None and encoder.config != snapshot.manifest.encoder:
            raise ConfigError("the query encoder's config is not the index's")
        self.encoder = encoder
        self.max_pixels = max_pixels
        self.searcher = Searcher(snapshot, device=None)

    @classmethod
    def open(cls, index_dir: Path | str, need_encoder: bool = True, root: Path | None = None
             ) -> LightQueryEngine | None:
        """The live version of ``index_dir`` with its encoder's bundle (``load_bundle``; ``root``: the bundles'
        folder, default ``query_bundle.cache_root()``).

        Returns:
            The engine, or None when ``need_encoder`` and the encoder has no usable bundle (the snapshot is
            closed again).

        Raises:
            IndexFormatError: no readable index.
        """
        snapshot = IndexSnapshot.open(index_dir)
        try:
            manifest = snapshot.manifest
            encoder = load_bundle(manifest.encoder, manifest.weights, root) if need_encoder else None
            if need_encoder and encoder is None:
                snapshot.close()
                return None
            return cls(snapshot, encoder)
        except BaseException:
            snapshot.close()
            raise

    def encode_bytes(self, data: bytes) -> tuple[np.ndarray, dict[str, float]]:
        """Decode and encode a query image.

        Returns:
            (m, D) float32 unit-norm query tokens and {"decode": ms (decode and transform), "encode": ms}.

        Raises:
            ImageDecodeError: not a decodable image (see ``regis.images.decode``).
            ConfigError: the engine was opened without an encoder.
        """
        if self.encoder is None:
            raise ConfigError("this engine has no query encoder: search by id")
        config = self.encoder.config
        t0 = time.perf_counter()
        decoded = decode_image(data, max_pixels=self.max_pixels, draft_size=config.resize_size)
        pixels = eval_pixels(decoded.image, config)
        t1 = time.perf_counter()
        tokens = self.encoder.encode_query(pixels[None])[0]
        t2 = time.perf_counter()
        return tokens, {"decode": (t1 - t0) * 1e3, "encode": (t2 - t1) * 1e3}
