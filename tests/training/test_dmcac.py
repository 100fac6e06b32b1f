"""DMCAC invariants (METHODS.md section 2), checked one piece at a time."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from regis.errors import ConfigError
from training.dmcac.database import DatabaseCache, full_context, refresh_due, union_context
from training.dmcac.divergence import frobenius_loss, js_divergence, masked_softmax, pairwise_js
from training.dmcac.heads import CrossAttentionClassifier
from training.dmcac.loss import Betas, DMCACLoss, view_similarities
from training.dmcac.split import query_database_split


def _dist(*shape, seed=0):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_js_properties():
    p, q = _dist(4, 7, seed=1), _dist(4, 7, seed=2)
    assert torch.allclose(js_divergence(p, p), torch.zeros(4), atol=1e-7)
    assert torch.allclose(js_divergence(p, q), js_divergence(q, p))
    assert (js_divergence(p, q) >= 0).all() and (js_divergence(p, q) <= math.log(2)).all()
    one_hot_a, one_hot_b = torch.tensor([1.0, 0, 0]), torch.tensor([0, 0, 1.0])
    assert js_divergence(one_hot_a, one_hot_b).item() == pytest.approx(math.log(2), abs=1e-7)


def test_js_by_hand():
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])
    m = [0.75, 0.25]
    expected = 0.5 * (0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])) + 0.5 * (1.0 * math.log(1.0 / m[0]))
    assert js_divergence(p, q).item() == pytest.approx(expected, abs=1e-7)


def test_frobenius_loss_identical_views_is_zero_with_finite_gradient():
    logits = torch.randn(1, 1, 5).repeat(2, 4, 1).requires_grad_(True)
    loss = frobenius_loss(torch.softmax(logits, -1))
    assert torch.equal(loss, torch.zeros(2))
    loss.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_frobenius_loss_two_views_is_l21_and_matches_the_lower_triangle_by_hand():
    d2 = _dist(3, 2, 6, seed=3)
    assert torch.allclose(frobenius_loss(d2), js_divergence(d2[:, 1], d2[:, 0]), atol=1e-7)
    d4 = _dist(1, 4, 6, seed=4)
    l_ij = pairwise_js(d4)[0]
    by_hand = math.sqrt(sum(l_ij[i, j].item() ** 2 for i in range(1, 4) for j in range(i)))
    assert frobenius_loss(d4).item() == pytest.approx(by_hand, rel=1e-6)
    with pytest.raises(ValueError):
        frobenius_loss(_dist(1, 1, 6))


def test_masked_softmax_ignores_padding():
    logits = torch.tensor([[1.0, 2.0, 50.0]])
    p = masked_softmax(logits, torch.tensor([[True, True, False]]), tau=0.5)
    assert p[0, 2] == 0 and torch.allclose(p[0, :2], torch.softmax(torch.tensor([2.0, 4.0]), -1))


def test_split_stratified_and_overlap():
    labels = np.repeat(np.arange(5), 6)
    q, d = query_database_split(labels, "stratified", seed=0)
    assert len(np.intersect1d(q, d)) == 0 and len(q) + len(d) == 30
    assert set(labels[q]) == set(labels[d]) == set(range(5))
    q2, d2 = query_database_split(labels, "overlap")
    assert np.array_equal(q2, d2) and len(q2) == 30
    with pytest.raises(ConfigError, match="needs >= 2"):
        query_database_split(np.array([0, 0, 1]), "stratified")


def _cache(n=20, dim=8, seed=0):
    emb = F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=-1)
    cache = DatabaseCache(np.arange(n) * 2, np.arange(n) % 4)  # dataset indices 0, 2, 4, ...
    cache.update(emb, epoch=0)
    return cache, emb


def test_the_query_is_never_its_own_neighbour():
    cache, emb = _cache()
    nbrs = cache.search(emb[:5], k=3, exclude=np.arange(5) * 2)
    assert nbrs.shape == (5, 3)
    assert not any(i in row for i, row in enumerate(nbrs))
    plain = cache.search(emb[:5], k=3)
    assert (plain[:, 0] == np.arange(5)).all()  # without exclusion each finds itself first


def test_k_is_capped_at_the_database_size():
    cache, emb = _cache(n=4)
    assert cache.search(emb[:2], k=12).shape == (2, 4)
    assert cache.search(emb[:2], k=12, exclude=np.array([0, 2])).shape == (2, 3)


def test_union_size_bounds_and_padding():
    cache, emb = _cache(n=30)
    views = F.normalize(emb[:6] + 0.3 * torch.randn(6, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    k, a = 4, 3
    nbrs = cache.search(views, k=k).reshape(2, a, k)
    ctx, mask = union_context(nbrs)
    t = mask.sum(1)
    assert ctx.shape == (2, a * k) and ((k <= t) & (t <= a * k)).all()
    for row in range(2):
        assert set(ctx[row, mask[row]]) == set(nbrs[row].ravel())
    same = union_context(np.tile(nbrs[:, :1], (1, a, 1)))[1].sum(1)
    assert (same == k).all()  # identical views: T = k


def test_full_and_approximate_retrieval_agree_when_k_covers_the_database():
    cache, emb = _cache(n=10)
    nbrs = cache.search(emb[:3], k=10).reshape(3, 1, 10)
    ctx, mask = union_context(nbrs)
    full_ctx, full_mask = full_context(10, 3)
    for row in range(3):
        assert sorted(ctx[row, mask[row]]) == sorted(full_ctx[row, full_mask[row]])
    loss = DMCACLoss(8, 4)
    torch.manual_seed(0)
    views = F.normalize(torch.randn(3, 2, 8), dim=-1)
    labels = torch.tensor([0, 1, 2])
    approx = loss(views, cache.embeddings[torch.from_numpy(ctx)], torch.from_numpy(mask), labels)
    full = loss(views, cache.embeddings[torch.from_numpy(full_ctx)], torch.from_numpy(full_mask), labels)
    for key in ("loss", "frob", "cac", "ce"):
        assert torch.allclose(approx[key], full[key], atol=1e-6), key


def test_refresh_epochs():
    assert [e for e in range(16) if refresh_due(e, 5)] == [0, 5, 10, 15]
    with pytest.raises(ConfigError):
        refresh_due(3, 0)


def test_cac_with_one_context_item_returns_its_value_projection():
    torch.manual_seed(0)
    cac = CrossAttentionClassifier(8, 3)
    z, ctx = torch.randn(2, 8), torch.randn(2, 1, 8)
    assert torch.allclose(cac.attend(z, ctx), cac.w_v(ctx[:, 0]), atol=1e-6)
    padded = torch.cat([ctx, torch.randn(2, 3, 8)], 1)
    mask = torch.tensor([[True, False, False, False]] * 2)
    assert torch.allclose(cac.attend(z, padded, mask), cac.w_v(ctx[:, 0]), atol=1e-6)


def test_database_gets_no_gradient_while_the_encoder_does(tiny_encoder):
    import copy

    encoder = copy.deepcopy(tiny_encoder).train()
    torch.manual_seed(0)
    db_images, query_views = torch.randn(12, 3, 64, 64), torch.randn(2 * 3, 3, 64, 64)
    with torch.no_grad():
        db = encoder(db_images)[:, 0]
    cache = DatabaseCache(np.arange(12), np.arange(12) % 3)
    cache.update(db, epoch=0)
    assert not cache.embeddings.requires_grad
    views = encoder(query_views)[:, 0].reshape(2, 3, -1)
    nbrs = cache.search(views.reshape(6, -1), k=4).reshape(2, 3, 4)
    ctx, mask = union_context(nbrs)
    out = DMCACLoss(32, 3)(views, cache.embeddings[torch.from_numpy(ctx)], torch.from_numpy(mask),
                           torch.tensor([0, 1]))
    out["loss"].backward()
    grads = [p.grad for p in encoder.parameters() if p.grad is not None]
    assert grads and sum(g.abs().sum() for g in grads) > 0
    assert cache.embeddings.grad is None


def test_betas_switch_terms_off_and_maxsim_similarity():
    torch.manual_seed(0)
    views, ctx = F.normalize(torch.randn(2, 3, 8), -1), F.normalize(torch.randn(2, 5, 8), -1)
    mask, labels = torch.ones(2, 5, dtype=torch.bool), torch.tensor([0, 1])
    no_cac = DMCACLoss(8, 2, Betas(1, 1, 0))(views, ctx, mask, labels)
    assert no_cac["cac"] == 0 and torch.allclose(no_cac["loss"], no_cac["frob"] + no_cac["ce"])
    no_frob = DMCACLoss(8, 2, Betas(0, 1, 1))(views, ctx, mask, labels)
    assert no_frob["frob"] == 0
    with pytest.raises(ConfigError):
        Betas(0, 0, 0)
    vt, ct = F.normalize(torch.randn(2, 3, 4, 8), -1), F.normalize(torch.randn(2, 5, 4, 8), -1)
    p = view_similarities(vt, ct, "maxsim")
    by_hand = (vt[1, 2] @ ct[1, 4].T).amax(-1).mean()
    assert p.shape == (2, 3, 5) and torch.isclose(p[1, 2, 4], by_hand)


def test_search_pads_when_an_approximate_index_finds_fewer():
    cache, emb = _cache(n=10)

    class Short:  # an index that finds only 2 items (as HNSW / IVF may)
        def search(self, x, k):
            ids = np.full((len(x), k), -1, dtype=np.int64)
            ids[:, :2] = [3, 5]
            return np.zeros_like(ids, dtype=np.float32), ids

    cache._index = Short()
    out = cache.search(emb[:2], k=4)
    assert out.tolist() == [[3, 5, -1, -1]] * 2
    ctx, mask = union_context(out.reshape(2, 1, 4))
    assert mask.sum(1).tolist() == [2, 2] and ctx[0, :2].tolist() == [3, 5]


def test_ivf_and_hnsw_database_indexes_build():
    emb = F.normalize(torch.randn(300, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    for spec in ("HNSW16", "IVF4,Flat"):
        cache = DatabaseCache(np.arange(300), np.zeros(300), spec)
        cache.update(emb, epoch=0)
        assert cache.search(emb[:3], k=5).shape == (3, 5)
    with pytest.raises(ConfigError, match="FAISS"):
        DatabaseCache(np.arange(3), np.zeros(3), "NotAnIndex").update(emb[:3], epoch=0)


def test_maxsim_search_is_exact_and_excludes_the_query():
    g = torch.Generator().manual_seed(0)
    db_tokens = F.normalize(torch.randn(15, 4, 8, generator=g), dim=-1)
    cache = DatabaseCache(np.arange(15) + 100, np.zeros(15))
    cache.update(db_tokens[:, 0], epoch=0, tokens=db_tokens)
    q = db_tokens[:3]
    by_hand = torch.stack([torch.stack([(q[i] @ db_tokens[j].T).amax(-1).sum() for j in range(15)])
                           for i in range(3)])
    assert cache.search_maxsim(q, k=5).tolist() == by_hand.argsort(dim=1, descending=True)[:, :5].tolist()
    excl = cache.search_maxsim(q, k=14, exclude=np.array([100, 101, 102]))
    assert excl.shape == (3, 14) and all(i not in row for i, row in enumerate(excl))
    assert cache.search_maxsim(q, k=3, chunk=4).tolist() == cache.search_maxsim(q, k=3).tolist()
    with pytest.raises(ConfigError, match="no tokens"):
        _cache()[0].search_maxsim(q, k=2)


def test_cache_state_round_trip_rebuilds_the_same_index():
    cache, emb = _cache(n=12)
    cache.update(emb.flip(0), epoch=5)
    copy = DatabaseCache(cache.dataset_indices, cache.labels)
    copy.load_state_dict(cache.state_dict())
    assert copy.refreshed_at == [0, 5] and torch.equal(copy.embeddings, cache.embeddings)
    assert np.array_equal(copy.search(emb[:4], k=3), cache.search(emb[:4], k=3))


def test_cache_copies_inference_tensors_and_never_needs_grad():
    with torch.inference_mode():
        emb = F.normalize(torch.randn(6, 8), dim=-1)
    cache = DatabaseCache(np.arange(6), np.zeros(6))
    cache.update(emb, epoch=0)
    views = F.normalize(torch.randn(1, 2, 8), dim=-1).requires_grad_(True)
    out = DMCACLoss(8, 2)(views, cache.embeddings[None], torch.ones(1, 6, dtype=torch.bool), torch.tensor([1]))
    out["loss"].backward()  # would fail on an inference tensor saved for backward
    assert views.grad is not None and not cache.embeddings.requires_grad


def test_plain_ce_needs_no_context():
    torch.manual_seed(0)
    loss = DMCACLoss(8, 3, Betas(0, 1, 0))
    views = F.normalize(torch.randn(4, 1, 8), dim=-1)
    out = loss(views, None, None, torch.tensor([0, 1, 2, 0]))
    assert not loss.needs_context
    assert torch.allclose(out["loss"], F.cross_entropy(loss.ce_head(views[:, 0]), torch.tensor([0, 1, 2, 0])))
    with pytest.raises(ConfigError, match="context"):
        DMCACLoss(8, 3)(views, None, None, torch.tensor([0, 1, 2, 0]))


def test_query_epochs_cover_every_query_once_and_repeat():
    from training.dmcac.sampler import QueryEpochSampler

    queries = np.arange(0, 40, 2)  # 20 queries
    s = QueryEpochSampler(queries, batch_size=3, accum=2, seed=4)
    assert s.steps_per_epoch == 3  # 20 // 6; the last 2 queries of each epoch are dropped
    epoch0 = [i for step in range(3) for micro in range(2) for i, _ in s.batch(step, micro)]
    assert len(epoch0) == len(set(epoch0)) == 18 and set(epoch0) <= set(queries)
    epoch1 = [i for step in range(3, 6) for micro in range(2) for i, _ in s.batch(step, micro)]
    assert epoch1 != epoch0 and s.epoch_of(3) == 1 and s.epoch_of(2) == 0
    assert s.batch(4, 1) == s.batch(4, 1) and s.batch(4, 1) != QueryEpochSampler(queries, 3, 2, seed=5).batch(4, 1)
    with pytest.raises(ConfigError, match="lower --batch-size"):
        QueryEpochSampler(queries, batch_size=21)


def test_views_are_the_original_then_seeded_augmentations():
    from PIL import Image

    from regis.models.encoder import build_encoder
    from regis.models.transforms import eval_transform
    from training.data.images import ImageArray
    from training.dmcac.views import MultiViewImages, augmented_view_transform

    cfg = build_encoder("vit-tiny-reg4-test", random_init=True).config
    pixels = np.random.default_rng(0).integers(0, 256, size=(3, 40, 40, 3), dtype=np.uint8)
    data = MultiViewImages(ImageArray(pixels, [5, 6, 5]), np.array([0, 1, 0]), 4, eval_transform(cfg),
                           augmented_view_transform(cfg))
    views, label, index = data[(1, 123)]
    assert views.shape == (4, 3, 64, 64) and label == 1 and index == 1
    assert torch.equal(views[0], eval_transform(cfg)(Image.fromarray(pixels[1])))
    assert not torch.equal(views[1], views[2])
    before = torch.get_rng_state()
    assert torch.equal(data[(1, 123)][0], views) and not torch.equal(data[(1, 124)][0][1:], views[1:])
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is untouched
