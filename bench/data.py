"""Benchmark data access: the projected corpus (``bench.corpus`` + ``bench.project``), the exact MaxSim ground
truth, and regis indexes built straight from token arrays (no images, no encoder)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bench.common import CORPUS_DIR, gt_path


def load_corpus(dim: int = 384, n_db: int | None = None, n_queries: int | None = None, source: str = "fmnist"):
    """Database tokens (N, T, D) float16 (memory-mapped) and query tokens (Q, T, D) float32.

    Args:
        dim: token width of the projected corpus (``bench.project --dim``).
        n_db, n_queries: take only the first rows (None: all).
        source: "fmnist" (real tokens, ``bench.corpus``) or a path to a synthetic corpus written by
            ``bench.synth`` (``db.f16`` + ``q.npy`` + ``info.json``).
    """
    if source == "fmnist":
        info = json.loads((CORPUS_DIR / "info.json").read_text())
        t = info["tokens_per_image"]
        db = np.memmap(CORPUS_DIR / f"db{dim}.f16", dtype=np.float16, mode="r", shape=(info["db"], t, dim))
        q = np.load(CORPUS_DIR / f"q{dim}.npy")
    else:
        root = Path(source)
        info = json.loads((root / "info.json").read_text())
        db = np.memmap(root / "db.f16", dtype=np.float16, mode="r", shape=(info["db"], info["tokens"], info["dim"]))
        q = np.load(root / "q.npy")
    return db[:n_db], q[:n_queries]


def exact_topk(db: np.ndarray, q: np.ndarray, k: int = 100, chunk: int = 4096,
               framings: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Exact MaxSim top-k of every query over every database image, in float32 (the oracle).

    Args:
        db: (N, T, D) float16 tokens.
        q: (Q, m, D) float32 tokens.
        framings: > 1: framings scored apart (``EncoderConfig.score_framings``): the query's m and the image's T
            tokens are that many equal blocks, and an image scores its best framing's MaxSim (each framing's
            query tokens against the image's tokens of the same framing; ``regis.scores.maxsim.maxsim_gemm``).

    Returns:
        ids (Q, k) int64 and scores (Q, k) float32, score descending, ties by ascending id.

    Raises:
        ConfigError (a ValueError): m or T not a multiple of ``framings``.
    """
    import torch

    from regis.scores.framings import framing_split

    n, t, d = db.shape
    nq, m, _ = q.shape
    mf, tf = framing_split(m, t, framings)
    qt = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)).view(nq, framings, mf, d)
    qf = [qt[:, f].reshape(nq * mf, d).T.contiguous() for f in range(framings)]  # per framing (D, Q * m/F)
    best_s = torch.full((nq, k), -np.inf)
    best_i = torch.full((nq, k), -1, dtype=torch.int64)
    for start in range(0, n, chunk):
        x = torch.from_numpy(np.ascontiguousarray(db[start : start + chunk])).float()
        c = x.shape[0]
        x = x.view(c, framings, tf, d)
        sims = None
        for f in range(framings):  # each framing's image tokens against the same framing's query tokens only
            s_f = (x[:, f].reshape(c * tf, d) @ qf[f]).view(c, tf, nq, mf).amax(dim=1).sum(dim=-1)  # (c, Q)
            sims = s_f if sims is None else torch.maximum(sims, s_f)
        sims = sims.T  # (Q, c)
        ids = torch.arange(start, start + c).expand(nq, c)
        all_s = torch.cat([best_s, sims], dim=1)
        all_i = torch.cat([best_i, ids], dim=1)
        top = torch.topk(all_s, k, dim=1)
        best_s, best_i = top.values, torch.gather(all_i, 1, top.indices)
    # exact tie-break by id within equal scores
    ids, scores = best_i.numpy(), best_s.numpy()
    for r in range(nq):
        order = np.lexsort((ids[r], -scores[r]))
        ids[r], scores[r] = ids[r][order], scores[r][order]
    return ids, scores


def ground_truth(db: np.ndarray, q: np.ndarray, tag: str, k: int = 100, framings: int = 1) -> tuple[np.ndarray, float]:
    """Cached ``exact_topk`` ids (Q, k) for a (db, q) pair named ``tag`` (``framings``: ``exact_topk``'s; a tag
    names one corpus, so one framing count); returns (ids, seconds it took)."""
    path = gt_path(tag, len(db), len(q))
    if path.exists():
        z = np.load(path)
        return z["ids"], float(z["seconds"])
    t0 = time.perf_counter()
    ids, scores = exact_topk(db, q, k, framings=framings)
    seconds = time.perf_counter() - t0
    np.savez(path, ids=ids, scores=scores, seconds=seconds)
    return ids, seconds


SERVABLE_BACKBONE = "efficientnet-lite0-regis"


def bench_encoder(dim: int, tokens_per_image: int = 10, record: str = "bench"):
    """An ``EncoderConfig`` + ``WeightsInfo`` for an index of benchmark tokens (the writer needs one).

    Args:
        dim, tokens_per_image: the tokens' D and T.
        record: "bench": a ``bench-tokens-{dim}`` config no encoder can be rebuilt from (searches only; ``regis
            serve`` on such an index fails: unknown backbone); "servable": the real ``efficientnet-lite0-regis``
            encoder (D = 256) with one framing (``frame="center-crop"``: T = 10) or, for T = 20, both
            (``center-crop+aspect``, scored apart: the default of new indexes), built here as ``regis index
            --frame ...`` would, so ``regis serve`` rebuilds it from the manifest, checks its weights and
            encodes photo queries with it (the stored tokens are stand-ins for its tokens: latency is meaningful,
            scores are not; searches score framings apart as the manifest says).

    Raises:
        ValueError: ``record`` is unknown, or "servable" with tokens that are not that encoder's (D, T).
    """
    from regis.models.encoder import EncoderConfig, WeightsInfo

    if record == "servable":
        from regis.models.config import TWO_FRAMINGS
        from regis.models.encoder import build_encoder

        frame = TWO_FRAMINGS if tokens_per_image == 20 else "center-crop"
        enc = build_encoder(SERVABLE_BACKBONE, frame=frame)
        if (enc.config.dim, enc.config.tokens_per_image) != (dim, tokens_per_image):
            raise ValueError(f"{SERVABLE_BACKBONE} ({frame}) writes {enc.config.tokens_per_image} x "
                             f"{enc.config.dim} tokens per image, not {tokens_per_image} x {dim}")
        return enc.config, enc.weights_info
    if record != "bench":
        raise ValueError(f"encoder record {record!r}: 'bench' or 'servable'")
    config = EncoderConfig(backbone=f"bench-tokens-{dim}", kind="cnn", num_registers=tokens_per_image // 2 - 1,
                           dim=dim, cue_method="kmeans", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    return config, WeightsInfo(source="bench:tokens", sha256="0" * 64)


def build_index(path: Path, db: np.ndarray, faiss_spec: str | None = None, token_store: str | None = None,
                nprobe: int | None = None, depth: int | None = None, chunk: int = 10_000,
                encoder_record: str = "bench", k_factor: int | None = None) -> dict:
    """Write ``db`` (N, T, D) into a new regis index at ``path`` with ``IndexWriter``; returns timings (s).

    ``encoder_record``: ``bench_encoder``'s ``record`` ("servable": an index ``regis serve`` can open);
    ``k_factor``: ``FaissInfo.k_factor`` to record (None: regis's)."""
    import shutil

    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    if path.exists():
        shutil.rmtree(path)
    n, t, d = db.shape
    config, weights = bench_encoder(d, t, encoder_record)
    t0 = time.perf_counter()
    with IndexWriter(path, config, weights, faiss_spec=faiss_spec, nprobe=nprobe, token_store=token_store,
                     depth=depth, k_factor=k_factor) as w:
        ids = w.allocate_ids(n)
        for start in range(0, n, chunk):
            part = ids[start : start + chunk]
            recs = [ImageRecord(int(i), f"img/{i}.png", "0" * 64, 28, 28, 1, 0.0) for i in part]
            w.put(recs, np.asarray(db[start : start + chunk]))
        t1 = time.perf_counter()
        manifest = w.commit()
    t2 = time.perf_counter()
    return {"put_s": t1 - t0, "commit_s": t2 - t1, "build_s": t2 - t0, "spec": manifest.faiss.spec,
            "nprobe": manifest.faiss.nprobe, "depth": manifest.faiss.depth, "token_store": manifest.token_store.spec,
            "k_factor": manifest.faiss.k_factor}
