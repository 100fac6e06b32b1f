"""The JSON answer of a duplicates run: groups of images, every pair's relation in words, its scores both ways, its
geometry and, on request, its token explanation (the one a search gives: which token of one image each token of
the other matched, and the ROI boxes on both).

Shape (``service.schemas_duplicates`` documents it field by field)::

    {"index_version", "config": {...thresholds in force...}, "calibrated": bool, "counts": {...},
     "total_groups", "offset", "limit",
     "groups": [{"images": [{"id", "path", "width", "height", "bytes", "sha256", "metadata"}], "keep": id,
                 "pairs": [PAIR], "related": [PAIR]}],
     "run": {"searched", "reused_pairs", "from_version", "timings_ms"}}
    PAIR = {"a", "b", "relation", "contains", "words", "scores": {"a_to_b", "b_to_a"}, "verified", "through_group",
            "geometry": {"matches", "inliers", "a_in_b", "b_covered", "a_region_in_b", "b_region_in_a"} | null,
            "explanation": {"a_to_b", "b_to_a", "framing", "a_tokens", "b_tokens"} | null}
"""

from __future__ import annotations

import numpy as np

from regis.duplicates import relations as rel
from regis.duplicates.config import DuplicateConfig
from regis.duplicates.groups import Group, Grouping
from regis.duplicates.store import PairTable
from regis.indexes.table import ImageRecord


def keeper(images: list[int], records: dict[int, ImageRecord], table: PairTable, rows: list[int]) -> int:
    """The image a group suggests keeping: the medoid of the group (the highest sum of token scores to the other
    members: edits are made from the original, so each is close to it and further from the others), among those
    within 0.02 per member of it the one with the most pixels, then the most bytes, then the lowest id."""
    close = dict.fromkeys(images, 0.0)
    for row in rows:
        s = float(min(table.s_ab[row], table.s_ba[row]))
        for i in (int(table.a[row]), int(table.b[row])):
            if i in close:
                close[i] += s
    best = max(close.values())
    near = [i for i in images if close[i] >= best - 0.02 * (len(images) - 1)]

    def rank(i: int):
        r = records.get(i)
        return (-(r.width * r.height), -r.bytes, i) if r is not None else (0, 0, i)

    return min(near, key=rank)


def image_json(image_id: int, rec: ImageRecord | None) -> dict:
    """An image of a group: its table row (None fields for an image no longer in the table)."""
    if rec is None:
        return {"id": image_id, "path": None, "width": None, "height": None, "bytes": None, "sha256": None,
                "metadata": {}}
    return {"id": image_id, "path": rec.path, "width": rec.width, "height": rec.height, "bytes": rec.bytes,
            "sha256": rec.sha256, "metadata": rec.metadata}


def _quad(q: np.ndarray) -> list[list[float]]:
    return [[round(float(x), 4), round(float(y), 4)] for x, y in q]


def pair_json(table: PairTable, row: int, relation: int, container: int, config: DuplicateConfig) -> dict:
    """One pair: relation, words, scores both ways, geometry (null when not verified), template search (null when
    not run: ``regis.duplicates.template``; ``window``: the crop's box in its container, normalised)."""
    a, b = int(table.a[row]), int(table.b[row])
    verified = bool(rel.is_verified(table.take([row]), config)[0])
    covers = float(table.cover_a[row]), float(table.cover_b[row])
    template = None
    if table.located[row]:
        box = table.box[row]
        template = {"a_in_b_ncc": round(float(table.ncc_ab[row]), 4), "b_in_a_ncc": round(float(table.ncc_ba[row]), 4),
                    "window": [round(float(x), 4) for x in box]}
        if relation == rel.CROP and not verified:  # a crop found by the template search: its window's area
            area = float((box[2] - box[0]) * (box[3] - box[1]))
            covers = (area, area)
    geometry = None
    if verified:
        geometry = {"matches": int(table.matches[row]), "inliers": int(table.inliers[row]),
                    "a_in_b": round(float(table.cover_a[row]), 4), "b_covered": round(float(table.cover_b[row]), 4),
                    "a_region_in_b": _quad(table.quad_ab[row]), "b_region_in_a": _quad(table.quad_ba[row])}
    return {
        "a": a, "b": b, "relation": rel.NAMES[int(relation)],
        "contains": int(container) if container >= 0 else None,
        "words": rel.describe(int(relation), a, b, int(container), covers[0], covers[1], verified,
                              bool(table.shots[row])),
        "scores": {"a_to_b": round(float(table.s_ab[row]), 4), "b_to_a": round(float(table.s_ba[row]), 4)},
        "verified": verified, "through_group": bool(table.by_group[row]), "geometry": geometry, "template": template,
        "explanation": None,
    }


def explain_pair(snapshot, a: int, b: int) -> dict | None:
    """The token explanation of a pair both ways, from the stored tokens and buddy patches (no re-encoding), as the
    self-join scored it: on an index of two framings ("center-crop+aspect") each direction's centre-crop tokens
    against all of the other image's tokens, in either framing ("centre-all", ``regis.duplicates.selfjoin``),
    whatever the index's ``framing_score``, so each direction's score is the pair's: ``score_per_token`` (MaxSim /
    T, T the tokens of one framing) equals ``scores`` up to float32 rounding.

    Returns:
        {"a_to_b": explanation of a's tokens against b (``regis.retrieve.explain.explain_tokens``, plus
        ``score_per_token``), "b_to_a": the reverse, "framing": "crop" on a two-framing index (the query framing
        explained: its T tokens, matched in both of the other image's framings; the other framing's query tokens
        contribute 0), else null, "a_tokens", "b_tokens": each image's tokens with their boxes}; None when either
        image is no longer live.
    """
    from regis.retrieve.explain import EncodedImage, explain_tokens, query_json, stored_image
    from regis.scores.explain import FRAMING_NAMES

    sa, sb = stored_image(snapshot, a), stored_image(snapshot, b)
    if sa is None or sb is None:
        return None
    config = snapshot.manifest.encoder
    two = config.framings > 1  # the self-join's query framing: the centre crop, against every token
    per = config.tokens_per_framing  # T of the pair's scores (S / T): one framing's tokens
    ta, tb = sa.tokens.astype(np.float32), sb.tokens.astype(np.float32)
    qa, qb = (ta[:per], tb[:per]) if two else (ta, tb)
    out = {"a_to_b": explain_tokens(config, qa, tb, sb.buddies, sb.grid, sb.width, sb.height, across=two),
           "b_to_a": explain_tokens(config, qb, ta, sa.buddies, sa.grid, sa.width, sa.height, across=two),
           "framing": FRAMING_NAMES[0] if two else None}
    for key in ("a_to_b", "b_to_a"):
        out[key]["score_per_token"] = out[key]["score"] / per
    for key, s, t in (("a_tokens", sa, ta), ("b_tokens", sb, tb)):
        out[key] = query_json(config, EncodedImage(t, s.buddies, s.grid, s.width, s.height, None, {}))["tokens"]
    return out


def group_json(group: Group, grouping: Grouping, table: PairTable, records: dict[int, ImageRecord],
               config: DuplicateConfig, snapshot=None, explain: bool = False) -> dict:
    """One group (``explain``: each pair's token explanation, from ``snapshot``)."""
    def pairs(rows: list[int]) -> list[dict]:
        out = []
        for row in rows:
            p = pair_json(table, row, int(grouping.relation[row]), int(grouping.container[row]), config)
            if explain and snapshot is not None:
                p["explanation"] = explain_pair(snapshot, p["a"], p["b"])
            out.append(p)
        return out

    outside = sorted({int(x) for row in group.related for x in (table.a[row], table.b[row])} - set(group.images))
    return {"images": [image_json(i, records.get(i)) for i in group.images],
            "keep": keeper(group.images, records, table, group.pairs) if group.is_duplicate else None,
            "pairs": pairs(group.pairs), "related": pairs(group.related),
            "related_images": [image_json(i, records.get(i)) for i in outside]}


def report_json(grouping: Grouping, table: PairTable, records: dict[int, ImageRecord], config: DuplicateConfig,
                version: int, offset: int = 0, limit: int = 50, snapshot=None, explain: bool = False,
                run: dict | None = None) -> dict:
    """The answer for groups ``offset`` .. ``offset + limit`` (module docstring)."""
    page = grouping.groups[offset:offset + limit]
    return {
        "index_version": version,
        "config": config.model_dump(exclude={"calibration"}),
        "calibrated": config.calibration is not None,
        "counts": grouping.counts(),
        "total_groups": len(grouping.groups), "offset": offset, "limit": limit,
        "groups": [group_json(g, grouping, table, records, config, snapshot, explain) for g in page],
        "run": run,
    }


def records_for(snapshot, groups: list[Group], table: PairTable) -> dict[int, ImageRecord]:
    """The table rows of every image a page of groups shows (members and related images)."""
    ids = {i for g in groups for i in g.images}
    ids |= {int(x) for g in groups for row in g.related for x in (table.a[row], table.b[row])}
    return snapshot.table.get_many(sorted(ids))
