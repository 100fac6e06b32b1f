"""Containment by template search: is one image, scaled, a window of the other, and which one?

Local features (``regis.duplicates.geometry``) miss most crops of small images: a 100 x 70 px crop of a 320 x 240
px photo, both brought to 640 px, has few keypoints in common with its container (on the labelled set, 29 of 31
crop pairs verification missed in a sample of 200 had a side under 330 px). A crop is, pixel for pixel, a window
of its container at one scale, so it can be found directly: the candidate crop, reduced to each of ``STEPS``
scales (its longer side relative to the container's fitting dimension, from ``MIN_FRACTION`` to 1), is slid over
the container (both grey, the container's longest side at most ``THUMB_SIDE`` px) and scored by normalised cross
correlation (OpenCV ``matchTemplate``, ``TM_CCOEFF_NORMED``: insensitive to brightness and contrast changes). The
best peak over the scales, searched both ways, says which image lies inside the other: the crop is found in its
container (NCC near 1) and the container is not found in the crop (it does not fit, or only a part of it does).
No rotation or perspective is searched: this finds crops and copies, not other shots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

THUMB_SIDE = 160  # pixels: the longest side of the grey copy searched in
STEPS = 20  # scales tried, geometric from MIN_FRACTION to 1
MIN_FRACTION = 0.25  # the smallest scale: the crop's side at 0.25 of the container's (an area of ~6 %)
MIN_TEMPLATE = 12  # pixels: templates with a shorter side are not tried
MIN_STD = 4.0  # grey levels: flat templates (a single colour) are not tried: their correlation means nothing
REFINE = 3  # scales searched again at full size: the best of the coarse pass (at half size)
REFINE_BELOW_RULE = 0.1  # a run searches a direction at full size only if its half-size peak reaches the crop
# rule's NCC (``template_ncc``) minus this (``refine_from``; ``finder.refine_bar``): every one of the labelled set's
# 18,110 searched pairs searched again so, every figure of both splits unchanged (crop rule, margin included) and
# the CPU per pair 6.5 -> 5.2 ms (python -m bench.duplicates_template_steps --variants 20r;
# docs/results/duplicates/template-refine-from.json)


@dataclass(frozen=True)
class Located:
    """Where the best window of a pair's template search lies.

    Attributes:
        ncc_ab: best normalised cross correlation of a (scaled) inside b, -1..1 (-1: not tried).
        ncc_ba: the same for b inside a.
        box: (4,) float32 (x0, y0, x1, y1) of the better direction's window in its container, normalised to
            [0, 1] of the container's width and height.
    """

    ncc_ab: float
    ncc_ba: float
    box: np.ndarray


def thumbnail(gray) -> np.ndarray:
    """A grey PIL image (``geometry.load_gray``'s) -> (h, w) float32 array, longest side at most ``THUMB_SIDE``."""
    import cv2

    arr = np.asarray(gray.convert("L"), dtype=np.float32)
    h, w = arr.shape
    f = THUMB_SIDE / max(h, w)
    if f < 1:
        arr = cv2.resize(arr, (max(1, round(w * f)), max(1, round(h * f))), interpolation=cv2.INTER_AREA)
    return arr


def _peak(cv2, small: np.ndarray, big: np.ndarray, f: float, min_side: int) -> tuple[float, np.ndarray] | None:
    """NCC peak of ``small`` at scale ``f`` (its fitting side at ``f`` of big's) in ``big``; None: not tried."""
    H, W = big.shape
    hs, ws = small.shape
    k = f * min(W / ws, H / hs)  # the template's scale: at f = 1 it fills one of big's dimensions
    wt, ht = int(round(ws * k)), int(round(hs * k))
    if min(wt, ht) < min_side or wt > W or ht > H:
        return None
    t = cv2.resize(small, (wt, ht), interpolation=cv2.INTER_AREA)
    if float(t.std()) < MIN_STD:
        return None
    _, peak, _, (x, y) = cv2.minMaxLoc(cv2.matchTemplate(big, t, cv2.TM_CCOEFF_NORMED))
    return float(peak), np.array([x / W, y / H, (x + wt) / W, (y + ht) / H], np.float32)


def _coarse(cv2, small: np.ndarray, big: np.ndarray, steps: int = STEPS, scales=None,
            div: int = 2) -> list[tuple[float, float, np.ndarray]]:
    """(peak, scale, window) of ``small`` in ``big`` reduced to 1 / ``div`` of its size (``search``'s first
    pass: half size), at ``steps`` scales geometric from ``MIN_FRACTION`` to 1 (or the ``scales`` given), best
    first."""
    small_big = cv2.resize(big, (max(1, big.shape[1] // div), max(1, big.shape[0] // div)),
                           interpolation=cv2.INTER_AREA)
    tried = np.geomspace(MIN_FRACTION, 1.0, steps) if scales is None else scales
    got = [(p[0], f, p[1]) for f in tried if (p := _peak(cv2, small, small_big, f, MIN_TEMPLATE // div)) is not None]
    return sorted(got, key=lambda x: (x[0], x[1]), reverse=True)


def _pyramid(cv2, small: np.ndarray, big: np.ndarray, steps: int, keep: int) -> list[tuple[float, float, np.ndarray]]:
    """``_coarse``'s half-size result from fewer half-size searches: every scale at quarter size, then the
    ``keep`` best of them at half size."""
    quarter = _coarse(cv2, small, big, steps, div=4)
    if not quarter:  # every template under MIN_TEMPLATE // 4 at quarter size: the half-size pass decides alone
        return _coarse(cv2, small, big, steps)
    return _coarse(cv2, small, big, scales=[f for _, f, _ in quarter[:keep]])


def _refine_scales(coarse: list, steps: int, spread: bool) -> list[float]:
    """The scales searched at full size: the ``REFINE`` best of the coarse pass, each with the scales half a
    coarse step either side when ``spread`` (at most 1: the template fills the container)."""
    best = [f for _, f, _ in coarse[:REFINE]]
    if not spread:
        return best
    half_step = (1.0 / MIN_FRACTION) ** (0.5 / (steps - 1))
    return sorted({min(1.0, x) for f in best for x in (f / half_step, f, f * half_step)})


def _refine(cv2, small: np.ndarray, big: np.ndarray, scales) -> tuple[float, np.ndarray]:
    best, box = -1.0, np.zeros(4, np.float32)
    for f in scales:
        p = _peak(cv2, small, big, f, MIN_TEMPLATE)
        if p is not None and p[0] > best:
            best, box = p
    return best, box


def search(small: np.ndarray, big: np.ndarray, coarse: bool = True) -> tuple[float, np.ndarray]:
    """The best NCC of ``small`` scaled inside ``big``, over ``STEPS`` scales: every scale at half size, then the
    ``REFINE`` best at full size (``coarse`` False: every scale at full size).

    Args:
        small, big: (h, w) float32 grey thumbnails (``thumbnail``).

    Returns:
        (ncc, box): the best peak (-1.0 when no scale could be tried) and its window (4,) float32 normalised.
    """
    import cv2

    cv2.setNumThreads(1)
    if not coarse:
        return _refine(cv2, small, big, np.geomspace(MIN_FRACTION, 1.0, STEPS))
    return _refine(cv2, small, big, [f for _, f, _ in _coarse(cv2, small, big)[:REFINE]])


def locate(a: np.ndarray, b: np.ndarray, refine_from: float | None = None, steps: int = STEPS,
           spread: bool = False, pyramid: int | None = None) -> Located:
    """Template search both ways (module docstring).

    Args:
        a, b: (h, w) float32 grey thumbnails of the pair's images (``thumbnail``).
        refine_from: a direction whose best coarse peak (half size) is below this is not searched again at full
            size: its coarse peak is reported, with its window (None: both refined). Most candidate pairs are
            unrelated photos whose coarse peaks stay below a crop threshold; the finder passes ``template_ncc`` -
            ``REFINE_BELOW_RULE`` (``finder.refine_bar``) and stores it with the pair.
        steps: scales of the half-size pass (geometric from ``MIN_FRACTION`` to 1).
        spread: also search, at full size, half a coarse step either side of each refined scale.
        pyramid: search every scale at quarter size first and only this many of them (the best) at half size
            (None: every scale at half size). Measured, not shipped: ``bench.duplicates_template_steps``.

    Returns:
        ``Located``: both directions' best NCC and the better one's window.
    """
    import cv2

    cv2.setNumThreads(1)
    found = []
    for small, big in ((a, b), (b, a)):
        got = _coarse(cv2, small, big, steps) if pyramid is None else _pyramid(cv2, small, big, steps, pyramid)
        if not got:
            found.append((-1.0, np.zeros(4, np.float32)))
        elif refine_from is not None and got[0][0] < refine_from:
            found.append((got[0][0], got[0][2]))
        else:
            found.append(_refine(cv2, small, big, _refine_scales(got, steps, spread)))
    (ab, box_ab), (ba, box_ba) = found
    return Located(ab, ba, box_ab if ab >= ba else box_ba)
