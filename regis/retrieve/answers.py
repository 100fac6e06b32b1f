"""Searching one index snapshot and answering in JSON, whatever encodes the query: ``SnapshotSearch`` is the
part of a query engine that needs no encoder model (search by tokens, by an indexed image's id, paging, filters,
explanations). ``regis.retrieve.query.QueryEngine`` adds the torch encoder, ``regis.retrieve.light.LightQueryEngine``
the torch-free one of ``regis search``; this module imports no torch.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from regis.errors import ConfigError, ImageDecodeError
from regis.indexes.snapshot import IndexSnapshot
from regis.retrieve.searcher import MAX_K, Mode, Searcher
from regis.scores.framings import perfect_score


class SnapshotSearch:
    """Search over the snapshot ``self.searcher`` holds; subclasses set ``searcher`` and define ``encode_bytes``
    (image bytes -> (m, D) float32 tokens and {"decode": ms, "encode": ms})."""

    searcher: Searcher

    @property
    def snapshot(self) -> IndexSnapshot:
        """The snapshot queries run on now."""
        return self.searcher.snapshot

    def encode_bytes(self, data: bytes) -> tuple[np.ndarray, dict[str, float]]:
        """Decode and encode a query image (subclasses).

        Raises:
            NotImplementedError: always, here.
        """
        raise NotImplementedError

    def search_tokens(self, tokens: np.ndarray, k: int = 10, depth: int | None = None, mode: Mode = "ann",
                      nprobe: int | None = None, candidates: str | None = None, where: dict | None = None,
                      offset: int = 0, score_threshold: float | None = None) -> dict:
        """Search with precomputed query tokens (m, D); returns the JSON-ready result (see ``search_bytes``).

        ``depth`` None uses the index manifest's default candidate depth; the result reports the depth used.
        ``candidates`` None uses the manifest's candidate method ("bounded" or "depth").
        ``where``: a metadata filter (``regis.indexes.filters``; ``regis.retrieve.filtered``); ``offset``: skip the
        best ``offset`` results (paging: ranks stay global); ``score_threshold``: drop results scoring below it.

        Raises:
            UnknownFieldError: ``where`` reads a metadata field no image has (and does not say "strict": false).
            ConfigError: bad parameters or filter.
        """
        searcher = self.searcher  # one snapshot for the whole query, even if a swap happens meanwhile
        want = k + offset
        if want > MAX_K:
            raise ConfigError(f"k + offset must be <= {MAX_K}, got {want}")
        if where:
            from regis.indexes.filters import check_fields
            from regis.retrieve.filtered import allowed_ids, search_filtered

            check_fields(searcher.snapshot.table, where)  # a field no image has: an error, unless "strict": false
            allowed = allowed_ids(searcher.snapshot, where)
            result = search_filtered(searcher, tokens, allowed, k=want, depth=depth, mode=mode, nprobe=nprobe,
                                     candidates=candidates)
        else:
            result = searcher.search(tokens, k=want, depth=depth, mode=mode, nprobe=nprobe, candidates=candidates)
        out = self._result_json(searcher, result, k, depth, mode, len(tokens))
        return _page(out, offset, score_threshold)

    def search_tokens_batch(self, tokens: np.ndarray, k: int = 10, depth: int | None = None, mode: Mode = "ann",
                            nprobe: int | None = None, candidates: str | None = None, threads: int | None = None,
                            **extra) -> list[dict]:
        """``search_tokens`` of B queries with the same parameters; ANN mode goes through the batched search
        path (``Searcher.search_batch``: one FAISS call for every query's tokens), exact mode query by query.

        Args:
            tokens: (B, T, D) float32 unit-norm query tokens.
            threads: FAISS threads of the batched search (None: the searcher's ``batch_threads``).

        Returns:
            B JSON-ready results, as ``search_tokens`` (candidate and rerank timings are the batch's, divided
            evenly).

        Raises:
            ConfigError: bad shapes or parameters.
        """
        searcher = self.searcher
        if extra.get("where") or extra.get("offset") or extra.get("score_threshold") is not None:
            return [self.search_tokens(q, k=k, depth=depth, mode=mode, nprobe=nprobe, candidates=candidates, **extra)
                    for q in tokens]
        if mode == "ann":
            results = searcher.search_batch(tokens, k=k, depth=depth, nprobe=nprobe, candidates=candidates,
                                             threads=threads)
        else:
            results = [searcher.search(q, k=k, depth=depth, mode=mode, nprobe=nprobe) for q in tokens]
        return [self._result_json(searcher, r, k, depth, mode, len(q)) for r, q in zip(results, tokens, strict=True)]

    @staticmethod
    def _result_json(searcher: Searcher, result, k: int, depth: int | None, mode: Mode, m: int) -> dict:
        records = searcher.snapshot.table.get_many(result.ids.tolist())
        return result_json(result, records, searcher.snapshot.version, k, depth or searcher.default_depth, mode,
                           perfect_score(m, searcher.framings))

    def search_id(self, image_id: int, **params) -> dict:
        """"More like this": ``search_tokens`` with the stored tokens of an indexed image (its float16 tokens, so
        scores match a search by the image's bytes to float16 rounding when the query layout is the index's
        tokens; with "tokens+roi-cues" (``EncoderConfig.query_layout``) an upload gets R + 1 tokens more, which
        the index does not store: this searches with the T stored ones).

        Raises:
            KeyError: no live image ``image_id`` in the snapshot served now.
        """
        searcher = self.searcher
        ids = np.array([int(image_id)], dtype=np.int64)
        if not (0 <= image_id < 2**62) or not searcher.snapshot.store.is_live(ids)[0]:
            raise KeyError(image_id)
        tokens = searcher.snapshot.store.get(ids)[0].astype(np.float32)
        return self.search_tokens(tokens, **params)

    def explain_hits(self, query: np.ndarray, hits: list[dict]) -> None:
        """Add an ``explanation`` to each hit of a search answer (``regis.retrieve.explain.explain_hits`` on the
        live snapshot: the result's stored tokens and buddy patches; None for a hit no longer live).

        Args:
            query: (m, D) float32 query tokens.
            hits: the ``results`` of a ``search_tokens`` answer (dicts with "id", "width", "height"); changed in
                place.
        """
        from regis.retrieve.explain import explain_hits

        explain_hits(self.snapshot, query, hits)

    def stored_image(self, image_id: int):
        """What the live snapshot stores of image ``image_id`` for explanations
        (``regis.retrieve.explain.StoredImage``: float16 tokens, buddy patches, size).

        Raises:
            KeyError: no live image ``image_id``.
        """
        from regis.retrieve.explain import stored_image

        stored = stored_image(self.snapshot, int(image_id))
        if stored is None:
            raise KeyError(image_id)
        return stored

    def search_bytes(self, data: bytes, k: int = 10, depth: int | None = None, mode: Mode = "ann",
                     nprobe: int | None = None, candidates: str | None = None, **extra) -> dict:
        """Query by image bytes.

        Returns:
            {"index_version", "mode", "k", "depth", "num_candidates", "max_score", "results": [{"rank", "id", "score",
            "path", "width", "height", "metadata"}], "timings_ms": {"decode", "encode", "candidates",
            "rerank", "total"}} (ms).

        Raises:
            ImageDecodeError: bad image bytes.
            ConfigError: k / depth / mode / candidates out of range.
        """
        t0 = time.perf_counter()
        tokens, timings = self.encode_bytes(data)
        out = self.search_tokens(tokens, k=k, depth=depth, mode=mode, nprobe=nprobe, candidates=candidates, **extra)
        out["timings_ms"] = {**timings, **out["timings_ms"], "total": (time.perf_counter() - t0) * 1e3}
        return out

    def search_file(self, path: Path | str, **kwargs) -> dict:
        """``search_bytes`` of a file's contents.

        Raises:
            ImageDecodeError: the file cannot be read or decoded (the message names the file).
        """
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ImageDecodeError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from exc
        try:
            return self.search_bytes(data, **kwargs)
        except ImageDecodeError as exc:
            raise ImageDecodeError(f"{path}: {exc}") from exc

    def close(self) -> None:
        """Close the live snapshot."""
        self.searcher.snapshot.close()


def result_json(result, records: dict, version: int, k: int, depth: int | None, mode: Mode,
                max_score: float) -> dict:
    """The JSON-ready answer of a search (see ``QueryEngine.search_bytes``) from its ``SearchResult`` and the
    table rows of its ids ({id: ImageRecord}; a missing row gives null fields). ``depth``: the depth to report
    when the result has none (the index default); ``max_score``: the score of a perfect match
    (``regis.scores.framings.perfect_score`` of the query's tokens and the index's framings scored apart).
    A change of this answer's shape bumps ``regis.jobs.names.CACHE_ANSWER_FORMAT`` (the query cache's keys)."""
    hits = []
    for rank, (image_id, score) in enumerate(zip(result.ids.tolist(), result.scores.tolist(), strict=True), 1):
        rec = records.get(image_id)
        hits.append({
            "rank": rank, "id": int(image_id), "score": float(score),
            "path": rec.path if rec else None,
            "width": rec.width if rec else None, "height": rec.height if rec else None,
            "metadata": rec.metadata if rec else {},
        })
    return {
        "index_version": version,
        "mode": mode,
        "k": k,
        "depth": result.depth or depth,
        "num_candidates": result.num_candidates,
        "max_score": float(max_score),
        "results": hits,
        "timings_ms": dict(result.timings_ms),
    }


def _page(out: dict, offset: int, score_threshold: float | None) -> dict:
    """Drop the first ``offset`` hits and those under ``score_threshold`` (ranks keep their global value)."""
    hits = out["results"][offset:]
    if score_threshold is not None:
        hits = [h for h in hits if h["score"] >= score_threshold]
    out["results"] = hits
    if offset:
        out["offset"] = offset
    return out
