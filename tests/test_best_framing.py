"""Two framings per image scored apart (issue 29, ``framing_score`` "best"): each framing's query tokens against the
image's tokens of the same framing, the image's score the better framing's MaxSim, in every scoring path (torch and
numpy rerank, SQ4 codes, exact and ANN with bounded candidates, sharded search, explanations). Scores are
recomputed here by hand, with loops, from the stored tokens; an index without the field keeps the one MaxSim over
all tokens it was built with."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from regis.errors import ConfigError
from regis.indexes.layout import MANIFEST_FILE
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter
from regis.models.encoder import EncoderConfig, WeightsInfo, build_encoder
from regis.retrieve.explain import explain_hits, explain_tokens
from regis.retrieve.searcher import Searcher
from regis.scores.maxsim import maxsim_gemm
from regis.scores.maxsim_np import maxsim_gemm_np
from regis.sharding.search import ShardedSearcher
from regis.sharding.write import split_index

D = 16
TF, MF = 10, 15  # tokens per framing: an image's, a query's (20 and 30 in all; the square's first)
A, B = 0, 1  # the two planted images; the others are random


def _cfg(score: str = "best") -> EncoderConfig:
    return EncoderConfig(backbone="test-best-framing", kind="cnn", num_registers=4, dim=D, cue_method="grid",
                         roi_size=1, cue_pooling="gem", roi_image_size=160, query_layout="tokens+roi-cues",
                         frame="center-crop+aspect", framing_score=score, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _near(rng, tokens: np.ndarray, count: int, noise: float = 0.05) -> np.ndarray:
    """``count`` tokens close to ``tokens`` (cycled)."""
    return _unit(tokens[np.arange(count) % len(tokens)] + noise * rng.standard_normal((count, D)))


def hand(query: np.ndarray, doc: np.ndarray) -> tuple[float, int]:
    """(score, winning framing) by loops: per framing f, sum over its query tokens of the max over the image's
    tokens of framing f; the larger (the first on a tie)."""
    q, d = query.astype(np.float64), doc.astype(np.float64)
    per = [sum(max(float(q[f * MF + i] @ d[f * TF + j]) for j in range(TF)) for i in range(MF)) for f in range(2)]
    return max(per), int(per[1] > per[0])


def hand_union(query: np.ndarray, doc: np.ndarray) -> float:
    q, d = query.astype(np.float64), doc.astype(np.float64)
    return sum(max(float(qi @ dj) for dj in d) for qi in q)


@pytest.fixture(scope="module")
def planted():
    """300 random images plus A and B, and two queries: ``whole`` (its whole-image tokens near A's whole-image
    tokens, its square's near B's whole-image tokens) and ``crop`` (its square's tokens near A's square)."""
    rng = np.random.default_rng(0)
    tokens = _unit(rng.standard_normal((302, 2 * TF, D)))
    whole_q = np.concatenate([_near(rng, tokens[B, TF:], MF), _near(rng, tokens[A, TF:], MF)])
    crop_q = np.concatenate([_near(rng, tokens[A, :TF], MF), _unit(rng.standard_normal((MF, D)))])
    return tokens, {"whole": whole_q, "crop": crop_q}


def _index(path, tokens: np.ndarray, score: str = "best", **kw):
    with IndexWriter(path, _cfg(score), WeightsInfo(source="test", sha256="0" * 64), **kw) as w:
        ids = w.allocate_ids(len(tokens))
        w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 640, 480, 1, 0.0) for i in ids], tokens)
        w.commit()
    return IndexSnapshot.open(path)


def test_new_two_framing_encoders_score_the_better_framing_and_the_field_is_checked():
    assert build_encoder("efficientnet-lite0", random_init=True, frame="center-crop+aspect").config.framing_score \
        == "best"
    one = build_encoder("efficientnet-lite0", random_init=True, frame="aspect").config
    assert one.framing_score == "union" and one.score_framings == 1
    assert _cfg().score_framings == 2 and _cfg("union").score_framings == 1
    assert EncoderConfig.model_fields["framing_score"].default == "union"  # manifests without the field
    with pytest.raises(ConfigError, match="needs two framings"):
        build_encoder("efficientnet-lite0", random_init=True, frame="aspect", framing_score="best")
    with pytest.raises(ValueError, match="needs two framings"):
        EncoderConfig(**(_cfg().model_dump() | {"frame": "aspect"}))


def test_the_scorers_equal_the_score_recomputed_by_hand(planted):
    tokens, queries = planted
    docs = tokens[:40].astype(np.float16)
    for q in queries.values():
        want = np.array([hand(q, d)[0] for d in docs.astype(np.float32)])
        got_torch = maxsim_gemm(torch.from_numpy(q), torch.from_numpy(docs), framings=2).numpy()
        np.testing.assert_allclose(got_torch, want, rtol=0, atol=2e-5)
        np.testing.assert_allclose(maxsim_gemm_np(q, docs, framings=2), want, rtol=0, atol=2e-5)
        np.testing.assert_allclose(maxsim_gemm_np(q, docs, chunk_size=7, framings=2), want, rtol=0, atol=2e-5)
        union = np.array([hand_union(q, d) for d in docs.astype(np.float32)])
        np.testing.assert_allclose(maxsim_gemm_np(q, docs), union, rtol=0, atol=2e-5)
        assert (np.abs(union - want) > 1).all()  # not the one MaxSim over all tokens
    with pytest.raises(ValueError, match="split into 2 framings"):
        maxsim_gemm_np(queries["crop"][:29], docs, framings=2)


def test_every_scorer_refuses_tokens_that_do_not_split_into_the_framings(planted):
    """One check (``regis.scores.framings.framing_split``): an odd query, an odd image or framings 0 raise the same
    ConfigError (a ValueError) in the torch and numpy MaxSim, the SQ4 codes and the explanation."""
    from regis.indexes.codes import sq4_maxsim
    from regis.scores.explain import token_matches
    from regis.scores.framings import framing_split

    tokens, queries = planted
    q, docs = queries["crop"], tokens[:3]
    assert framing_split(30, 20, 2) == (15, 10) and framing_split(29, 19, 1) == (29, 19)
    codes = np.zeros((3, 2 * TF, D // 2), dtype=np.uint8)
    scorers = {
        "torch": lambda q, d, f: maxsim_gemm(torch.from_numpy(q), torch.from_numpy(d), framings=f),
        "numpy": lambda q, d, f: maxsim_gemm_np(q, d, framings=f),
        "codes": lambda q, d, f: sq4_maxsim(q, codes[:, : d.shape[1]], np.zeros(D, np.float32),
                                            np.ones(D, np.float32), framings=f),
        "explain": lambda q, d, f: token_matches(q, d[0], f),
    }
    for name, score in scorers.items():
        score(q, docs, 2)  # splits
        for bad_q, bad_d, f in ((q[:29], docs, 2), (q, docs[:, :19], 2), (q, docs, 0)):
            with pytest.raises(ConfigError, match=f"do not split into {f} framings"):
                score(bad_q, bad_d, f)
                pytest.fail(name)


@pytest.mark.parametrize("device", ["cpu", None])
@pytest.mark.parametrize("use_codes", [False, True])
def test_search_returns_the_better_framings_score_in_every_path(tmp_path, planted, device, use_codes):
    """The whole-image query finds A by its whole-image tokens (the aspect framing wins); the crop query finds A
    by its square (the crop framing wins). Returned scores: the hand score of the stored float16 tokens."""
    tokens, queries = planted
    snap = _index(tmp_path / "idx", tokens)
    assert snap.manifest.encoder.framing_score == "best" and snap.manifest.tokens_per_image == 20
    searcher = Searcher(snap, device=device, use_codes=use_codes)
    assert searcher.framings == 2 and (snap.codes is not None)  # new indexes keep SQ4 codes
    for name, framing in (("whole", 1), ("crop", 0)):
        q = queries[name]
        for result in (searcher.search(q, k=5), searcher.search(q, k=5, mode="exact"),
                       searcher.search(q, k=5, depth=1, candidates="bounded")):
            assert result.ids[0] == A, name
            stored = snap.store.get(result.ids).astype(np.float32)
            want = [hand(q, d)[0] for d in stored]
            np.testing.assert_allclose(result.scores, want, rtol=0, atol=2e-5)
            assert hand(q, stored[0])[1] == framing
        np.testing.assert_allclose(searcher.rerank(q, np.array([A])), [hand(q, tokens[A].astype(np.float16)
                                                                             .astype(np.float32))[0]], atol=2e-5)
    with pytest.raises(ConfigError, match="equal blocks"):
        searcher.search(queries["crop"][:29], k=5)
    snap.close()


def test_an_index_built_with_one_maxsim_keeps_it(tmp_path, planted):
    """The whole-image query's square matches B's whole-image tokens: one MaxSim over all tokens (an index written
    before the field, or "union") ranks B first; the better framing ranks A first."""
    tokens, queries = planted
    q = queries["whole"]
    best = _index(tmp_path / "best", tokens)
    assert Searcher(best).search(q, k=1).ids[0] == A
    best.close()
    path = tmp_path / "old"
    _index(path, tokens, score="union").close()
    version = path / "versions" / IndexSnapshot.open(path).name
    raw = json.loads((version / MANIFEST_FILE).read_text())
    del raw["encoder"]["framing_score"]  # as written before the field existed
    (version / MANIFEST_FILE).write_text(json.dumps(raw))
    old = IndexSnapshot.open(path)
    assert old.manifest.encoder.framing_score == "union" and Searcher(old).framings == 1
    result = Searcher(old).search(q, k=1, mode="exact")
    assert result.ids[0] == B
    np.testing.assert_allclose(result.scores[0], hand_union(q, old.store.get(result.ids)[0].astype(np.float32)),
                               atol=2e-5)
    old.close()


def test_an_index_scored_with_one_maxsim_keeps_it_when_options_are_given(cli, tmp_path, photos_dir):
    """A two-framing index built with "union" (before "best" became the default for new two-framing encoders): a
    build naming the backbone (an option, so not the manifest's own encoder) keeps "union", and a second build
    passes the encoder check instead of failing on the new default."""
    from conftest import build
    from regis.index_encoder import encoder_for

    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.png").write_bytes((photos_dir / "skimage-chelsea.png").read_bytes())
    index = tmp_path / "index"
    old = build_encoder("efficientnet-lite0", random_init=True, frame="center-crop+aspect", framing_score="union")
    build(folder, index, old)
    assert IndexSnapshot.open(index).manifest.encoder.framing_score == "union"
    again = encoder_for(index, "efficientnet-lite0", None, True, None, None, "cpu").config
    assert (again.frame, again.framing_score) == ("center-crop+aspect", "union")
    (folder / "b.png").write_bytes((photos_dir / "skimage-coffee.png").read_bytes())
    run = cli("index", "build", str(folder), "--index", str(index), "--backbone", "efficientnet-lite0",
              "--random-init", "--no-progress")
    assert run.returncode == 0, run.stderr  # without the fix: "it cannot take tokens from efficientnet-lite0"
    snap = IndexSnapshot.open(index)
    assert snap.manifest.encoder.framing_score == "union" and snap.table.count() == 2
    snap.close()


def test_ann_with_bounded_candidates_finds_the_exact_top_k(tmp_path, planted):
    """Each framing's query tokens bound an unseen image's score on their own: depth 1 ANN (bounded) returns the
    exact ranking's top 10 for queries near random images."""
    tokens, _ = planted
    snap = _index(tmp_path / "idx", tokens)
    searcher = Searcher(snap, use_codes=False)
    rng = np.random.default_rng(1)
    for target in (5, 77, 150, 290):
        q = np.concatenate([_near(rng, tokens[target, :TF], MF, 0.6), _near(rng, tokens[target, TF:], MF, 0.6)])
        exact = searcher.search(q, k=10, mode="exact")
        ann = searcher.search(q, k=10, depth=1, candidates="bounded")
        np.testing.assert_array_equal(ann.ids, exact.ids)
        np.testing.assert_allclose(ann.scores, exact.scores, atol=1e-6)
    snap.close()


def test_sharded_search_equals_the_unsharded_index(tmp_path, planted):
    tokens, queries = planted
    snap = _index(tmp_path / "idx", tokens)
    split_index(tmp_path / "idx", tmp_path / "c", 3)
    sharded = ShardedSearcher(tmp_path / "c")
    try:
        for q in queries.values():
            for mode in ("exact", "ann"):
                want = Searcher(snap).search(q, k=5, mode=mode)
                got = sharded.search(q, k=5, mode=mode)
                np.testing.assert_array_equal(got.ids, want.ids)
                np.testing.assert_allclose(got.scores, want.scores, atol=1e-5)
                stored = snap.store.get(got.ids).astype(np.float32)
                np.testing.assert_allclose(got.scores, [hand(q, d)[0] for d in stored], atol=2e-5)
    finally:
        sharded.close()
        snap.close()


def test_explanations_name_the_winning_framing_and_sum_to_the_score(tmp_path, planted):
    tokens, queries = planted
    snap = _index(tmp_path / "idx", tokens)
    cfg = snap.manifest.encoder
    stored = snap.store.get(np.array([A]))[0]
    for name, framing in (("whole", "whole"), ("crop", "crop")):
        q = queries[name]
        out = explain_tokens(cfg, q, stored, None, None, 640, 480)
        score, won = hand(q, stored.astype(np.float32))
        assert out["framing"] == framing == ("crop", "whole")[won]
        assert out["score"] == pytest.approx(score, abs=2e-5)
        assert max(out["framing_scores"].values()) == pytest.approx(score, abs=2e-5)
        assert min(out["framing_scores"].values()) < score - 1
        for m in out["matches"]:
            mine = m["query_token"] // MF
            assert m["result_token"] // TF == mine  # a query token matches only its own framing's tokens
            assert m["query_name"].startswith(("crop-", "whole-")[mine])
            assert m["result_name"].startswith(("crop-", "whole-")[mine])
            if ("crop", "whole")[mine] != framing:
                assert m["contribution"] == 0.0 and m["share"] == 0.0
        assert sum(m["contribution"] for m in out["matches"]) == pytest.approx(score, abs=2e-5)
        result = Searcher(snap).search(q, k=3)
        hits = [{"id": int(i), "width": 640, "height": 480} for i in result.ids]
        explain_hits(snap, q, hits)  # the service's and each shard's path
        for hit, s in zip(hits, result.scores, strict=True):
            assert hit["explanation"]["score"] == pytest.approx(float(s), abs=2e-5)
        assert hits[0]["explanation"]["framing"] == framing
    union = explain_tokens(_cfg("union"), queries["whole"], stored, None, None, 640, 480)
    assert "framing" not in union
    assert union["score"] == pytest.approx(hand_union(queries["whole"], stored.astype(np.float32)), abs=2e-5)
    snap.close()


def test_a_framing_that_matches_nothing_does_not_loosen_the_others_bound(tmp_path):
    """Every token shares one direction; the query's whole-image tokens point away from it (similarity < 0 to every
    token), its square's tokens near image 7's square. One bound over all 30 tokens would add the negative tails
    and stop early; each framing's own bound (the score is one framing's MaxSim) keeps searching: depth 1 ANN
    equals the exact top 10."""
    rng = np.random.default_rng(2)
    axis = np.eye(D, dtype=np.float32)[0]
    tokens = _unit(3.0 * axis + 0.5 * rng.standard_normal((302, 2 * TF, D)))
    snap = _index(tmp_path / "idx", tokens)
    searcher = Searcher(snap, use_codes=False)
    q = np.concatenate([_near(rng, tokens[7, :TF], MF, 0.3), np.tile(-axis, (MF, 1))])
    assert (snap.store.get(snap.store.live_ids).astype(np.float32) @ -axis < 0).all()
    exact = searcher.search(q, k=10, mode="exact")
    ann = searcher.search(q, k=10, depth=1, candidates="bounded")
    np.testing.assert_array_equal(ann.ids, exact.ids)
    snap.close()


def test_maxsim_terms_is_the_sum_of_row_maxima_and_refuses_empty_blocks():
    """The rerank's reduction (``regis.scores.maxsim_np.maxsim_terms``), worked out by hand on a (2, 2, 3) block,
    and the same as numpy's max over the last axis on random blocks."""
    from regis.scores.maxsim_np import maxsim_terms

    sims = np.array([[[0.1, 0.9, -0.2], [-1.0, -0.5, -0.7]],
                     [[0.3, 0.2, 0.4], [0.0, -0.1, 0.8]]], dtype=np.float32)
    np.testing.assert_allclose(maxsim_terms(sims), [0.9 + 0.4, -0.5 + 0.8], rtol=0, atol=1e-6)
    rng = np.random.default_rng(1)
    for shape in ((15, 7, 10), (1, 1, 1), (3, 5, 20)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(maxsim_terms(x), x.max(axis=2).sum(axis=0), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="n >= 1"):
        maxsim_terms(np.zeros((2, 3, 0), np.float32))
