"""Match explanations: why a result scored what it did under MaxSim (METHODS.md section 1).

    S(Q, D) = sum_i max_j q_i . d_j

Each query token i contributes one term: its best similarity over the result's tokens. An explanation
lists, per query token, which result token j* = argmax_j q_i . d_j it matched (first index on ties, as the
score's max), the similarity q_i . d_j* (a cosine in [-1, 1]: tokens are unit-norm), its contribution to the
score (the term it adds; the contributions sum to S) and its share (contribution / S, summing to 1). ROI
tokens also carry the box of their N x N patch window in the image's own pixels (``regis.models.geometry``).
Two framings per image scored apart ("center-crop+aspect", framing score "best"): each query token matches
the result's tokens of its own framing, the score is the better framing's MaxSim, and only that framing's query
tokens contribute (the explanation names it). The pair view adds a patch-level heatmap: the cosine of each query
token with every patch of the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from regis.errors import ConfigError
from regis.models.geometry import (
    Box,
    buddy_grid,
    crop_region,
    grid_box,
    is_two_framings,
    nominal_grid,
    window_bounds,
)
from regis.scores.framings import framing_split

# The framings of "center-crop+aspect", in their token order: the names of token prefixes and of the framing
# an explanation says won (framings scored apart).
FRAMING_NAMES = ("crop", "whole")


@dataclass(frozen=True)
class TokenMatches:
    """The MaxSim terms of one (query, result) pair.

    Attributes:
        best: (m,) int64, the result token each query token matched (argmax, first on ties).
        similarity: (m,) float32, q_i . d_best[i] (cosine of unit-norm tokens, in [-1, 1]).
        contribution: (m,) float32, the term each query token adds to the score (= similarity).
        share: (m,) float32, contribution / score (sums to 1; all 0 when the score is 0).
        score: the MaxSim score, sum of the contributions (float).
        framing: with framings scored apart, the framing whose MaxSim is the score (0: the first; on a tie the
            first; or the one ``token_matches`` was asked for); 0 otherwise.
        framing_scores: (F,) float64, each framing's MaxSim (framings scored apart), or (1,) the score.
    """

    best: np.ndarray
    similarity: np.ndarray
    contribution: np.ndarray
    share: np.ndarray
    score: float
    framing: int = 0
    framing_scores: np.ndarray | None = None


def token_matches(query: np.ndarray, doc: np.ndarray, framings: int = 1) -> TokenMatches:
    """Explain MaxSim(query, doc) term by term.

    Args:
        query: (m, D) float query tokens (unit-norm).
        doc: (n, D) float result tokens (float16 from the store is upcast to float32, as the rerank does).
        framings: > 1: both sides' tokens are that many framings' equal blocks, scored apart
            (``EncoderConfig.score_framings``; ``regis.scores.framings.framing_blocks``): a query token matches only
            the result's tokens of its own framing (the others' similarities are -inf to it), the score is the
            best framing's MaxSim, and only that framing's query tokens contribute (the others: 0).

    Returns:
        ``TokenMatches``; its ``score`` equals the search's MaxSim score up to float32 summation order.

    Raises:
        ConfigError: shapes that are not (m, D) and (n, D) with the same D, an empty side, or token counts that
            do not split into ``framings``.
    """
    query = np.asarray(query, dtype=np.float32)
    doc = np.asarray(doc, dtype=np.float32)
    if query.ndim != 2 or doc.ndim != 2 or query.shape[1] != doc.shape[1] or not len(query) or not len(doc):
        raise ConfigError(f"need (m, D) query and (n, D) result tokens, got {query.shape} and {doc.shape}")
    mf, nf = framing_split(len(query), len(doc), framings)
    sims = query @ doc.T
    qf = np.arange(len(query)) // mf  # each token's framing
    df = np.arange(len(doc)) // nf
    sims = np.where(qf[:, None] == df[None, :], sims, -np.inf)  # another framing's tokens: -inf, never 0
    best = sims.argmax(axis=1)
    similarity = sims[np.arange(len(query)), best]
    per = np.array([similarity[qf == f].sum(dtype=np.float64) for f in range(framings)])
    framing = int(per.argmax())
    contribution = np.where(qf == framing, similarity, 0.0).astype(np.float32)
    score = float(contribution.sum(dtype=np.float64))
    share = contribution / score if score != 0 else np.zeros_like(contribution)
    return TokenMatches(best.astype(np.int64), similarity, contribution, share.astype(np.float32), score, framing,
                        per)


def token_names(num_registers: int, tokens_per_image: int, framings: int = 1) -> list[tuple[str, str]]:
    """(name, kind) of each token position of the layout [CLS, reg_1..reg_R, ROI_cls, ROI_reg_1..ROI_reg_R],
    followed, for a query of the "tokens+roi-cues" layout (``EncoderConfig.query_layout``), by the cue tokens of
    the CNN's smaller ROI pass.

    kind is "cls", "register" or "roi"; names are "cls", "reg1".., "roi-cls", "roi-reg1"..., then "pass2-cls",
    "pass2-reg1"... (kinds "cls" and "register"). For CNN backbones "cls" is the global pool (GeM, or mean for
    encoders made before it) and the registers are part tokens (``regis.models.cues``).

    ``framings`` 2 ("center-crop+aspect"): the first half's names get the prefix "crop-" (the central square), the
    second half's "whole-" (the whole image).

    Raises:
        ConfigError: ``framings`` 2 and a token count that is not two equal blocks
            (``regis.scores.framings.framing_split``).
    """
    if framings == 2:
        half = token_names(num_registers, framing_split(tokens_per_image, tokens_per_image, framings)[0])
        return [(f"{FRAMING_NAMES[0]}-{n}", k) for n, k in half] + [(f"{FRAMING_NAMES[1]}-{n}", k) for n, k in half]
    r = num_registers
    cues = ["cls", *[f"reg{i}" for i in range(1, r + 1)]]
    out = [(name, "cls" if name == "cls" else "register") for name in cues]
    out += [(f"roi-{name}", "roi") for name in cues]
    out += [(f"pass2-{name}", kind) for name, kind in out[: r + 1]]
    return out[:tokens_per_image]


def roi_cue(position: int, num_registers: int) -> int | None:
    """The cue (0 = CLS, 1..R = registers) whose ROI token sits at ``position``; None for a non-ROI token."""
    c = position - (num_registers + 1)
    return c if 0 <= c <= num_registers else None


def token_box(
    config, grid: tuple[int, int], buddies: np.ndarray | None, position: int, width: int, height: int,
    count: int | None = None,
) -> Box | None:
    """The box of a ROI token's N x N window in an image's own pixels.

    Args:
        config: the ``EncoderConfig`` (R, N, border, resize and crop sizes).
        grid: (h, w) patch grid the buddies index (an "aspect" CNN: ignored, each image's buddies index its
            own grid, ``regis.models.geometry.buddy_grid``).
        buddies: (R + 1,) int, the image's buddy patches (-1: unknown), or None when the index has none.
        position: token position in the layout.
        width, height: the image's size, pixels.
        count: how many tokens the layout ``position`` counts in has (a query's m, or T: the default); matters
            only for two framings ("center-crop+aspect": each framing's tokens and R + 1 buddies one after the
            other, the central square's first, on the square grid ``nominal_grid`` over ``crop_region``).

    Returns:
        (x0, y0, x1, y1) float pixels (ends exclusive), or None for a CLS / register token or an unknown buddy.

    Raises:
        ConfigError: two framings and ``count`` or T not ``config.framings`` equal blocks
            (``regis.scores.framings.framing_split``).
    """
    framing, region = 0, None
    if is_two_framings(config):
        per = framing_split(count or config.tokens_per_image, config.tokens_per_image, config.framings)[0]
        framing, position = divmod(position, per)
    cue = roi_cue(position, config.num_registers)
    if cue is not None:
        cue += framing * (config.num_registers + 1)
    if cue is None or buddies is None or cue >= len(buddies) or int(buddies[cue]) < 0:
        return None
    if is_two_framings(config) and framing == 0:  # the central square: a square grid over crop_region
        grid, region = nominal_grid(config), crop_region(config, width, height)
    else:
        grid = buddy_grid(config, grid, width, height)  # an "aspect" CNN: the image's own grid
    window = window_bounds(int(buddies[cue]), grid, config.roi_size, config.border)
    return grid_box(config, grid, window, width, height, region=region)


def patch_heatmap(query: np.ndarray, patches: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Cosine similarity of each query token with every patch of an image.

    Args:
        query: (m, D) float unit-norm query tokens.
        patches: (h * w, D) float patch tokens of the result, row-major (any norm; normalised here).
        grid: (h, w).

    Returns:
        (m, h, w) float32 cosines in [-1, 1].

    Raises:
        ConfigError: the patches do not fill the grid or widths differ.
    """
    h, w = grid
    patches = np.asarray(patches, dtype=np.float32)
    if patches.shape[0] != h * w or patches.shape[1] != np.shape(query)[1]:
        raise ConfigError(f"{patches.shape} patch tokens do not fill a {h} x {w} grid of width {np.shape(query)[1]}")
    unit = patches / np.maximum(np.linalg.norm(patches, axis=1, keepdims=True), 1e-12)
    q = np.asarray(query, dtype=np.float32)
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    return (q @ unit.T).reshape(len(q), h, w)
