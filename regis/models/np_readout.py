"""A CNN encoder's query readout in numpy: feature maps -> unit-norm query tokens, without torch (the torch-free
query path, ``regis.models.query_bundle``).

The same steps, in the same order, as ``RegisEncoder.encode_query`` for a CNN whose cue method is "grid"
(``regis.models.cues``): cue tokens (global pool + grid cells, mean or GeM), buddy patches (argmax of the raw dot
product, first index on ties) and ROI tokens (mean of the N x N window around the buddy, ``window_span``) read
from the ROI pass's map (or the main one), the token head (``regis.models.head``: linear, plus the GELU branch
when it has one), L2 normalisation before and after the head, then the query layout's extra ROI-pass cue tokens.
Equal to the torch encoder to float32 rounding (tests/test_query_bundle.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from regis.errors import ConfigError
from regis.models.config import GEM_EPS, GEM_P, EncoderConfig
from regis.models.geometry import window_span


@dataclass(frozen=True)
class HeadWeights:
    """A token head's float32 weights (``regis.models.head.TokenHead``): ``lin_w`` (D', F), ``lin_b`` (D',);
    with an MLP branch ``fc1_w`` (H, F), ``fc1_b`` (H,), ``fc2_w`` (D', H), ``fc2_b`` (D',), else None."""

    lin_w: np.ndarray
    lin_b: np.ndarray
    fc1_w: np.ndarray | None = None
    fc1_b: np.ndarray | None = None
    fc2_w: np.ndarray | None = None
    fc2_b: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """(..., F) float32 -> (..., D') float32, not normalised."""
        out = x @ self.lin_w.T + self.lin_b
        if self.fc1_w is not None:
            hidden = x @ self.fc1_w.T + self.fc1_b
            erf = np.vectorize(math.erf, otypes=[np.float64])
            gelu = (0.5 * hidden * (1.0 + erf(hidden / math.sqrt(2.0)))).astype(np.float32)
            out = out + gelu @ self.fc2_w.T + self.fc2_b
        return out.astype(np.float32)


def unsupported_reason(config: EncoderConfig) -> str | None:
    """Why ``query_tokens`` cannot encode for ``config`` (None: it can): ViTs and the kmeans / attention cue
    methods stay on the torch path. "center-crop+aspect" is covered: ``query_tokens`` reads one framing, the
    caller (``query_bundle.OnnxQueryEncoder``) runs it on each and concatenates, as ``RegisEncoder`` does."""
    if config.kind != "cnn":
        return f"the numpy readout covers CNN backbones, not {config.kind} ({config.backbone})"
    if (config.cue_method or "grid") != "grid":
        return f"the numpy readout covers the grid cue method, not {config.cue_method}"
    if math.isqrt(config.num_registers) ** 2 != config.num_registers:
        return f"the grid cue method needs a square number of parts, got R = {config.num_registers}"
    return None


def normalize(x: np.ndarray) -> np.ndarray:
    """L2-normalise the last axis (``F.normalize``: norms below 1e-12 count as 1e-12)."""
    norms = np.sqrt(np.sum(x * x, axis=-1, keepdims=True, dtype=np.float32))
    return (x / np.maximum(norms, np.float32(1e-12))).astype(np.float32)


def _pool(x: np.ndarray, axes: tuple[int, ...], gem: bool) -> np.ndarray:
    if not gem:
        return x.mean(axis=axes, dtype=np.float32)
    cubed = np.power(np.maximum(x, np.float32(GEM_EPS)), np.float32(GEM_P))
    return np.power(cubed.mean(axis=axes, dtype=np.float32), np.float32(1.0 / GEM_P))


def cue_tokens(fmap: np.ndarray, r: int, pooling: str) -> np.ndarray:
    """The R + 1 cue tokens of feature maps: global pool, then the sqrt(R) x sqrt(R) grid cells (adaptive
    average pooling's cells: rows floor(i h / s) .. ceil((i + 1) h / s)), mean or GeM (``pooling``).

    Args:
        fmap: (B, D, h, w) float32.
        r: R, a square (or 0).
        pooling: "mean" or "gem".

    Returns:
        (B, R + 1, D) float32, not normalised.

    Raises:
        ConfigError: R not a square, or a map smaller than the grid.
    """
    gem = pooling == "gem"
    h, w = fmap.shape[-2:]
    out = [_pool(fmap, (2, 3), gem)]
    side = math.isqrt(r)
    if side * side != r:
        raise ConfigError(f"cue method 'grid' needs a square number of parts, got R = {r}")
    if r and (h < side or w < side):
        raise ConfigError(f"a {h} x {w} feature map cannot be split into {side} x {side} cells")
    for i in range(side if r else 0):
        r0, r1 = (i * h) // side, -((-(i + 1) * h) // side)
        for j in range(side):
            c0, c1 = (j * w) // side, -((-(j + 1) * w) // side)
            out.append(_pool(fmap[:, :, r0:r1, c0:c1], (2, 3), gem))
    return np.stack(out, axis=1)


def roi_tokens(cues: np.ndarray, fmap: np.ndarray, n: int, border: str) -> np.ndarray:
    """ROI tokens: each cue's buddy patch (argmax of the raw dot product with the map's patches, first on ties)
    and the mean of the N x N window around it (``window_span``).

    Args:
        cues: (B, C, D) float32 cue tokens of ``fmap``.
        fmap: (B, D, h, w) float32.
        n, border: the config's ``roi_size`` and ``border``.

    Returns:
        (B, C, D) float32, not normalised.
    """
    b, d, h, w = fmap.shape
    patches = fmap.reshape(b, d, h * w).transpose(0, 2, 1)  # (B, P, D)
    buddies = np.einsum("bcd,bpd->bcp", cues, patches).argmax(axis=-1)
    out = np.empty(cues.shape, dtype=np.float32)
    for bi in range(b):
        for ci, buddy in enumerate(buddies[bi].tolist()):
            row, col = divmod(buddy, w)
            r0, r1 = window_span(row, n, h, border)
            c0, c1 = window_span(col, n, w, border)
            out[bi, ci] = fmap[bi, :, r0:r1, c0:c1].reshape(d, -1).mean(axis=1, dtype=np.float32)
    return out


def project(tokens: np.ndarray, head: HeadWeights | None) -> np.ndarray:
    """``RegisEncoder.project``: normalise, through the head (if any), normalise again."""
    out = normalize(tokens)
    return out if head is None else normalize(head(out))


def query_tokens(config: EncoderConfig, fmap: np.ndarray, roi_fmap: np.ndarray | None,
                 head: HeadWeights | None) -> np.ndarray:
    """A query's tokens from the backbone's feature maps (``RegisEncoder.encode_query`` after the backbone), of
    one framing (``RegisEncoder._framed``'s readout; "center-crop+aspect": called once per framing).

    Args:
        config: the encoder's config (``unsupported_reason`` None).
        fmap: (B, F, h, w) float32 map of the ``image_size`` pass.
        roi_fmap: (B, F, h', w') float32 map of the ROI pass, or None when the config has none.
        head: the token head's weights, or None.

    Returns:
        (B, m, D) float32 unit-norm tokens, m = ``config.query_tokens_per_image``.

    Raises:
        ConfigError: the config needs a ROI pass and none is given, or a map too small for the grid.
    """
    r = config.num_registers
    cues = cue_tokens(fmap, r, config.cue_pooling)
    if config.token_set != "cls+reg+roi":
        return normalize(project(cues[:, : config.tokens_per_framing], head))
    if roi_fmap is None and config.roi_image_size is not None:
        raise ConfigError("this encoder reads its ROI tokens from a second pass: give its feature map")
    rcues = cue_tokens(roi_fmap, r, config.cue_pooling) if roi_fmap is not None else cues
    rois = roi_tokens(rcues, roi_fmap if roi_fmap is not None else fmap, config.roi_size, config.border)
    tokens = project(np.concatenate([cues, rois], axis=1), head)
    if config.query_layout != "tokens":
        tokens = np.concatenate([tokens, project(rcues, head)], axis=1)
    return normalize(tokens)
