"""Duplicate groups: connected components of the exact and edited-copy pairs, and the crops and other shots beside.

A *group* is a connected component of the graph whose edges are the pairs classified ``exact`` or ``edited_copy``
(``regis.duplicates.relations``), plus ``crop`` and ``same_scene`` edges only when the caller asks to merge them:
other shots of a scene and crops are reported, never merged into a duplicate group unless asked. Every reported
pair is listed once: a pair inside a group with the group's ``pairs``; a crop or same-scene pair between two
groups (or an image in none) as ``related`` of one of them: a crop with the group of the image that contains it,
another shot with the group of its lower id. Images in no group that have such a pair form a group of one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from regis.duplicates import relations as rel
from regis.duplicates.config import DuplicateConfig
from regis.duplicates.store import PairTable

MERGEABLE = {"crop": rel.CROP, "same_scene": rel.SCENE}


@dataclass
class Group:
    """One group.

    Attributes:
        images: image ids, ascending.
        pairs: rows of the pair table between two of ``images``.
        related: rows of crop / same-scene pairs from one of ``images`` to an image outside the group.
    """

    images: list[int]
    pairs: list[int] = field(default_factory=list)
    related: list[int] = field(default_factory=list)

    @property
    def is_duplicate(self) -> bool:
        """Whether it holds two images or more (a duplicate group)."""
        return len(self.images) > 1


def components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Connected components of ``n`` nodes joined by edges (a[i], b[i]): (n,) int labels
    (``scipy.sparse.csgraph.connected_components``)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(a), np.int8), (a, b)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def copy_groups(table: PairTable, relation: np.ndarray) -> dict[int, list[int]]:
    """image id -> the members of its duplicate group (itself included, ascending): connected components of the
    pairs of ``table`` whose ``relation`` (``relations.classify``) is exact or edited copy; every image of
    ``table``."""
    ids, inv = np.unique(np.concatenate([table.a, table.b]), return_inverse=True)
    dup = np.isin(relation, list(rel.DUPLICATE_CODES))
    label = components(len(ids), inv[:len(table)][dup], inv[len(table):][dup])
    members: dict[int, list[int]] = {}
    for k, i in enumerate(ids.tolist()):
        members.setdefault(int(label[k]), []).append(i)
    return {i: members[int(label[k])] for k, i in enumerate(ids.tolist())}


@dataclass
class Grouping:
    """The groups of a pair table under some thresholds.

    Attributes:
        groups: ordered: most images first, then most related pairs, then lowest id.
        relation: (p,) int8 relation of every pair of the table (``relations.NONE``: not reported).
        container: (p,) int64 the containing image of a crop pair, else -1.
    """

    groups: list[Group]
    relation: np.ndarray
    container: np.ndarray

    def counts(self) -> dict:
        """Reported pairs per relation, duplicate groups, images in them and how many could go (all but one a
        group)."""
        dup = [g for g in self.groups if g.is_duplicate]
        return {"pairs": {name: int((self.relation == code).sum()) for code, name in rel.NAMES.items()},
                "duplicate_groups": len(dup), "images_in_duplicate_groups": sum(len(g.images) for g in dup),
                "redundant_images": sum(len(g.images) - 1 for g in dup)}


def group_pairs(table: PairTable, config: DuplicateConfig, merge: tuple[str, ...] = (),
                relations: tuple[str, ...] | None = None) -> Grouping:
    """Classify every pair and group the images (module docstring).

    Args:
        table: the pair table.
        config: the thresholds.
        merge: relations that also join groups ("crop", "same_scene").
        relations: report only these relations (names of ``relations.NAMES``; None: all); exact and edited copies
            always make the groups.

    Raises:
        ValueError: an unknown name in ``merge`` or ``relations``.
    """
    unknown = set(merge) - set(MERGEABLE) | set(relations or ()) - set(rel.CODES)
    if unknown:
        raise ValueError(f"unknown relation(s) {sorted(unknown)}; merge takes {sorted(MERGEABLE)}, relations "
                         f"{sorted(rel.CODES)}")
    relation, container = rel.classify(table, config)
    joining = np.isin(relation, [*rel.DUPLICATE_CODES, *(MERGEABLE[m] for m in merge)])
    ids = np.unique(np.concatenate([table.a[relation != rel.NONE], table.b[relation != rel.NONE]]))
    index = {int(i): k for k, i in enumerate(ids.tolist())}
    ea = np.array([index[int(x)] for x in table.a[joining]], dtype=np.int64)
    eb = np.array([index[int(x)] for x in table.b[joining]], dtype=np.int64)
    label = components(len(ids), ea, eb) if len(ids) else np.zeros(0, np.int64)
    members: dict[int, list[int]] = {}
    for k, i in enumerate(ids.tolist()):
        members.setdefault(int(label[k]), []).append(i)
    groups = {c: Group(sorted(m)) for c, m in members.items()}
    shown = relation != rel.NONE
    if relations is not None:
        shown &= np.isin(relation, [rel.CODES[r] for r in relations])
    for row in np.flatnonzero(shown).tolist():
        a, b = int(table.a[row]), int(table.b[row])
        ca, cb = int(label[index[a]]), int(label[index[b]])
        if ca == cb:
            groups[ca].pairs.append(row)
        else:
            owner = index[int(container[row])] if relation[row] == rel.CROP else index[a]
            groups[int(label[owner])].related.append(row)
    kept = [g for g in groups.values() if g.is_duplicate or g.related]
    kept.sort(key=lambda g: (-len(g.images), -len(g.related), g.images[0]))
    return Grouping(kept, relation, container)
