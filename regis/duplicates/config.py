"""The thresholds of duplicate finding: what they mean, where the calibrated ones come from, how a call overrides them.

An index's thresholds live in its own config file, ``INDEX_DIR/duplicates/config.json`` (``save_config``),
written on its first duplicates run from the calibration shipped for its backbone
(``regis/duplicates/calibrations/<backbone>.json``, made by ``scripts/eval_duplicates.py --calibrate``), or by
``regis duplicates calibrate``. A call can override any of them (``DuplicateConfig.with_overrides``); the
candidate-stage ones (``floor``, ``neighbours``, ``depth``) then need a new self-join when they widen it.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from regis.errors import ConfigError
from regis.indexes.layout import write_json_atomic

DUPLICATES_DIR = "duplicates"
CONFIG_FILE = "config.json"
CANDIDATE_FIELDS = ("floor", "neighbours", "depth", "verify", "verify_floor", "verify_ceiling", "prefilter",
                    "verify_side", "features", "exact_tokens")
# candidate settings whose stored value may be lower than a call's (the stored run then covers the call's)
AT_MOST_FIELDS = ("floor", "verify_floor", "prefilter")
# ... and the ones whose stored value may be higher (None: no ceiling, the highest)
AT_LEAST_FIELDS = ("verify_ceiling",)
# how the self-join scores a two-framing index's pairs (``regis.duplicates.selfjoin``): pairs stored by a run that
# scored otherwise (before 2026-11-29: "centre", the centre crop's tokens on both sides) are searched again
JOIN_SCORING = "centre-all"
COPY_GROUPS = "closed"  # candidates added through duplicate groups (``finder.group_candidates``: until 2026-11-30
# "crops", a sure crop with its container's copies only, inside the token gates; then "containment", without the
# pairs within each group and between the crops of one group); stored pairs made otherwise are searched again


class DuplicateConfig(BaseModel):
    """Thresholds and settings of ``regis.duplicates`` (scores are MaxSim per token, S / T, in [-1, 1]).

    Candidate stage (the self-join):
        floor: a pair is a candidate when its MaxSim per token, in either direction, is at least this.
        neighbours: at most this many candidates per image (the best), before verification; the group stage
            (``finder.group_candidates``) adds the pairs the duplicate groups imply.
        depth: FAISS neighbours per query token (None: the index's default candidate depth).

    Verification (``regis.duplicates.geometry``):
        verify: match local features and fit a homography for candidate pairs whose files can be read.
        verify_floor: ... only for pairs whose MaxSim per token reaches this in either direction (None: every
            candidate). Below it no labelled relation of the calibration set was found by verification that the
            tokens alone do not give (the calibration picks it), and verification is most of a run's cost.
        verify_ceiling: ... and not for pairs whose MaxSim per token reaches this in both directions (None: no
            ceiling). Set to ``token_edited`` when ``token_edited_verified`` is at most it, such a pair is an edited
            copy whatever verification finds, so skipping it changes no relation (its pair has no geometry to
            draw).
        prefilter: a pair is matched in full only when the cheap first match (``geometry.prefilter``: the 300
            strongest descriptors of each image against the other's) finds at least this many matches (None: every
            pair matched in full; the calibration picks it).
        verify_side: longest side the images are brought to for it (reduced or enlarged), pixels.
        features: ORB keypoints per image.
        min_inliers: homography inliers for a pair to count as verified.

    Relations of a verified pair (covers: ``geometry.Verification``):
        edited_min_cover: an edited copy: each frame covers at least this much of the other ...
        edited_max_cover: ... and one lies (almost) entirely inside the other, at least this much.
        crop_cover: a crop: the smaller frame lies at least this much inside the other (and does not cover
            ``edited_min_cover`` of it).
        token_edited_verified: a verified pair whose geometry is not an edited copy's is one all the same when
            its MaxSim per token is at least this in both directions (a wide border, or a rotation with filled
            corners plus a small crop, leaves an edited copy's frame only partly covered; None: off).
        Anything else verified is the same scene (shared, shifted content).

    Template search (``regis.duplicates.template``), of the gated pairs verification did not verify (fewer than
    ``min_inliers`` inliers): one image, scaled, slid over the other, both ways:
        template: run it (a pair table stored without it is searched on the next run).
        template_floor: ... only on pairs whose MaxSim per token reaches this in either direction (None: every
            pair verification left unverified; the calibration picks it, as ``verify_floor``).
        template_max_side: ... and only on pairs whose smaller image's longest side (pixels, as indexed) is
            below this (None: every size; the calibration picks it). ORB verifies images of ``verify_side`` and
            more at their own resolution; the template search exists for the crops of small images that ORB
            misses once they are enlarged to ``verify_side``. Pairs a run searched beyond it stay searched.
        template_ncc: a crop when the better direction's normalised cross correlation is at least this ...
        template_margin: ... and at least this above the other direction's (the container is not found in the
            crop) ...
        template_max_area: ... and the crop's window covers at most this fraction of its container (more: a
            whole frame, not a crop). None (``template_ncc``): off.

    Relations of a pair that could not be verified (no file, or too few consistent matches):
        token_edited: an edited copy when the MaxSim per token is at least this in both directions.
        token_scene: otherwise the same scene when it is at least this in either direction; below: not reported.

    Exact copies: the same bytes (SHA-256), or the same pixels (checked by decoding both files when their sizes
    match and their tokens agree to ``exact_tokens``).

    calibration: where the numbers come from (set, split, figures), or None for the uncalibrated defaults.
    """

    model_config = ConfigDict(extra="forbid")

    floor: float = Field(0.45, ge=-1.0, le=1.0)
    neighbours: int = Field(6, ge=1, le=1000)
    depth: int | None = Field(None, ge=1, le=4096)
    verify: bool = True
    verify_floor: float | None = Field(None, ge=-1.0, le=1.0)
    verify_ceiling: float | None = Field(None, ge=-1.0, le=1.0)
    prefilter: int | None = Field(None, ge=0, le=1000)
    verify_side: int = Field(640, ge=64, le=4096)
    features: int = Field(2000, ge=50, le=20000)
    min_inliers: int = Field(15, ge=4)
    edited_min_cover: float = Field(0.80, ge=0.0, le=1.0)
    edited_max_cover: float = Field(0.95, ge=0.0, le=1.0)
    crop_cover: float = Field(0.90, ge=0.0, le=1.0)
    token_edited_verified: float | None = Field(None, ge=-1.0, le=1.0)
    template: bool = True
    template_floor: float | None = Field(None, ge=-1.0, le=1.0)
    template_max_side: int | None = Field(None, ge=1, le=1_000_000)
    template_ncc: float | None = Field(None, ge=-1.0, le=1.0)
    template_margin: float = Field(0.1, ge=0.0, le=2.0)
    template_max_area: float = Field(0.85, ge=0.0, le=1.0)
    token_edited: float = Field(0.97, ge=-1.0, le=1.0)
    token_scene: float = Field(0.75, ge=-1.0, le=1.0)
    exact_tokens: float = Field(0.97, ge=0.0, le=1.0)
    calibration: dict | None = None

    def with_overrides(self, overrides: dict | None) -> DuplicateConfig:
        """A copy with some fields replaced (a call's overrides), validated.

        Raises:
            ConfigError: an unknown field or a value out of range (the message names it).
        """
        if not overrides:
            return self
        unknown = sorted(set(overrides) - (set(DuplicateConfig.model_fields) - {"calibration"}))
        if unknown:
            raise ConfigError(f"unknown duplicate threshold(s) {', '.join(map(repr, unknown))}; known: "
                              f"{', '.join(f for f in DuplicateConfig.model_fields if f != 'calibration')}")
        try:
            return DuplicateConfig.model_validate({**self.model_dump(), **overrides})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"invalid duplicate threshold: {problems}") from None

    def candidate_settings(self) -> dict:
        """The settings the stored candidate pairs depend on (a run with other ones searches again), with the
        version of the geometric verification (``geometry.GEOMETRY_VERSION``)."""
        from regis.duplicates.geometry import GEOMETRY_VERSION

        return {**{name: getattr(self, name) for name in CANDIDATE_FIELDS}, "geometry": GEOMETRY_VERSION,
                "join": JOIN_SCORING, "copy_groups": COPY_GROUPS}


def parse_overrides(items: list[str] | None) -> dict:
    """``NAME=VALUE`` strings (the CLI's ``--set``) -> {name: value} (values read as JSON: 0.9, true, 12).

    Raises:
        ConfigError: an item without '='.
    """
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"threshold override {item!r} is not NAME=VALUE (e.g. floor=0.5)")
        try:
            out[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[name.strip()] = value
    return out


def shipped_calibration(backbone: str) -> DuplicateConfig | None:
    """The calibration shipped for ``backbone`` (``calibrations/<backbone>.json`` in this package), or None."""
    name = f"{backbone.replace(':', '_').replace('/', '_')}.json"
    path = resources.files("regis.duplicates") / "calibrations" / name
    if not path.is_file():
        return None
    return DuplicateConfig.model_validate(json.loads(path.read_text()))


def config_path(index_dir: Path | str) -> Path:
    """``INDEX_DIR/duplicates/config.json``."""
    return Path(index_dir) / DUPLICATES_DIR / CONFIG_FILE


def load_config(index_dir: Path | str, backbone: str) -> DuplicateConfig:
    """The index's thresholds: its own config file, else the calibration shipped for ``backbone``, else the
    uncalibrated defaults (``calibration`` None).

    Raises:
        ConfigError: the index's config file is unreadable or invalid.
    """
    path = config_path(index_dir)
    if path.is_file():
        try:
            return DuplicateConfig.model_validate(json.loads(path.read_text()))
        except (ValueError, ValidationError) as exc:
            raise ConfigError(f"{path} is not a valid duplicates config; fix it or delete it to use the shipped "
                              "calibration") from exc
    return shipped_calibration(backbone) or DuplicateConfig()


def save_config(index_dir: Path | str, config: DuplicateConfig) -> Path:
    """Write the index's thresholds (atomically); returns the file."""
    path = config_path(index_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, config.model_dump())
    return path
