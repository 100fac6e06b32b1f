"""What a candidate pair is: exact copy, edited copy, crop (and which image contains the other), same scene.

Decided from what the pair table stores (``regis.duplicates.store.PairTable``: token scores both ways, the
geometric verification, the exact-copy check) and the thresholds (``regis.duplicates.config.DuplicateConfig``),
so a call that overrides a relation threshold re-decides every stored pair without searching or verifying again.

Rules, in order:

0. A pair whose MaxSim per token is below ``floor`` both ways is dropped (a stored run may have used a lower one),
   unless it was paired through a sure crop (``PairTable.by_group``: the token gates of this module do not apply to
   it, its evidence decides).
1. ``exact``: the same bytes or the same pixels.
2. A verified pair (at least ``min_inliers`` homography inliers): ``edited_copy`` when each frame covers at
   least ``edited_min_cover`` of the other and one lies at least ``edited_max_cover`` inside the other, or when
   its MaxSim per token is at least ``token_edited_verified`` both ways; else
   ``crop`` when one frame lies at least ``crop_cover`` inside the other (that one is the crop); else
   ``same_scene`` (they share part of the view, shifted: another shot).
2b. A pair that is neither an edited copy nor a crop by rule 2 (unverified, or verified as the same scene) and
   whose template search (``regis.duplicates.template``) found one image inside the other: ``crop`` when the better
   direction's NCC is at least ``template_ncc``, beats the other direction by ``template_margin``, and its window
   covers at most ``template_max_area`` of the container (the image found is the crop).
3. An unverified pair (no file to read, too few consistent matches, or token scores below ``verify_floor``, so
   not verified): ``edited_copy`` when the MaxSim per token is at least ``token_edited`` both ways;
   ``same_scene`` when it is at least ``token_scene`` either way; else none (the pair is dropped).
4. Two shots (``PairTable.shots``: their EXIF exposure times differ) that rules 2-3 call an edited copy are
   ``same_scene``: a burst frame framing 95 % of the other's view has an edited copy's geometry, but two exposures
   are two photos.
"""

from __future__ import annotations

import numpy as np

from regis.duplicates.config import DuplicateConfig

EXACT, EDITED, CROP, SCENE, NONE = 0, 1, 2, 3, -1
NAMES = {EXACT: "exact", EDITED: "edited_copy", CROP: "crop", SCENE: "same_scene"}
CODES = {name: code for code, name in NAMES.items()}
DUPLICATE_CODES = (EXACT, EDITED)  # the relations that make a duplicate group


def is_verified(table, config: DuplicateConfig) -> np.ndarray:
    """(p,) bool: the pairs that count as verified under ``config``: at least ``min_inliers`` homography inliers,
    and token scores at or above ``verify_floor`` and below ``verify_ceiling`` (a pair outside is not verified by
    a run with this config, so a stored run with a wider gate is read as that run would have been; ``verify_floor``
    does not apply to pairs ``by_group``)."""
    verified = np.asarray(table.inliers) >= config.min_inliers
    if config.verify_floor is not None:
        verified &= (np.maximum(table.s_ab, table.s_ba) >= config.verify_floor) | (table.by_group > 0)
    if config.verify_ceiling is not None:
        verified &= np.minimum(table.s_ab, table.s_ba) < config.verify_ceiling
    if config.prefilter is not None:  # pairs a run with this prefilter would not have matched in full (-1: no
        pre = np.asarray(table.pre)      # first match was run, the pair was matched in full)
        verified &= (pre < 0) | (pre >= config.prefilter)
    return verified


def classify(table, config: DuplicateConfig) -> tuple[np.ndarray, np.ndarray]:
    """The relation of every pair of a pair table, and which image contains the other for crops.

    Args:
        table: a ``regis.duplicates.store.PairTable`` (p pairs).
        config: the thresholds.

    Returns:
        relation (p,) int8 (``EXACT``, ``EDITED``, ``CROP``, ``SCENE`` or ``NONE``) and container (p,) int64:
        the id of the image that contains the other for a crop (a or b), -1 otherwise.
    """
    p = len(table)
    rel = np.full(p, NONE, dtype=np.int8)
    s_lo = np.minimum(table.s_ab, table.s_ba)
    s_hi = np.maximum(table.s_ab, table.s_ba)
    verified = is_verified(table, config)
    lo = np.minimum(table.cover_a, table.cover_b)
    hi = np.maximum(table.cover_a, table.cover_b)
    edited = verified & (lo >= config.edited_min_cover) & (hi >= config.edited_max_cover)
    if config.token_edited_verified is not None:
        edited |= verified & (s_lo >= config.token_edited_verified)
    crop = verified & ~edited & (hi >= config.crop_cover)
    scene = verified & ~edited & ~crop
    t_edited = ~verified & (s_lo >= config.token_edited)
    t_scene = ~verified & ~t_edited & (s_hi >= config.token_scene)
    t_crop = template_crops(table, config) & ~edited & ~crop & ~t_edited & ~table.exact
    rel[scene | t_scene] = SCENE
    rel[crop | t_crop] = CROP
    rel[edited | t_edited] = EDITED
    rel[(rel == EDITED) & table.shots] = SCENE  # two exposures (rule 4)
    rel[table.exact] = EXACT
    # pairs stored with a lower floor than this call's (not those through a sure crop: their evidence decides)
    rel[(s_hi < config.floor) & ~table.exact & (table.by_group == 0)] = NONE
    # a crop lies inside its container: cover_a >= cover_b (or, for a crop the template search found, ncc_ab >
    # ncc_ba) means a is inside b, so b contains a (MaxSim's asymmetry does not say it: on the labelled set the
    # higher direction named the container of 0.51-0.63 of the crop pairs, so no crop is called from the tokens)
    inner_a = np.where(t_crop, table.ncc_ab > table.ncc_ba, table.cover_a >= table.cover_b)
    container = np.where(rel == CROP, np.where(inner_a, table.b, table.a), -1)
    return rel, container.astype(np.int64)


def template_crops(table, config: DuplicateConfig) -> np.ndarray:
    """(p,) bool: pairs whose template search says one image is a crop of the other (rule 2b; all False when
    ``template_ncc`` is None; the gates ``verify_floor`` and ``template_floor`` do not apply to pairs
    ``by_group``)."""
    if config.template_ncc is None:
        return np.zeros(len(table), dtype=bool)
    hi = np.maximum(table.ncc_ab, table.ncc_ba)
    margin = np.abs(table.ncc_ab - table.ncc_ba)
    area = (table.box[:, 2] - table.box[:, 0]) * (table.box[:, 3] - table.box[:, 1])
    gate = max(-2.0 if config.verify_floor is None else config.verify_floor,
               -2.0 if config.template_floor is None else config.template_floor)
    gated = table.located & ((np.maximum(table.s_ab, table.s_ba) >= gate) | (table.by_group > 0))
    return gated & (hi >= config.template_ncc) & (margin >= config.template_margin) & (area <= config.template_max_area)


def describe(relation: int, a: int, b: int, container: int, cover_a: float, cover_b: float, verified: bool,
             shots: bool = False) -> str:
    """The relation of a pair in words, e.g. "image 7 is a crop of image 3 (it shows 34 % of it)"; ``shots``: their
    EXIF exposure times differ (said for the same scene)."""
    if relation == EXACT:
        return f"images {a} and {b} are exact copies (the same bytes or the same pixels)"
    if relation == EDITED:
        how = "the frames match" if verified else "their tokens match (not verified geometrically)"
        return f"images {a} and {b} are edited copies of one photo ({how})"
    if relation == CROP:
        inner = b if container == a else a
        shown = cover_b if container == b else cover_a  # the part of the container the crop covers
        return f"image {inner} is a crop of image {container} (it shows {round(100 * shown)} % of it)"
    if relation == SCENE and shots:
        return f"images {a} and {b} are two shots of the same scene (their EXIF capture times differ)"
    if relation == SCENE:
        if verified:
            return (f"images {a} and {b} show the same scene from another shot ({round(100 * cover_a)} % of {a} "
                    f"lies in {b}, {round(100 * cover_b)} % of {b} is covered)")
        return f"images {a} and {b} look like the same scene (their tokens match; not verified geometrically)"
    return ""
