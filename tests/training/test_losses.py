"""The multi-vector triplet loss, the miners and the reducers against hand computations."""

import pytest
import torch
import torch.nn.functional as F

from regis.errors import ConfigError
from training.losses.miners import batch_hard, given_triplets, semi_hard
from training.losses.reducers import reduce_losses
from training.losses.scores import maxsim_matrix
from training.losses.triplet import multi_vector_triplet_loss, triplet_margin_losses


def test_margin_loss_by_hand():
    pos = torch.tensor([1.5, 1.0, 0.3])
    neg = torch.tensor([0.5, 0.9, 0.6])
    # max(0, 0.2 + neg - pos): 0.2 + 0.5 - 1.5 < 0 -> 0; 0.2 + 0.9 - 1.0 = 0.1; 0.2 + 0.6 - 0.3 = 0.5
    assert torch.allclose(triplet_margin_losses(pos, neg, 0.2), torch.tensor([0.0, 0.1, 0.5]))
    with pytest.raises(ConfigError):
        triplet_margin_losses(pos, neg[:2])


def test_reducers():
    losses = torch.tensor([0.0, 0.1, 0.5])
    assert reduce_losses(losses, "mean").item() == pytest.approx(0.2)
    assert reduce_losses(losses, "mean-nonzero").item() == pytest.approx(0.3)
    assert reduce_losses(torch.zeros(3), "mean-nonzero").item() == 0.0
    with pytest.raises(ConfigError, match="reducer"):
        reduce_losses(losses, "sum")


def _tokens(rows):
    return F.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


def test_random_triplet_loss_matches_hand_maxsim():
    # Three images of 2 tokens in 2-D: anchor, positive, negative (layout [a, p, n] with T = 1).
    a = [[1.0, 0.0], [0.0, 1.0]]
    p = [[0.6, 0.8], [1.0, 0.0]]
    n = [[0.8, 0.6], [0.8, -0.6]]
    tokens = _tokens([a, p, n])
    # S(a, p): token (1,0) best matches (1,0) -> 1; token (0,1) best matches (0.6,0.8) -> 0.8; S = 1.8.
    # S(a, n): (1,0) -> 0.8; (0,1) -> 0.6; S = 1.4.  Loss = max(0, 0.2 + 1.4 - 1.8) = 0.
    out = multi_vector_triplet_loss(tokens, torch.tensor([0, 0, 1]), miner=None, margin=0.2)
    assert out.pos_score == pytest.approx(1.8)
    assert out.neg_score == pytest.approx(1.4)
    assert out.loss.item() == pytest.approx(0.0)
    out = multi_vector_triplet_loss(tokens, torch.tensor([0, 0, 1]), miner=None, margin=0.5)
    assert out.loss.item() == pytest.approx(0.1, abs=1e-6)
    assert out.num_triplets == 1 and out.active_fraction == 1.0


def test_loss_gradient_reaches_the_tokens():
    tokens = torch.randn(6, 3, 4, requires_grad=True)
    unit = F.normalize(tokens, dim=-1)
    out = multi_vector_triplet_loss(unit, torch.tensor([0, 0, 1, 1, 2, 2]), miner="batch-hard", margin=10.0)
    out.loss.backward()
    assert out.loss.item() > 0
    assert tokens.grad is not None and tokens.grad.abs().sum() > 0


def test_maxsim_matrix_diagonal_is_token_count():
    tokens = F.normalize(torch.randn(5, 4, 8), dim=-1)
    s = maxsim_matrix(tokens)
    assert s.shape == (5, 5)
    assert torch.allclose(s.diagonal(), torch.full((5,), 4.0), atol=1e-5)


SCORES = torch.tensor(
    [
        # labels: 0    0    0    1    1
        [9.0, 0.9, 0.5, 0.7, 0.2],  # anchor 0: positives 1 (0.9), 2 (0.5) -> hardest 2; negatives 3 (0.7), 4 -> 3
        [0.4, 9.0, 0.8, 0.1, 0.6],  # anchor 1: positives 0 (0.4), 2 (0.8) -> 0; negatives 3 (0.1), 4 (0.6) -> 4
        [0.3, 0.3, 9.0, 0.9, 0.9],  # anchor 2: positive tie 0/1 -> first (0); negative tie 3/4 -> first (3)
        [0.1, 0.2, 0.3, 9.0, 0.5],  # anchor 3: positive 4; negatives 0, 1, 2 -> hardest 2 (0.3)
        [0.6, 0.2, 0.1, 0.4, 9.0],  # anchor 4: positive 3; hardest negative 0 (0.6)
    ]
)
LABELS = torch.tensor([0, 0, 0, 1, 1])


def test_batch_hard_picks_hardest_pairs():
    t = batch_hard(SCORES, LABELS)
    assert t.anchors.tolist() == [0, 1, 2, 3, 4]
    assert t.positives.tolist() == [2, 0, 0, 4, 3]
    assert t.negatives.tolist() == [3, 4, 3, 2, 0]


def test_batch_hard_drops_anchors_without_positive():
    labels = torch.tensor([0, 0, 0, 1, 2])  # anchors 3 and 4 have no positive
    t = batch_hard(SCORES, labels)
    assert t.anchors.tolist() == [0, 1, 2]


def test_batch_hard_hinges_by_hand():
    out = multi_vector_triplet_loss(torch.zeros(5, 1, 2), LABELS, miner="batch-hard")  # smoke of the shape path
    assert out.num_triplets == 5
    # By hand on SCORES with margin 0.2: anchors 0..4 -> max(0, .2 + .7 - .5) = .4, max(0, .2 + .6 - .4) = .4,
    # max(0, .2 + .9 - .3) = .8, max(0, .2 + .3 - .5) = 0, max(0, .2 + .6 - .4) = .4 -> mean 0.4
    t = batch_hard(SCORES, LABELS)
    losses = triplet_margin_losses(SCORES[t.anchors, t.positives], SCORES[t.anchors, t.negatives], 0.2)
    assert losses.tolist() == pytest.approx([0.4, 0.4, 0.8, 0.0, 0.4])


def test_semi_hard_choice():
    t = semi_hard(SCORES, LABELS, margin=0.2)
    pairs = {(a, p): n for a, p, n in zip(t.anchors.tolist(), t.positives.tolist(), t.negatives.tolist(), strict=True)}
    assert set(pairs) == {(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (3, 4), (4, 3)}
    assert pairs[(0, 1)] == 3  # S(0,1) = .9: negatives below it: 3 (.7), 4 (.2) -> hardest 3
    assert pairs[(0, 2)] == 4  # S(0,2) = .5: only 4 (.2) is below
    assert pairs[(1, 0)] == 3  # S(1,0) = .4: only 3 (.1) is below
    assert pairs[(2, 0)] == 3  # S(2,0) = .3: no negative below (both .9) -> the easiest, first on ties (3)
    assert pairs[(3, 4)] == 2  # S(3,4) = .5: negatives .1, .2, .3 all below -> hardest 2
    assert pairs[(4, 3)] == 1  # S(4,3) = .4: negatives 0 (.6), 1 (.2), 2 (.1) -> below: 1, 2 -> hardest 1


def test_given_triplets_layout():
    t = given_triplets(3)
    assert t.anchors.tolist() == [0, 1, 2] and t.positives.tolist() == [3, 4, 5] and t.negatives.tolist() == [6, 7, 8]
    with pytest.raises(ConfigError):
        multi_vector_triplet_loss(torch.zeros(4, 1, 2), torch.zeros(4, dtype=torch.long), miner=None)
    with pytest.raises(ConfigError, match="miner"):
        multi_vector_triplet_loss(torch.zeros(4, 1, 2), torch.zeros(4, dtype=torch.long), miner="hardest")
