"""Buddy patches and ROI tokens (METHODS.md section 1, steps 2-4).

For each cue token c (CLS or a register) the buddy patch is j* = argmax_j c . t_patch_j (raw dot product,
ties resolve to the first index) and the ROI token is the mean of the patch tokens in the N x N window
centred on j*. At the grid border the window is clipped by default (a corner buddy with N = 3 averages 4
patches, an edge buddy 6, an interior one 9); ``border="shift"`` instead slides the window inside the grid so
it keeps N x N patches whenever the grid is at least N wide.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from regis.errors import ConfigError
from regis.models.config import BORDER_MODES, check_roi_size  # noqa: F401  (re-exported)
from regis.models.geometry import window_bounds, window_span  # noqa: F401  (window_bounds re-exported)


@lru_cache(maxsize=32)
def _window_matrix_cpu(h: int, w: int, n: int, border: str) -> torch.Tensor:
    p = h * w
    mat = torch.zeros(p, p, dtype=torch.float32)
    for j in range(p):
        r, c = divmod(j, w)
        r0, r1 = window_span(r, n, h, border)
        c0, c1 = window_span(c, n, w, border)
        block = torch.zeros(h, w)
        block[r0:r1, c0:c1] = 1.0
        mat[j] = block.flatten() / block.sum()
    return mat


def window_matrix(
    grid: tuple[int, int], n: int, border: str = "clip", device: torch.device | str | None = None
) -> torch.Tensor:
    """Averaging weights of the N x N window around every patch.

    Args:
        grid: (h, w) patch grid, patches in row-major order.
        n: window size N (odd, >= 1).
        border: "clip" (drop out-of-grid patches) or "shift" (slide the window inside the grid).
        device: where to put the matrix.

    Returns:
        (h*w, h*w) float32; row j holds 1/|window(j)| on the patches of the window centred on j, 0 elsewhere.

    Raises:
        ConfigError: even or non-positive N, unknown border mode, empty grid.
    """
    check_roi_size(n)
    if border not in BORDER_MODES:
        raise ConfigError(f"border must be one of {BORDER_MODES}, got {border!r}")
    h, w = int(grid[0]), int(grid[1])
    if h < 1 or w < 1:
        raise ConfigError(f"patch grid must be at least 1 x 1, got {h} x {w}")
    mat = _window_matrix_cpu(h, w, n, border)
    return mat if device is None else mat.to(device)


def buddy_patches(cues: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
    """Index of each cue's buddy patch: argmax of the raw dot product, first index on ties.

    Args:
        cues: (B, C, D) float cue tokens.
        patches: (B, P, D) float patch tokens.

    Returns:
        (B, C) int64 patch indices in [0, P).
    """
    sims = torch.einsum("bcd,bpd->bcp", cues, patches)
    # torch.argmax returns the first maximal index; computed without gradient (the argmax is not differentiable).
    return sims.detach().float().argmax(dim=-1)


def roi_tokens(
    cues: torch.Tensor,
    patches: torch.Tensor,
    grid: tuple[int, int],
    n: int = 3,
    border: str = "clip",
) -> torch.Tensor:
    """ROI tokens: for each cue, the mean of the N x N patch window around its buddy patch.

    Args:
        cues: (B, C, D) float cue tokens (CLS + registers, or a CNN's cues).
        patches: (B, P, D) float patch tokens, row-major on ``grid``; P must equal h * w.
        grid: (h, w) patch grid.
        n: window size N (odd, >= 1; default 3).
        border: "clip" (default) or "shift".

    Returns:
        (B, C, D) ROI tokens, not normalised, dtype of ``patches``. Gradients flow into the pooled patches
        (and not through the argmax).

    Raises:
        ConfigError: bad N / border, or P != h * w.
    """
    h, w = grid
    if patches.shape[1] != h * w:
        raise ConfigError(f"{patches.shape[1]} patch tokens do not fill a {h} x {w} grid")
    weights = window_matrix(grid, n, border, device=patches.device).to(patches.dtype)
    buddy = buddy_patches(cues, patches)  # (B, C)
    return torch.bmm(weights[buddy], patches)  # (B, C, P) @ (B, P, D)
