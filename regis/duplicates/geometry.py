"""Geometric verification of a candidate pair: where, if anywhere, one image's frame lies in the other's.

The token scores of a pair say how alike two images are, not how they relate: an edited copy, a crop and another
shot of the same scene can all score high. Their geometry tells them apart. Each image gets local features
(ORB keypoints and binary descriptors, OpenCV; Rublee et al. 2011) on a copy whose longest side is ``max_side``
pixels (larger images reduced, smaller ones enlarged: ORB finds no keypoints within 31 px of a border, so a
100 x 70 px crop of a small photo had none and its pair could not be verified);
two images' features are matched (nearest neighbour by Hamming distance, FAISS, with Lowe's ratio test) and a
homography H from the first image to the second is fitted to the matches with RANSAC (OpenCV's MAGSAC++). With it:

- ``cover_a``: the fraction of image a's frame that lands inside image b's frame under H (1: a lies in b);
- ``cover_b``: the fraction of b's frame that a's frame covers (1: a shows all of b);
- ``quad_a_in_b`` / ``quad_b_in_a``: each frame's corners in the other image, normalised to [0, 1] (the
  "matched region" drawn on the other image).

An edited copy covers the other's frame and lies in it (both near 1; a border or a small rotation costs a few
per cent); a crop lies in the other (its cover near 1) and covers only part of it; another shot of the scene
shares part of the frame with neither inside the other. Unrelated images find no consistent homography: few
inliers, or a degenerate quadrilateral (not convex, folded, or of an implausible area), reported as None.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from regis.errors import ConfigError, ImageDecodeError

DEFAULT_MAX_SIDE = 640  # pixels: the side local features are extracted at
DEFAULT_FEATURES = 2000  # ORB keypoints per image (1000 verified 8 fewer of 60 crop pairs in a sample)
GEOMETRY_VERSION = 2  # 2: small images enlarged to max_side; stored pairs of another version are verified again
RATIO = 0.8  # Lowe's ratio test on descriptor distances
PREFILTER_QUERIES = 300  # descriptors (the strongest) each image sends to the cheap first match (``prefilter``)
MIN_MATCHES = 8  # fewer ratio-test matches than this: no homography is tried
MIN_AREA_RATIO = 1e-3  # a frame mapped onto less than this of the other's area (or more than its inverse): degenerate


def _cv2():
    try:
        import cv2
    except ImportError as exc:  # pragma: no cover - a dependency of regis
        raise ConfigError("geometric verification needs OpenCV: pip install opencv-python-headless") from exc
    cv2.setNumThreads(1)  # pairs are verified in parallel processes, not threads inside OpenCV
    return cv2


@dataclass(frozen=True)
class LocalFeatures:
    """An image's ORB features.

    Attributes:
        points: (n, 2) float32 keypoint positions, normalised to [0, 1] by the image's width and height, strongest
            (highest FAST response) first.
        descriptors: (n, 32) uint8 ORB descriptors (n may be 0), in the same order.
        size: (width, height) of the copy the features were taken on, pixels.
        thumb: (h, w) float32 grey copy, longest side at most ``template.THUMB_SIDE`` px, for the template search
            (``regis.duplicates.template``); None when not made.
    """

    points: np.ndarray
    descriptors: np.ndarray
    size: tuple[int, int]
    thumb: np.ndarray | None = None


@dataclass(frozen=True)
class Verification:
    """What geometric verification found for a pair (a, b).

    Attributes:
        matches: descriptor matches that passed the ratio test.
        inliers: matches consistent with the fitted homography (0 when none was fitted).
        cover_a: fraction of a's frame inside b's frame (0..1).
        cover_b: fraction of b's frame covered by a's frame (0..1).
        quad_a_in_b: (4, 2) float32 a's corners (top-left, top-right, bottom-right, bottom-left) in b's frame,
            normalised to [0, 1] (may lie outside it).
        quad_b_in_a: (4, 2) float32 b's corners in a's frame, normalised.
        residual: median distance between an inlier's match in b and where the homography puts it, as a fraction
            of b's longer side (an edited copy: a few thousandths; another view of a 3-D scene: more).
    """

    matches: int
    inliers: int
    cover_a: float
    cover_b: float
    quad_a_in_b: np.ndarray
    quad_b_in_a: np.ndarray
    residual: float = 0.0


def load_gray(source: Path | str | bytes, max_side: int = DEFAULT_MAX_SIDE):
    """Decode an image file (or bytes) to a grayscale PIL image whose longest side is ``max_side`` pixels (reduced
    with JPEG draft decoding where it can, enlarged bicubically when smaller; EXIF orientation applied, as the
    index saw it).

    Raises:
        ImageDecodeError: not a decodable image.
    """
    from PIL import Image

    from regis.images.decode import decode_image

    img = decode_image(source, draft_size=max_side).image.convert("L")
    f = max_side / max(img.size)
    if f != 1:
        img = img.resize((max(1, round(img.width * f)), max(1, round(img.height * f))),
                         Image.BILINEAR if f < 1 else Image.BICUBIC)
    return img


def local_features(source, max_side: int = DEFAULT_MAX_SIDE, n_features: int = DEFAULT_FEATURES) -> LocalFeatures:
    """ORB features of an image (a path, bytes, or a PIL image already reduced with ``load_gray``).

    Args:
        source: image file path, its bytes, or a PIL image.
        max_side: longest side the image is brought to first (reduced or enlarged), pixels.
        n_features: keypoints kept (the strongest).

    Returns:
        ``LocalFeatures`` (possibly with no keypoints: a flat image), with its grey thumbnail.

    Raises:
        ImageDecodeError: the file or bytes are not a decodable image.
    """
    from regis.duplicates.template import thumbnail

    cv2 = _cv2()
    img = source if hasattr(source, "convert") else load_gray(source, max_side)
    arr = np.asarray(img.convert("L"))
    orb = cv2.ORB_create(nfeatures=int(n_features), scaleFactor=1.2, nlevels=8, fastThreshold=10)
    keypoints, descriptors = orb.detectAndCompute(arr, None)
    w, h = img.size
    if descriptors is None or not keypoints:
        return LocalFeatures(np.zeros((0, 2), np.float32), np.zeros((0, 32), np.uint8), (w, h), thumbnail(img))
    response = np.fromiter((k.response for k in keypoints), np.float64, len(keypoints))
    order = np.argsort(-response, kind="stable")
    points = cv2.KeyPoint_convert(keypoints).reshape(-1, 2)[order] / np.array([w, h], np.float32)
    return LocalFeatures(points.astype(np.float32), descriptors[order], (w, h), thumbnail(img))


def _frame(size: tuple[int, int]) -> np.ndarray:
    w, h = size
    return np.array([[0, 0], [w, 0], [w, h], [0, h]], dtype=np.float32)


def _cover(cv2, quad: np.ndarray, frame: np.ndarray) -> tuple[float, float]:
    """(fraction of ``quad`` inside ``frame``, fraction of ``frame`` covered by ``quad``); both convex."""
    inter, _ = cv2.intersectConvexConvex(quad.astype(np.float32), frame.astype(np.float32))
    return float(inter / cv2.contourArea(quad)), float(inter / cv2.contourArea(frame))


def _sane(cv2, quad: np.ndarray, frame: np.ndarray) -> bool:
    """A homography's image of a frame that can be a real view: finite, convex, not folded, of plausible area."""
    if not np.isfinite(quad).all() or not cv2.isContourConvex(quad.astype(np.float32).reshape(-1, 1, 2)):
        return False
    ratio = cv2.contourArea(quad.astype(np.float32)) / cv2.contourArea(frame)
    return MIN_AREA_RATIO <= ratio <= 1 / MIN_AREA_RATIO


def nearest_two(a: np.ndarray, b: np.ndarray, ratio: float = RATIO) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force Hamming matching of binary descriptors with Lowe's ratio test (FAISS ``IndexBinaryFlat``, on
    the calling thread only: the same matches as OpenCV's ``BFMatcher(NORM_HAMMING).knnMatch(k=2)`` on 99 of 99
    pairs of the labelled set, 4.1 ms instead of 22 ms of CPU for 2,000 x 2,000 descriptors).

    Args:
        a: (n, 32) uint8 descriptors of the first image; b: (m, 32) uint8 of the second (m >= 2).

    Returns:
        (query, train): int64 indices into a and b of the matches whose nearest distance is below ``ratio`` times
        the second nearest.
    """
    import faiss

    faiss.omp_set_num_threads(1)  # the calling thread's count: pairs are verified on several threads
    index = faiss.IndexBinaryFlat(a.shape[1] * 8)
    index.add(np.ascontiguousarray(b))
    dist, idx = index.search(np.ascontiguousarray(a), 2)
    ok = (idx[:, 1] >= 0) & (dist[:, 0] < ratio * dist[:, 1])
    query = np.flatnonzero(ok)
    return query, idx[query, 0].astype(np.int64)


def prefilter(a: LocalFeatures, b: LocalFeatures, queries: int = PREFILTER_QUERIES, ratio: float = RATIO) -> int:
    """A cheap first match: the ``queries`` strongest descriptors of each image matched against all of the other's
    (ratio test), the larger count of the two directions. Unrelated images get a few chance matches (at most 18 on
    40 unrelated pairs of the labelled set), images of one photo tens to hundreds; about 2 x 300 / 2,000 of the
    full match's comparisons.

    Returns:
        The number of ratio-test matches (0 when an image has fewer than 2 descriptors).
    """
    if len(a.descriptors) < 2 or len(b.descriptors) < 2:
        return 0
    ab = len(nearest_two(a.descriptors[:queries], b.descriptors, ratio)[0])
    ba = len(nearest_two(b.descriptors[:queries], a.descriptors, ratio)[0])
    return max(ab, ba)


def verify_pair(a: LocalFeatures, b: LocalFeatures, ratio: float = RATIO, match=None) -> Verification | None:
    """Match two images' features and fit a homography from a to b (module docstring).

    Args:
        a, b: ``local_features`` of the two images.
        ratio: Lowe's ratio test threshold.
        match: the descriptor matcher, ``(a_desc, b_desc, ratio) -> (query, train)`` (None: ``nearest_two``,
            exact; ``bench.duplicates_matchers`` compares approximate ones).

    Returns:
        A ``Verification``, or None when no sane homography fits (too few matches, degenerate geometry).
    """
    cv2 = _cv2()
    if len(a.descriptors) < 2 or len(b.descriptors) < 2:
        return None
    query, train = (match or nearest_two)(a.descriptors, b.descriptors, ratio)
    if len(query) < MIN_MATCHES:
        return None
    src = a.points[query] * np.array(a.size, np.float32)
    dst = b.points[train] * np.array(b.size, np.float32)
    threshold = 0.006 * max(b.size) + 1.0  # reprojection error allowed, pixels of b's copy
    H, mask = cv2.findHomography(src, dst, cv2.USAC_MAGSAC, threshold)
    if H is None or mask is None:
        return None
    frame_a, frame_b = _frame(a.size), _frame(b.size)
    quad_ab = cv2.perspectiveTransform(frame_a[None], H)[0]
    try:
        quad_ba = cv2.perspectiveTransform(frame_b[None], np.linalg.inv(H))[0]
    except np.linalg.LinAlgError:
        return None
    if not (_sane(cv2, quad_ab, frame_b) and _sane(cv2, quad_ba, frame_a)):
        return None
    cover_a, cover_b = _cover(cv2, quad_ab, frame_b)
    inl = mask.ravel().astype(bool)
    moved = cv2.perspectiveTransform(src[inl][None], H)[0]
    residual = float(np.median(np.linalg.norm(moved - dst[inl], axis=1))) / max(b.size)
    return Verification(len(query), int(inl.sum()), min(cover_a, 1.0), min(cover_b, 1.0),
                        (quad_ab / np.array(b.size, np.float32)).astype(np.float32),
                        (quad_ba / np.array(a.size, np.float32)).astype(np.float32), residual)


def features_or_none(path: Path | None, max_side: int, n_features: int) -> LocalFeatures | None:
    """``local_features`` of a file, None when there is no file or it no longer decodes."""
    if path is None:
        return None
    try:
        return local_features(Path(path), max_side, n_features)
    except (ImageDecodeError, OSError):
        return None
