"""Evaluate an encoder on a dataset's class-disjoint test split and describe the result as JSON."""

from __future__ import annotations

import time

from training.data.base import EvalSplit
from training.evaluation.embed import embed_images, subsample
from training.evaluation.retrieval import retrieval_metrics


def evaluate_encoder(
    encoder,
    split: EvalSplit,
    ks: tuple[int, ...],
    batch_size: int = 64,
    num_workers: int = 0,
    max_images: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Embed a test split and compute single- and multi-vector Recall@K, mAP@R and R-precision.

    Args:
        encoder: a ``RegisEncoder``.
        split: leave-one-out queries, or queries + gallery.
        ks: the K of Recall@K.
        batch_size, num_workers: embedding DataLoader settings.
        max_images: evaluate a seeded random subset of this many images (leave-one-out: of the test set;
            query-gallery: of the queries, the whole gallery kept); None for all.
        seed: the subset's seed.
        progress: tqdm bars.

    Returns:
        ``retrieval_metrics``'s report plus ``"subset"`` and ``"embed_seconds"``.
    """
    queries = subsample(split.queries, max_images, seed)
    t0 = time.perf_counter()
    # the query's tokens (``EncoderConfig.query_layout``): what a search scores; their first T are the index's
    q_tokens = embed_images(encoder, queries, batch_size, num_workers, progress, "embed queries", query=True)
    g_tokens = None
    if split.gallery is not None:
        g_tokens = embed_images(encoder, split.gallery, batch_size, num_workers, progress, "embed gallery")
    embed_s = time.perf_counter() - t0
    report = retrieval_metrics(
        q_tokens, queries.labels, g_tokens, None if split.gallery is None else split.gallery.labels, ks,
        index_tokens=encoder.config.tokens_per_image,
    )
    report["subset"] = None if max_images is None or max_images >= len(split.queries) else {
        "max_images": max_images, "seed": seed, "of": len(split.queries)}
    report["embed_seconds"] = round(embed_s, 3)
    return report
