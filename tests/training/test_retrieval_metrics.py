"""Recall@K, mAP@R and R-precision against hand-worked examples; neighbour search (leave-one-out and
query vs gallery); single- vs multi-vector scoring."""

import numpy as np
import pytest
import torch

from regis.errors import ConfigError
from training.evaluation.metrics import map_at_r, r_precision, recall_at_k, relevance
from training.evaluation.retrieval import nearest_neighbours, retrieval_metrics

# Three queries, three ranked neighbours each; R = same-label items in the gallery.
HITS = np.array([[False, True, True], [True, False, False], [False, False, True]])
R = np.array([2, 1, 2])


def test_recall_at_k_by_hand():
    assert recall_at_k(HITS, 1) == pytest.approx(1 / 3)
    assert recall_at_k(HITS, 2) == pytest.approx(2 / 3)
    assert recall_at_k(HITS, 3) == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        recall_at_k(HITS, 4)


def test_r_precision_by_hand():
    # q0: 1 of its top 2; q1: 1 of its top 1; q2: 0 of its top 2 -> (0.5 + 1 + 0) / 3
    assert r_precision(HITS, R) == pytest.approx(0.5)


def test_map_at_r_by_hand():
    # q0: relevant at rank 2 only within R = 2 -> (P(2) = 1/2) / 2 = 0.25; q1: P(1) = 1 -> 1; q2: 0.
    assert map_at_r(HITS, R) == pytest.approx((0.25 + 1.0 + 0.0) / 3)


def test_map_at_r_musgrave_style_example():
    # R = 4, relevant at ranks 1, 3, 4 (rank 5 is beyond R): (1/1 + 2/3 + 3/4) / 4
    hits = np.array([[True, False, True, True, True]])
    assert map_at_r(hits, np.array([4])) == pytest.approx((1 + 2 / 3 + 3 / 4) / 4)
    assert r_precision(hits, np.array([4])) == pytest.approx(3 / 4)


def test_metrics_reject_bad_r():
    with pytest.raises(ConfigError, match="R >= 1"):
        map_at_r(HITS, np.array([2, 0, 1]))
    with pytest.raises(ConfigError, match="ranked neighbours"):
        r_precision(HITS, np.array([4, 1, 1]))


def test_relevance():
    assert relevance(np.array([[1, 2], [3, 3]]), np.array([2, 3])).tolist() == [[False, True], [True, True]]


def _unit(rows):
    return torch.nn.functional.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


# Two 2-D tokens per image; labels [0, 0, 1, 1]. Single-vector (token 0, cosine) ranks image 2 first for
# query 0 (0.8 > 0.6); MaxSim ranks image 1 first: S(0,1) = 0.6 + 1 = 1.6, S(0,2) = 0.8 + 0.6 = 1.4, S(0,3) = 0.6 + 0.
TOKENS = _unit([
    [[1.0, 0.0], [0.0, 1.0]],
    [[0.6, 0.8], [0.0, 1.0]],
    [[0.8, 0.6], [-1.0, 0.0]],
    [[0.6, -0.8], [-1.0, 0.0]],
])
LABELS = np.array([0, 0, 1, 1])


def test_nearest_neighbours_leave_one_out_single_and_multi():
    s_scores, s_idx = nearest_neighbours(TOKENS, TOKENS, 3, "single", leave_one_out=True)
    m_scores, m_idx = nearest_neighbours(TOKENS, TOKENS, 3, "multi", leave_one_out=True)
    assert s_idx[0].tolist() == [2, 1, 3]  # 0.8, then the 0.6 tie in index order
    assert m_idx[0].tolist() == [1, 2, 3]
    assert m_scores[0].tolist() == pytest.approx([1.6, 1.4, 0.6])
    for row in range(4):  # never its own neighbour
        assert row not in s_idx[row].tolist() and row not in m_idx[row].tolist()
    with pytest.raises(ConfigError):
        nearest_neighbours(TOKENS, TOKENS, 4, "multi", leave_one_out=True)


def test_nearest_neighbours_query_gallery_keeps_identical_items():
    _, idx = nearest_neighbours(TOKENS[:1], TOKENS, 2, "multi", leave_one_out=False)
    assert idx[0].tolist() == [0, 1]  # the query's twin in the gallery is a legitimate hit


def test_retrieval_metrics_single_vs_multi():
    report = retrieval_metrics(TOKENS, LABELS, None, None, (1, 2))
    assert report["protocol"] == "leave-one-out" and report["queries_without_relevant"] == 0
    # Multi-vector: query 0 -> 1 (hit); by symmetry of construction check every query by brute force.
    for scoring in ("single", "multi"):
        _, idx = nearest_neighbours(TOKENS, TOKENS, 1, scoring, leave_one_out=True)
        expected = float(np.mean(LABELS[idx[:, 0].numpy()] == LABELS))
        assert report[scoring]["recall@1"] == pytest.approx(expected)
    assert report["multi"]["recall@1"] > report["single"]["recall@1"]


def test_retrieval_metrics_drops_queries_without_relevant_items():
    report = retrieval_metrics(TOKENS, np.array([0, 0, 1, 2]), None, None, (1,))
    assert report["queries_without_relevant"] == 2
    assert report["multi"]["recall@1"] == 1.0  # queries 0 and 1 find each other under MaxSim


def test_retrieval_metrics_query_gallery():
    report = retrieval_metrics(TOKENS[:2], LABELS[:2], TOKENS[2:], LABELS[2:] - 1, (1,))
    # gallery labels [0, 0]: both queries have R = 2 relevant items, everything is a hit
    assert report["protocol"] == "query-gallery"
    assert report["multi"] == {"recall@1": 1.0, "map@r": 1.0, "r_precision": 1.0}
    with pytest.raises(ConfigError, match="Recall@3"):
        retrieval_metrics(TOKENS[:2], LABELS[:2], TOKENS[2:], LABELS[2:] - 1, (3,))
