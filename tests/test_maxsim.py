"""MaxSim scoring (METHODS.md section 1): invariants and agreement with a per-pair loop."""

import torch
import torch.nn.functional as F

from regis.scores.maxsim import maxsim_paired, maxsim_scores


def _unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def _loop_maxsim(q, d):
    return sum(max(float(q[i] @ d[j]) for j in range(d.shape[0])) for i in range(q.shape[0]))


def test_self_score_equals_number_of_query_tokens():
    q = _unit(10, 16)
    assert torch.isclose(maxsim_scores(q, q[None])[0], torch.tensor(10.0), atol=1e-5)


def test_batched_scores_equal_a_per_pair_loop():
    queries, docs = _unit(3, 10, 8, seed=1), _unit(7, 10, 8, seed=2)
    batched = maxsim_scores(queries, docs, chunk_size=3)
    for a in range(3):
        for b in range(7):
            assert abs(batched[a, b].item() - _loop_maxsim(queries[a], docs[b])) < 1e-5


def test_scores_are_asymmetric_and_bounded():
    q, d = _unit(2, 8, seed=3), _unit(6, 8, seed=4)
    s_qd = maxsim_scores(q, d[None])[0].item()
    s_dq = maxsim_scores(d, q[None])[0].item()
    assert abs(s_qd - s_dq) > 1e-4
    assert -2 <= s_qd <= 2


def test_padding_is_masked_with_minus_infinity_not_zero():
    # a query token whose similarities to every real document token are negative
    q = torch.tensor([[[1.0, 0.0]]])
    real = torch.tensor([[-1.0, 0.0], [-0.6, -0.8]])
    docs = torch.zeros(1, 3, 2)
    docs[0, :2] = real
    mask = torch.tensor([[True, True, False]])
    score = maxsim_scores(q, docs, doc_mask=mask)
    assert torch.isclose(score, torch.tensor([[-0.6]])).all()  # masking with 0 would give 0.0
    assert torch.isclose(maxsim_paired(q, docs, doc_mask=mask), torch.tensor([-0.6])).all()


def test_padded_query_tokens_add_nothing():
    q = _unit(1, 4, 8, seed=5)
    d = _unit(5, 6, 8, seed=6)
    qmask = torch.tensor([[True, True, False, False]])
    full = maxsim_scores(q[:, :2], d)
    masked = maxsim_scores(q, d, query_mask=qmask)
    assert torch.allclose(full, masked, atol=1e-6)


def test_paired_matches_all_pairs_diagonal():
    q, d = _unit(4, 10, 8, seed=7), _unit(4, 10, 8, seed=8)
    assert torch.allclose(maxsim_paired(q, d), torch.diagonal(maxsim_scores(q, d)), atol=1e-6)


def test_float16_documents_are_upcast():
    q, d = _unit(2, 10, 16, seed=9), _unit(5, 10, 16, seed=10)
    s32 = maxsim_scores(q, d)
    s16 = maxsim_scores(q, d.half())
    assert s16.dtype == torch.float32
    assert torch.allclose(s32, s16, atol=5e-3)
