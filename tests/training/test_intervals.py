"""The per-kind Recall@1 table (training.evaluation.intervals.per_kind_table) worked out by hand on 6 queries of 2
kinds from 3 photos, its errors, and the layout training.photos.evaluate.evaluate_head builds from it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.evaluation.intervals import paired_bootstrap, per_kind_table, wilson_interval

# q0-q2 of kind "a", q3-q5 of kind "b"; photos p0 (q0, q1), p1 (q2, q3), p2 (q4, q5).
KINDS = np.array(["a", "a", "a", "b", "b", "b"])
PHOTOS = np.array(["p0", "p0", "p1", "p1", "p2", "p2"])
HITS = {"x": np.array([1.0, 1, 0, 1, 0, 1]), "y": np.array([1.0, 0, 0, 0, 0, 0])}


def test_per_kind_table_by_hand():
    t = per_kind_table(HITS, KINDS, PHOTOS, [("x", "y")])
    assert list(t) == ["all", "a", "b"]  # "all" first, then the kinds sorted
    assert [t[k]["n"] for k in t] == [6, 3, 3]
    # x hits 4 of 6 (a: q0, q1; b: q3, q5), y hits q0 only
    for kind, k_x, k_y, n in (("all", 4, 1, 6), ("a", 2, 1, 3), ("b", 2, 0, 3)):
        for name, k in (("x", k_x), ("y", k_y)):
            lo, hi = wilson_interval(k, n)
            assert t[kind]["scorers"][name] == {"r1": round(k / n, 4), "lo": round(lo, 4), "hi": round(hi, 4)}
    assert t["b"]["scorers"]["y"]["lo"] == 0.0  # no hits: the Wilson interval starts at 0
    # x - y per query: 0, 1, 0, 1, 0, 1 -> all 3/6; a (q0-q2) 1/3; b (q3-q5) 2/3
    assert [t[k]["diffs"]["x - y"]["d"] for k in t] == [0.5, round(1 / 3, 4), round(2 / 3, 4)]
    for kind, sel in (("all", slice(None)), ("a", slice(0, 3)), ("b", slice(3, 6))):
        d, lo, hi = paired_bootstrap(HITS["x"][sel], HITS["y"][sel], PHOTOS[sel])
        assert t[kind]["diffs"]["x - y"] == {"d": round(d, 4), "lo": round(lo, 4), "hi": round(hi, 4)}
        assert lo <= d <= hi
    # kind b's photos: p1 has one query (q3: +1), p2 two (q4: 0, q5: +1); a resample of only p1 gives 1, of only
    # p2 gives 1/2, so every bootstrap mean lies in [1/2, 1]
    assert 0.5 <= t["b"]["diffs"]["x - y"]["lo"] <= t["b"]["diffs"]["x - y"]["hi"] <= 1.0


def test_per_kind_table_order_rounding_and_empty_kinds():
    t = per_kind_table(HITS, list(KINDS), list(PHOTOS), [("y", "x"), ("x", "x")], kinds_order=("b", "c", "a"),
                       digits=None)
    assert list(t) == ["all", "b", "a"]  # the given order; "c" has no queries
    assert t["a"]["scorers"]["x"]["r1"] == 2 / 3  # not rounded
    assert list(t["all"]["diffs"]) == ["y - x", "x - x"]
    assert t["all"]["diffs"]["y - x"]["d"] == -0.5
    assert t["a"]["diffs"]["x - x"] == {"d": 0.0, "lo": 0.0, "hi": 0.0}
    assert per_kind_table({}, np.array([], dtype=str), np.array([], dtype=str)) == {}


@pytest.mark.parametrize("bad", [
    {"hits": {"x": HITS["x"][:5], "y": HITS["y"]}},  # one scorer short
    {"photos": PHOTOS[:5]},
    {"kinds": KINDS[:5]},
    {"kinds": "a"},  # not an array of kinds
    {"hits": {"x": HITS["x"].reshape(2, 3)}},  # not 1-D
    {"diffs": [("x", "z")]},  # no scorer z
])
def test_per_kind_table_rejects(bad):
    args = {"hits": HITS, "kinds": KINDS, "photos": PHOTOS, "diffs": [("x", "y")], **bad}
    with pytest.raises(ValueError):
        per_kind_table(**args)


def test_evaluate_head_layout_from_the_table():
    """evaluate_head's per-kind rows: n, each scorer, and (with a head) "diff" of trained-maxsim minus the others."""
    from regis.models.head import TokenHead
    from training.photos.evaluate import SCORERS, evaluate_head, scorer_hits

    torch.manual_seed(0)
    g = torch.nn.functional.normalize(torch.randn(4, 3, 2), dim=-1).half()
    record = {"seed": 0, "gallery": g, "queries": g[[0, 1, 2, 3, 0, 2]], "gallery_photos": ["p0", "p1", "p2", "p3"],
              "relevance": torch.eye(4, dtype=torch.bool)[[0, 1, 2, 3, 0, 2]], "kinds": ["crops"] * 3 + ["easy"] * 3,
              "photos": ["p0", "p1", "p2", "p3", "p0", "p2"]}
    untrained = evaluate_head([record], None)["per_kind"]
    assert list(untrained) == ["all", "easy", "crops"]  # the evalset's order of KINDS
    assert list(untrained["all"]) == ["n", "untrained-global", "untrained-maxsim"]

    head = TokenHead(2, 2, hidden=0)
    trained = evaluate_head([record], head)["per_kind"]["all"]
    assert list(trained) == ["n", *SCORERS, "diff"]
    assert list(trained["diff"]) == [f"trained-maxsim - {s}" for s in SCORERS[:-1]]
    hits = {f"untrained-{k}": v for k, v in scorer_hits(record, None).items()}
    hits |= {f"trained-{k}": v for k, v in scorer_hits(record, head).items()}
    diffs = [("trained-maxsim", s) for s in SCORERS[:-1]]
    expected = per_kind_table(hits, record["kinds"], record["photos"], diffs)["all"]
    assert trained["n"] == 6
    assert {s: trained[s] for s in SCORERS} == expected["scorers"]
    assert trained["diff"] == expected["diffs"]
