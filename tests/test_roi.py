"""METHODS.md section 1 invariants of buddy patches and ROI tokens."""

import pytest
import torch

from regis.errors import ConfigError
from regis.models.roi import buddy_patches, roi_tokens, window_matrix


def _patches(h, w, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, h * w, d, generator=g)


def _cue_pointing_at(patches, j):
    """A cue whose raw dot product is maximal at patch j: patch j gets a large first component (in place)."""
    patches[:, j, 0] = 1000.0
    cue = torch.zeros(1, 1, patches.shape[-1])
    cue[..., 0] = 1.0
    return cue


@pytest.mark.parametrize("j, expected", [(0, 4), (3, 4), (12, 4), (15, 4), (1, 6), (4, 6), (7, 6), (5, 9), (10, 9)])
def test_clipped_window_sizes_on_a_4x4_grid(j, expected):
    w = window_matrix((4, 4), 3)
    assert int((w[j] > 0).sum()) == expected
    assert torch.allclose(w[j].sum(), torch.tensor(1.0))


def test_corner_buddy_averages_exactly_four_patches():
    patches = _patches(5, 5)
    roi = roi_tokens(_cue_pointing_at(patches, 0), patches, (5, 5), n=3)
    idx = [0, 1, 5, 6]  # (0,0), (0,1), (1,0), (1,1)
    assert torch.allclose(roi[0, 0], patches[0, idx].mean(0), atol=1e-6)


def test_interior_and_edge_windows():
    patches = _patches(5, 5, seed=1)
    interior = roi_tokens(_cue_pointing_at(patches, 12), patches, (5, 5), n=3)  # centre (2,2)
    expected = patches[0, [6, 7, 8, 11, 12, 13, 16, 17, 18]].mean(0)
    assert torch.allclose(interior[0, 0], expected, atol=1e-6)
    edge = roi_tokens(_cue_pointing_at(patches, 2), patches, (5, 5), n=3)  # top edge (0,2)
    assert torch.allclose(edge[0, 0], patches[0, [1, 2, 3, 6, 7, 8]].mean(0), atol=1e-6)


def test_n1_gives_the_buddy_patch_itself():
    patches = _patches(4, 6, seed=2)
    cues = torch.randn(1, 5, 4)
    buddy = buddy_patches(cues, patches)
    roi = roi_tokens(cues, patches, (4, 6), n=1)
    assert torch.allclose(roi[0], patches[0, buddy[0]])


def test_window_covering_the_grid_gives_the_mean_of_all_patches():
    patches = _patches(3, 3, seed=3)
    cues = torch.randn(1, 5, 4)
    roi = roi_tokens(cues, patches, (3, 3), n=7)
    assert torch.allclose(roi[0], patches[0].mean(0).expand(5, -1), atol=1e-6)


def test_buddy_uses_raw_dot_product_not_cosine():
    # patch 0 is most similar in direction, patch 1 has the larger raw dot product
    patches = torch.tensor([[[1.0, 0.0], [3.0, 3.0]]])
    cue = torch.tensor([[[1.0, 0.0]]])
    assert buddy_patches(cue, patches).item() == 1


def test_ties_resolve_to_the_first_index():
    patches = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]])
    cue = torch.tensor([[[1.0, 0.0]]])
    assert buddy_patches(cue, patches).item() == 1


@pytest.mark.parametrize("n", [0, 2, 4, -1])
def test_even_or_nonpositive_n_is_rejected(n):
    with pytest.raises(ConfigError, match="odd"):
        window_matrix((4, 4), n)


def test_shift_keeps_full_windows_at_the_border():
    w = window_matrix((5, 5), 3, border="shift")
    assert int((w[0] > 0).sum()) == 9  # corner buddy: window slid inside the grid
    assert int((w[12] > 0).sum()) == 9
    assert torch.equal(w[12], window_matrix((5, 5), 3)[12])  # interior unchanged


def test_gradient_flows_into_pooled_patches_not_through_argmax():
    patches = _patches(4, 4, seed=4).requires_grad_(True)
    cues = torch.randn(1, 2, 4, requires_grad=True)
    roi_tokens(cues, patches, (4, 4), n=3).sum().backward()
    assert patches.grad is not None and patches.grad.abs().sum() > 0
    assert cues.grad is None  # the cue only picks the window (argmax); its value is not pooled
