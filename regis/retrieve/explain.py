"""Explained search: the query's tokens and boxes, and per result which result token each query token matched.

Glue between the query engine (``regis.retrieve.query``), the index snapshot (stored tokens and buddy patches)
and the scoring explanations (``regis.scores.explain``). The engine supplies what the index stores
(``QueryEngine.explain_hits`` / ``stored_image``): from its snapshot, or, on a sharded collection, from the shard
each image lives in (``regis.sharding.engine``), which computes its results' explanations itself. Nothing here
re-encodes an indexed image except the pair view (``explain_pair``), which needs the result's patch tokens for its
heatmap.

JSON shapes (documented field by field in ``regis.api.explain``):
    query:       {"width", "height", "grid": [h, w], "tokens": [{"index", "name", "kind", "box"}]}
    explanation: {"score", "matches": [{"query_token", "query_name", "result_token", "result_name",
                  "similarity", "contribution", "share", "result_box"}]}, plus "framing" ("crop" or "whole": the
                  framing whose MaxSim is the score) and "framing_scores" ({name: MaxSim}) on an index of two
                  framings scored apart (``EncoderConfig.score_framings``)
Boxes are [x0, y0, x1, y1] in the image's own pixels (ends exclusive), or None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from regis.errors import ImageDecodeError, RegisError
from regis.images.decode import decode_image
from regis.indexes.snapshot import IndexSnapshot
from regis.models.config import EncoderConfig
from regis.models.geometry import buddy_grid, input_region
from regis.scores.explain import FRAMING_NAMES, patch_heatmap, token_box, token_matches, token_names


class ResultImageError(RegisError):
    """The file of an indexed image can no longer be decoded (changed or damaged on disk since indexing)."""


@dataclass(frozen=True)
class EncodedImage:
    """An image encoded for an explanation.

    Attributes:
        tokens: (T, D) float32 unit-norm tokens.
        buddies: (R + 1,) int64 buddy patches on ``grid`` (None: unknown, an image indexed without them).
        grid: (h, w) patch grid (None with unknown buddies).
        width, height: the image's full size after EXIF orientation, pixels.
        patches: (h * w, D) float32 patch tokens on ``grid`` (only when asked for), else None; for a CNN
            with a ROI pass (``EncoderConfig.roi_image_size``), that pass's patches.
        timings_ms: {"decode": ms, "encode": ms}.
    """

    tokens: np.ndarray
    buddies: np.ndarray | None
    grid: tuple[int, int] | None
    width: int
    height: int
    patches: np.ndarray | None
    timings_ms: dict[str, float]


def explain_encode(encoder, pixels: torch.Tensor, with_patches: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, tuple[int, int], np.ndarray | None]:
    """Encode one transformed image keeping its buddy patches (and, if asked, its patch tokens).

    An encoder that is not in this process (Ray Serve's ``cluster.serve.RemoteEncoder``) provides its own
    ``explain_encode(pixels, with_patches)`` method with this contract, and that method is used instead.

    Args:
        encoder: a ``regis.models.encoder.RegisEncoder`` (or an object with ``explain_encode``).
        pixels: (1, 3, H, W) float32, the encoder's eval transform of the image.
        with_patches: also return the patch tokens (one more backbone pass; for heatmaps).

    Returns:
        the query's tokens (m, D) float32 unit-norm (``RegisEncoder.encode_query``: the first T are the index's),
        buddies (R + 1,) int64, the patch grid (h, w), and the (h * w, D) float32 patch tokens of the pass the
        buddies are on (a CNN's ROI pass, else the one pass) or None.
    """
    remote = getattr(encoder, "explain_encode", None)
    if remote is not None:
        return remote(pixels, with_patches)
    tokens, buddies, grid = encoder.encode_query_with_buddies(pixels)
    patches = None
    if with_patches:
        with torch.inference_mode():
            # the pass the buddy patches are on (a CNN's smaller ROI pass, else the one pass): same grid
            x = pixels.to(tokens.device)
            parts = encoder.forward_roi_parts(x) or encoder.forward_parts(x)
            patches = parts[1][0].float()
            if getattr(encoder, "head", None) is not None:  # a token head: patches in the tokens' space (and width)
                patches = encoder.project(patches)
            patches = patches.cpu().numpy()
    return (tokens[0].float().cpu().numpy(), buddies[0].cpu().numpy(), (int(grid[0]), int(grid[1])), patches)


def encode_image(engine, data: bytes, with_patches: bool = False) -> EncodedImage:
    """Decode and encode image bytes with the engine's encoder, keeping the buddy patches (``explain_encode``).

    Args:
        engine: a ``QueryEngine`` (its encoder, transform and pixel limit are used).
        data: the image bytes.
        with_patches: also return the patch tokens (one more backbone pass; for heatmaps).

    Raises:
        ImageDecodeError: not a decodable image.
        EncoderUnavailableError: a remote encoder did not answer.
    """
    t0 = time.perf_counter()
    decoded = decode_image(data, max_pixels=engine.max_pixels, draft_size=engine.encoder.config.resize_size)
    pixels = engine.transform(decoded.image)[None]
    t1 = time.perf_counter()
    tokens, buddies, grid, patches = explain_encode(engine.encoder, pixels, with_patches)
    t2 = time.perf_counter()
    return EncodedImage(tokens, buddies, grid, decoded.width, decoded.height, patches,
                        {"decode": (t1 - t0) * 1e3, "encode": (t2 - t1) * 1e3})


def _box(box) -> list[float] | None:
    return None if box is None else [round(float(v), 1) for v in box]


def query_json(config: EncoderConfig, query: EncodedImage) -> dict:
    """The query's tokens: name, kind and, for ROI tokens, the box of their window in the query's pixels."""
    names = token_names(config.num_registers, len(query.tokens), config.framings)
    return {
        "width": query.width, "height": query.height,
        "grid": list(buddy_grid(config, query.grid, query.width, query.height)) if query.grid else None,
        "tokens": [
            {"index": i, "name": name, "kind": kind,
             "box": _box(token_box(config, query.grid, query.buddies, i, query.width, query.height,
                                   count=len(query.tokens)))}
            for i, (name, kind) in enumerate(names)
        ],
    }


def explain_tokens(config: EncoderConfig, query: np.ndarray, doc: np.ndarray, buddies: np.ndarray | None,
                   grid: tuple[int, int] | None, width: int, height: int, across: bool = False) -> dict:
    """The explanation of one result: its MaxSim score term by term (``regis.scores.explain.token_matches``).

    Args:
        config: the index's encoder config.
        query: (m, D) float32 query tokens.
        doc: (T, D) the result's tokens as the rerank scored them (float16 from the store).
        buddies: (R + 1,) the result's buddy patches (-1: unknown) or None; grid: their (h, w) grid.
        width, height: the result image's size, pixels.
        across: ``query`` is the first framing's tokens of an image (the centre crop's T) and each matches the
            best of all the result's tokens, in either framing: the duplicates self-join's "centre-all" score
            (``regis.duplicates.selfjoin``, ``regis.duplicates.report.explain_pair``); the answer has no "framing".
            False: the score a search gives.

    Two framings scored apart (``config.score_framings``, a search's): each query token matches the result's tokens
    of its own framing; ``framing`` in the answer names the one whose MaxSim is the score (its query tokens alone
    contribute) and ``framing_scores`` gives both.

    Raises:
        ConfigError: token shapes that do not fit (``regis.scores.explain.token_matches``).
    """
    if across:
        framings = 1
        m = token_matches(query, doc)
        qnames = token_names(config.num_registers, len(query) * config.framings, config.framings)[:len(query)]
    else:
        framings = config.score_framings
        m = token_matches(query, doc, framings)
        qnames = token_names(config.num_registers, len(query), config.framings)
    dnames = token_names(config.num_registers, len(doc), config.framings)
    matches = []
    for i in range(len(query)):
        j = int(m.best[i])
        box = token_box(config, grid, buddies, j, width, height, count=len(doc)) if grid is not None else None
        matches.append({
            "query_token": i, "query_name": qnames[i][0], "result_token": j, "result_name": dnames[j][0],
            "similarity": float(m.similarity[i]), "contribution": float(m.contribution[i]),
            "share": float(m.share[i]), "result_box": _box(box),
        })
    out = {"score": m.score, "matches": matches}
    if framings > 1:  # framings scored apart: which one gave the score, and each one's MaxSim
        out["framing"] = FRAMING_NAMES[m.framing]
        out["framing_scores"] = {FRAMING_NAMES[f]: float(v) for f, v in enumerate(m.framing_scores)}
    return out


@dataclass(frozen=True)
class StoredImage:
    """What an index stores of one live image for explanations.

    Attributes:
        tokens: (T, D) float16 tokens, as the rerank scores them.
        buddies: (R + 1,) int64 buddy patches on ``grid`` (-1: unknown), or None (an index without them).
        grid: (h, w) patch grid of the buddies, or None.
        width, height: the image's size, pixels (its table row).
    """

    tokens: np.ndarray
    buddies: np.ndarray | None
    grid: tuple[int, int] | None
    width: int
    height: int


def _stored_buddies(snapshot: IndexSnapshot, image_id: int) -> tuple[np.ndarray | None, tuple[int, int] | None]:
    if snapshot.buddies is None or snapshot.manifest.buddies is None or image_id >= len(snapshot.buddies):
        return None, None
    return snapshot.buddies[image_id], tuple(snapshot.manifest.buddies.grid)


def stored_image(snapshot: IndexSnapshot, image_id: int) -> StoredImage | None:
    """The stored tokens, buddy patches and size of image ``image_id`` of ``snapshot`` (None: not a live image)."""
    rec = snapshot.table.get(int(image_id)) if 0 <= int(image_id) < 2**62 else None
    ids = np.array([int(image_id)], dtype=np.int64)
    if rec is None or not snapshot.store.is_live(ids)[0]:
        return None
    buddies, grid = _stored_buddies(snapshot, int(image_id))
    return StoredImage(snapshot.store.get(ids)[0], buddies, grid, rec.width, rec.height)


def explain_hits(snapshot: IndexSnapshot, query: np.ndarray, hits: list[dict]) -> None:
    """Add an ``explanation`` to each hit (``{"id", "width", "height", ...}`` dicts of a search result), from the
    stored tokens and buddy patches of ``snapshot``; None for a hit no longer live in it."""
    config = snapshot.manifest.encoder
    ids = np.array([h["id"] for h in hits], dtype=np.int64)
    live = snapshot.store.is_live(ids)
    docs = snapshot.store.get(ids[live]) if live.any() else None
    row = 0
    for hit, ok in zip(hits, live, strict=True):
        if not ok or hit.get("width") is None:
            hit["explanation"] = None
            row += int(ok)
            continue
        buddies, grid = _stored_buddies(snapshot, hit["id"])
        hit["explanation"] = explain_tokens(config, query, docs[row], buddies, grid, hit["width"], hit["height"])
        row += 1


def search_explained(engine, data: bytes, **params) -> dict:
    """``QueryEngine.search_bytes`` plus explanations: a top-level ``query`` block and, per result, an
    ``explanation`` (see the module docstring). ``params`` go to ``QueryEngine.search_tokens``.

    Raises:
        ImageDecodeError: bad image bytes.
        ConfigError: bad search parameters.
        ShardsUnavailableError: a shard of a sharded collection did not answer.
    """
    t0 = time.perf_counter()
    query = encode_image(engine, data)
    out = engine.search_tokens(query.tokens, **params)
    t1 = time.perf_counter()
    engine.explain_hits(query.tokens, out["results"])  # from the live version (a swap meanwhile: the new one)
    out["query"] = query_json(engine.snapshot.manifest.encoder, query)
    t2 = time.perf_counter()
    out["timings_ms"] = {**query.timings_ms, **out["timings_ms"], "explain": (t2 - t1) * 1e3,
                         "total": (t2 - t0) * 1e3}
    return out


def similar_explained(engine, image_id: int, **params) -> dict:
    """``QueryEngine.search_id`` ("more like this") plus explanations; the query is the indexed image itself:
    its stored tokens, and its stored buddy patches for the query boxes (None boxes where the index has none).
    ``params`` go to ``QueryEngine.search_tokens``.

    Raises:
        KeyError: ``image_id`` is not a live image of the index served now.
        ConfigError: bad search parameters.
        ShardsUnavailableError: a shard of a sharded collection did not answer.
    """
    t0 = time.perf_counter()
    out = engine.search_id(image_id, **params)
    t1 = time.perf_counter()
    stored = engine.stored_image(int(image_id))  # KeyError: deleted by a swap meanwhile
    tokens = stored.tokens.astype(np.float32)
    query = EncodedImage(tokens, stored.buddies, stored.grid, stored.width, stored.height, None, {})
    engine.explain_hits(tokens, out["results"])
    out["query"] = query_json(engine.snapshot.manifest.encoder, query)
    t2 = time.perf_counter()
    out["timings_ms"] = {**out["timings_ms"], "explain": (t2 - t1) * 1e3, "total": (t2 - t0) * 1e3}
    return out


def explain_pair(engine, query_data: bytes, image_id: int, image_data: bytes) -> dict:
    """Explain one (query, indexed image) pair, with a patch-level heatmap of each query token over the image.

    The match uses the image's stored tokens (so ``explanation.score`` is the score a search gives it) and its
    stored buddy patches, or the freshly computed ones where the index has none. The heatmap re-encodes the
    image: ``values[i][r][c]`` is the cosine of query token i with patch (r, c) of the image's input crop,
    which covers ``region`` (x0, y0, x1, y1) of the image's pixels.

    Args:
        engine: a ``QueryEngine``.
        query_data: the query image's bytes.
        image_id: a live image id of the engine's index.
        image_data: that image's bytes (its file).

    Raises:
        ImageDecodeError: the query cannot be decoded.
        ResultImageError: the indexed image's bytes cannot be decoded.
        KeyError: ``image_id`` is not live in the index.
        ShardsUnavailableError: the shard of ``image_id`` (sharded collection) did not answer.
    """
    snapshot = engine.snapshot
    config = snapshot.manifest.encoder
    stored = engine.stored_image(int(image_id))
    query = encode_image(engine, query_data)
    try:
        result = encode_image(engine, image_data, with_patches=True)
    except ImageDecodeError as exc:
        raise ResultImageError(f"the file of image {image_id} no longer decodes: {exc}") from exc
    buddies, grid = stored.buddies, stored.grid
    if buddies is None or (buddies < 0).any():
        buddies, grid = result.buddies, result.grid
    heat = patch_heatmap(query.tokens, result.patches, result.grid)
    return {
        "index_version": snapshot.version,
        "query": query_json(config, query),
        "result": {"id": image_id, "width": result.width, "height": result.height},
        "explanation": explain_tokens(config, query.tokens, stored.tokens, buddies, grid, result.width, result.height),
        "heatmap": {"grid": list(result.grid), "region": _box(input_region(config, result.width, result.height)),
                    "values": np.round(heat, 3).tolist()},
    }
