"""``bench.data.build_index``'s encoder record: "bench" indexes cannot be served (their backbone is a name only),
"servable" ones are rebuilt by ``encoder_for`` exactly as ``regis serve`` rebuilds an index's encoder
(bench.million ``--encoder-record servable``, the 1M index that ``bench.service --index`` serves)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.data import bench_encoder, build_index


def _tokens(n: int = 50, t: int = 10, d: int = 256) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((n, t, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float16)


def test_servable_record_is_rebuilt_as_regis_serve_does(tmp_path):
    from regis.errors import ConfigError
    from regis.index_encoder import encoder_for

    for record in ("bench", "servable"):
        build_index(tmp_path / record, _tokens(), encoder_record=record)
    enc = encoder_for(tmp_path / "servable", None, None, False, None, None, "cpu")
    assert (enc.config.backbone, enc.config.frame) == ("efficientnet-lite0-regis", "center-crop")
    assert (enc.config.dim, enc.config.tokens_per_image) == (256, 10)
    with pytest.raises(ConfigError, match="unknown backbone 'bench-tokens-256'"):
        encoder_for(tmp_path / "bench", None, None, False, None, None, "cpu")


def test_servable_record_refuses_tokens_of_another_shape():
    with pytest.raises(ValueError, match="not 10 x 384"):
        bench_encoder(384, 10, "servable")
    with pytest.raises(ValueError, match="'bench' or 'servable'"):
        bench_encoder(256, 10, "other")


def test_servable_record_of_twenty_tokens_is_the_two_framing_default(tmp_path):
    """T = 20: the default of new indexes (both framings, scored apart), so searches score the better framing."""
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.searcher import Searcher

    db = _tokens(60, 20)
    build_index(tmp_path / "two", db, encoder_record="servable")
    snap = IndexSnapshot.open(tmp_path / "two")
    config = snap.manifest.encoder
    assert (config.frame, config.tokens_per_image, config.score_framings) == ("center-crop+aspect", 20, 2)
    q = np.concatenate([db[7, :10], db[7, :5], db[7, 10:], db[7, 10:15]]).astype(np.float32)  # 30 query tokens
    result = Searcher(snap).search(q, k=3)
    assert result.ids[0] == 7 and result.scores[0] == pytest.approx(15.0, abs=0.05)  # one framing's 15 tokens
    snap.close()


def test_exact_topk_scores_framings_apart():
    """The oracle of a two-framing corpus: an image's score is its better framing's MaxSim, worked out by hand on
    2 images of 2 + 2 tokens (framing blocks of 1 token) and a query of 2 + 2 tokens."""
    from bench.data import exact_topk

    e = np.eye(4, dtype=np.float32)
    db = np.stack([
        np.stack([e[0], e[1], e[2], e[3]]),  # framing 1: e0 e1, framing 2: e2 e3
        np.stack([e[2], e[3], e[0], e[1]]),  # the same tokens, framings swapped
    ]).astype(np.float16)
    q = np.stack([e[0], e[1], e[0], e[3]])[None]  # framing 1 asks e0 e1, framing 2 asks e0 e3
    ids, scores = exact_topk(db, q, k=2, framings=2)
    # image 0: framing 1 scores 1 + 1 = 2, framing 2 (e0 e3 vs e2 e3) 0 + 1 = 1 -> 2
    # image 1: framing 1 (e0 e1 vs e2 e3) 0, framing 2 (e0 e3 vs e0 e1) 1 + 0 = 1 -> 1
    assert ids.tolist() == [[0, 1]] and scores.tolist() == [[2.0, 1.0]]
    _, union = exact_topk(db, q, k=2)  # one MaxSim over all 4 tokens: 4 query tokens each found exactly
    assert union.tolist() == [[4.0, 4.0]]
