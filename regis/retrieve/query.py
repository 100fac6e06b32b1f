"""Query-by-image: bytes -> decoded image -> query tokens -> ranked images with their table rows.

``QueryEngine`` is what ``regis search`` and the service use. It holds the encoder and one searcher over the
live index snapshot; ``swap`` replaces the snapshot atomically (a query in flight finishes on the one it
started with).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from regis.images.decode import DEFAULT_MAX_PIXELS, decode_image
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.weights_copy import stored_weights
from regis.models.encoder import RegisEncoder, check_encoder_matches, encoder_from_manifest
from regis.models.inference import check_onnx_threads, check_query_runtime, inference_copy
from regis.models.inference import query_runtime as default_query_runtime
from regis.models.transforms import eval_transform
from regis.retrieve.answers import SnapshotSearch, _page, result_json  # noqa: F401  (re-exported)
from regis.retrieve.searcher import Searcher


class QueryEngine(SnapshotSearch):
    """Encoder + searcher over one index snapshot (the searching itself: ``SnapshotSearch``).

    Args:
        encoder: the encoder the index was built with (checked).
        snapshot: the index version to search.
        device: torch device for encoding and rerank.
        max_pixels: decompression-bomb limit for query images, pixels.
        fast_encode: encode queries with ``regis.models.inference.inference_copy`` (CNNs on CPU: the folded
            torch copy or ONNX Runtime; less CPU per query, same tokens to float32 rounding).
        query_runtime: the copy's runtime, this engine's own ("auto", "onnx", "torch"; None:
            ``REGIS_QUERY_RUNTIME``, read now).
        query_threads: intra-op threads of the ONNX Runtime copy's sessions (None: the encoding thread's torch
            threads).

    Raises:
        IndexMismatchError: the encoder is not the index's.
        ConfigError: an unknown query runtime (also in ``REGIS_QUERY_RUNTIME``), or query threads < 1.
    """

    def __init__(self, encoder: RegisEncoder, snapshot: IndexSnapshot, device: str = "cpu",
                 max_pixels: int = DEFAULT_MAX_PIXELS, fast_encode: bool = True, query_runtime: str | None = None,
                 query_threads: int | None = None):
        check_encoder_matches(encoder, snapshot.manifest.encoder, snapshot.manifest.weights)
        self.encoder = encoder
        self.fast_encode = fast_encode
        self._set_query_runtime(query_runtime, query_threads)
        self.device = device
        self.max_pixels = max_pixels
        self.transform = eval_transform(encoder.config)
        self.searcher = Searcher(snapshot, device=device)

    @classmethod
    def open(cls, index_dir: Path | str, weights: str | None = None, device: str = "cpu",
             max_pixels: int = DEFAULT_MAX_PIXELS, query_runtime: str | None = None,
             query_threads: int | None = None, fast_encode: bool = True) -> QueryEngine:
        """Open the live version of ``index_dir`` with the encoder its manifest names.

        Args:
            index_dir: index directory.
            weights: weights path overriding the manifest's ``file:`` source (must have the same checksum).
            device: torch device.
            max_pixels: decompression-bomb limit, pixels.
            query_runtime, query_threads, fast_encode: as the constructor's (a single query, ``regis search``:
                fast_encode=False, as making and checking the inference copy costs more than it saves).

        Raises:
            IndexFormatError: no readable index.
            IndexMismatchError / WeightsError: the index's encoder cannot be rebuilt identically.
            ConfigError: as the constructor.
        """
        snapshot = IndexSnapshot.open(index_dir)
        try:
            stored = stored_weights(index_dir, snapshot.manifest.weights)
            encoder = encoder_from_manifest(snapshot.manifest.encoder, snapshot.manifest.weights, weights, device,
                                            stored=str(stored) if stored else None)
            return cls(encoder, snapshot, device, max_pixels, fast_encode=fast_encode, query_runtime=query_runtime,
                       query_threads=query_threads)
        except BaseException:
            snapshot.close()
            raise

    # subclasses that do not call __init__ get the defaults (ShardedQueryEngine calls _set_query_runtime)
    fast_encode = True
    query_runtime: str | None = None
    query_threads: int | None = None

    def _set_query_runtime(self, runtime: str | None = None, threads: int | None = None) -> None:
        """This engine's query runtime and ONNX Runtime threads (the constructor's ``query_runtime`` and
        ``query_threads``; None: ``REGIS_QUERY_RUNTIME``, read now, and the encoding thread's torch threads).

        Raises:
            ConfigError: an unknown runtime (also in ``REGIS_QUERY_RUNTIME``), or threads < 1.
        """
        self.query_runtime = check_query_runtime(runtime) or default_query_runtime()
        self.query_threads = check_onnx_threads(threads)

    @property
    def query_encoder(self):
        """The encoder queries are encoded with: ``inference_copy(self.encoder, self.query_runtime,
        self.query_threads)`` (made once per encoder, runtime and threads) when ``fast_encode``, else the
        encoder itself."""
        if not self.fast_encode:
            return self.encoder
        return inference_copy(self.encoder, self.query_runtime, self.query_threads)

    def swap(self, snapshot: IndexSnapshot) -> IndexSnapshot:
        """Serve ``snapshot`` from now on; returns the previous one (the caller closes it when idle).

        Raises:
            IndexMismatchError: the new version was built with another encoder.
        """
        check_encoder_matches(self.encoder, snapshot.manifest.encoder, snapshot.manifest.weights)
        old = self.searcher.snapshot
        self.searcher = Searcher(snapshot, device=self.device)
        return old

    def decode_bytes(self, data: bytes) -> tuple[torch.Tensor, float]:
        """Decode a query image and apply the encoder's eval transform.

        Returns:
            (3, H, W) float32 pixels and the decode + transform time (ms).

        Raises:
            ImageDecodeError: not a decodable image (see ``regis.images.decode``).
        """
        t0 = time.perf_counter()
        decoded = decode_image(data, max_pixels=self.max_pixels, draft_size=self.encoder.config.resize_size)
        pixels = self.transform(decoded.image)
        return pixels, (time.perf_counter() - t0) * 1e3

    def encode_pixels(self, pixels: torch.Tensor) -> np.ndarray:
        """Encode a batch of transformed query images in one forward pass.

        Args:
            pixels: (B, 3, H, W) float32, as ``decode_bytes`` returns them stacked.

        Returns:
            (B, m, D) float32 unit-norm query tokens (``RegisEncoder.encode_query``: m =
            ``EncoderConfig.query_tokens_per_image``, the index's T tokens per image or more).
        """
        return self.query_encoder.encode_query(pixels).float().cpu().numpy()

    def encode_bytes(self, data: bytes) -> tuple[np.ndarray, dict[str, float]]:
        """Decode and encode a query image.

        Returns:
            (m, D) float32 unit-norm query tokens (``encode_pixels``) and {"decode": ms, "encode": ms}.

        Raises:
            ImageDecodeError: not a decodable image (see ``regis.images.decode``).
        """
        pixels, decode_ms = self.decode_bytes(data)
        t1 = time.perf_counter()
        tokens = self.query_encoder.encode_query(pixels[None])[0].float().cpu().numpy()
        t2 = time.perf_counter()
        return tokens, {"decode": decode_ms, "encode": (t2 - t1) * 1e3}

def set_torch_threads(n: int | None) -> None:
    """Limit torch's intra-op threads (None leaves the default)."""
    if n:
        torch.set_num_threads(int(n))
