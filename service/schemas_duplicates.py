"""Response models of GET /v1/duplicates (``regis.duplicates.report`` builds the JSON)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class DuplicateImage(BaseModel):
    """An image of a group (its image-table row; null fields for an image deleted meanwhile)."""

    id: int
    path: str | None
    width: int | None
    height: int | None
    bytes: int | None
    sha256: str | None
    metadata: dict = Field(default_factory=dict)


class PairScores(BaseModel):
    """MaxSim per token both ways (S / T: 1.0 when every token of one image has an identical token in the other)."""

    a_to_b: float = Field(description="S(a, b) / T: how well a's tokens are found in b (high when a is a part of b)")
    b_to_a: float = Field(description="S(b, a) / T")


class PairGeometry(BaseModel):
    """Geometric verification: local features matched and a homography fitted from a to b."""

    matches: int = Field(description="feature matches that passed the ratio test")
    inliers: int = Field(description="matches consistent with the homography")
    a_in_b: float = Field(description="fraction of a's frame that lies inside b's")
    b_covered: float = Field(description="fraction of b's frame that a's frame covers")
    a_region_in_b: list[list[float]] = Field(description="a's corners (top-left, top-right, bottom-right, "
                                                         "bottom-left) in b, as fractions of b's width and height")
    b_region_in_a: list[list[float]] = Field(description="b's corners in a, as fractions of a's width and height")


class PairTemplate(BaseModel):
    """Template search: one image, scaled, slid over the other (both ways), normalised cross correlation."""

    a_in_b_ncc: float = Field(description="best correlation of a found inside b (1: a is a window of b)")
    b_in_a_ncc: float = Field(description="best correlation of b found inside a")
    window: list[float] = Field(description="the better direction's window (x0, y0, x1, y1) in the other image, as "
                                            "fractions of its width and height")


class DuplicatePair(BaseModel):
    """Two images and how they relate."""

    a: int
    b: int
    relation: Literal["exact", "edited_copy", "crop", "same_scene"] = Field(
        description="exact: the same bytes or pixels; edited_copy: the same photo resized, recompressed, recoloured, "
                    "slightly cropped or rotated, with text or a border; crop: one shows a part of the other "
                    "(`contains` names the larger); same_scene: another shot of the same place or object")
    contains: int | None = Field(description="crop: the id of the image that contains the other; null otherwise")
    words: str = Field(description="the relation in words")
    scores: PairScores
    verified: bool = Field(description="the relation comes from the geometry (false: from the token scores alone: no "
                                       "file to read, or too few consistent matches)")
    through_group: bool = Field(False, description="one image is a crop found with confidence in the other, or in a "
                                                   "copy or a container of it, so the pair was verified and searched "
                                                   "whatever its token scores (its evidence alone decides its "
                                                   "relation)")
    geometry: PairGeometry | None
    template: PairTemplate | None = Field(None, description="the template search, run on pairs the geometry did not "
                                                            "verify (a crop of a small image); null when not run")
    explanation: dict | None = Field(description="with explain=true: a_to_b and b_to_a, the token explanation of each "
                                                  "direction as POST /v1/search?explain=true gives it (which token of "
                                                  "one image each token of the other matched, ROI boxes) of the "
                                                  "tokens the pairs were scored on, with score_per_token (the "
                                                  "score / T: equals scores); framing: on an index of two framings "
                                                  "per image, crop (the central square's tokens are explained, the "
                                                  "whole image's contribute 0), else null; and a_tokens / "
                                                  "b_tokens, each image's tokens with their boxes")


class DuplicateGroup(BaseModel):
    """A connected component of exact and edited copies (or one image with crops or other shots beside it)."""

    images: list[DuplicateImage]
    keep: int | None = Field(description="the image suggested to keep (the group's medoid, the largest among the "
                                         "closest); null for a group of one")
    pairs: list[DuplicatePair] = Field(description="pairs between two images of the group")
    related: list[DuplicatePair] = Field(description="crops and other shots between a group image and one outside")
    related_images: list[DuplicateImage] = Field(description="the images outside the group that `related` names")


class DuplicateCounts(BaseModel):
    """Totals over every group, not only this page."""

    pairs: dict[str, int] = Field(description="reported pairs per relation")
    duplicate_groups: int
    images_in_duplicate_groups: int
    redundant_images: int = Field(description="images in duplicate groups beyond one per group")


class DuplicateRunInfo(BaseModel):
    """What the run that made the pairs did."""

    searched: int = Field(description="images whose tokens the run searched (those new or changed since the run of "
                                      "`from_version`; every image on a first run)")
    reused_pairs: int = Field(description="pairs it kept from the run of `from_version`")
    from_version: int | None = Field(description="the index version whose stored pairs it started from")
    candidate_pairs: int
    timings_ms: dict[str, float] = Field(description="join (the self-join), exact, verify and total, of that run")
    computed_now: bool = Field(description="false when the pairs were stored already (the facts are the stored run's)")


class DuplicatesResponse(BaseModel):
    """One page of duplicate groups."""

    index_version: int
    config: dict = Field(description="the thresholds in force (the index's, with this call's overrides)")
    calibrated: bool = Field(description="whether the thresholds were calibrated for this index's encoder")
    calibration: dict | None = Field(description="where the calibrated thresholds come from")
    counts: DuplicateCounts
    total_groups: int
    offset: int
    limit: int
    groups: list[DuplicateGroup]
    run: DuplicateRunInfo | None


class DuplicatesPending(BaseModel):
    """The pairs of this index version are still being computed (202); ask again (``Retry-After``)."""

    state: Literal["running"]
    index_version: int
    stage: str | None = Field(description="search (the self-join) or verify (geometric verification)")
    done: int
    total: int
