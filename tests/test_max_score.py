"""``max_score`` in search answers: the score of a perfect match, so that score / max_score is a similarity in
[0, 1] (1 for an identical image) whatever the index's framings and query layout. On an index of two framings
scored apart ("center-crop+aspect", framing score "best") a score is one framing's MaxSim: at most the query's
tokens per framing (15 of 30 for an upload, 10 of the 20 stored tokens for "more like this"), not the query's
token count. Real bundled photos, the default backbone (EfficientNet-Lite0)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from conftest import build
from regis.errors import ConfigError
from regis.scores.framings import perfect_score
from regis.sharding.write import split_index
from service.app import create_app
from service.settings import Settings

NAMES = ("skimage-chelsea.png", "skimage-rocket.jpg", "sklearn-china.jpg", "matplotlib-grace_hopper.jpg")


def test_a_perfect_score_counts_the_query_tokens_of_one_scored_framing():
    assert perfect_score(30, 2) == 15.0  # two framings, "best": one framing's 15 query tokens
    assert perfect_score(20, 2) == 10.0  # "more like this" on it: the 20 stored tokens
    assert perfect_score(15, 1) == 15.0  # one MaxSim (one framing, or "union"): every query token
    for m, framings in ((15, 2), (0, 1), (10, 0)):
        with pytest.raises(ConfigError, match="framings"):
            perfect_score(m, framings)


def _file(data: bytes, name: str = "q.png"):
    return {"file": (name, data, "application/octet-stream")}


def test_one_framing_index_max_score_is_the_query_token_count(lite0_index, photos_dir):
    """One framing (center-crop, query layout tokens+roi-cues): an upload's 15 tokens, the 10 stored ones for
    "more like this"; an identical image scores close to it (the 5 cue tokens match the stored ROI tokens only
    approximately)."""
    with TestClient(create_app(Settings(index_dir=lite0_index))) as client:
        found = client.post("/v1/search", files=_file((photos_dir / NAMES[0]).read_bytes()), params={"k": 1}).json()
        assert found["max_score"] == 15.0
        top = found["results"][0]
        assert top["path"] == NAMES[0] and 0.9 < top["score"] / found["max_score"] <= 1 + 1e-4
        similar = client.get(f"/v1/images/{top['id']}/similar", params={"k": 1}).json()
        assert similar["max_score"] == 10.0
        assert similar["results"][0]["id"] == top["id"]
        assert similar["results"][0]["score"] / similar["max_score"] == pytest.approx(1.0, abs=1e-3)


@pytest.fixture(scope="module")
def two_framings(tmp_path_factory, photos_dir):
    """Four bundled photos indexed with two framings scored apart (the index, and it split into 2 shards)."""
    import shutil

    from regis.models.encoder import build_encoder

    root = tmp_path_factory.mktemp("max-score")
    (root / "photos").mkdir()
    for name in NAMES:
        shutil.copy(photos_dir / name, root / "photos" / name)
    encoder = build_encoder(frame="center-crop+aspect")
    assert encoder.config.framing_score == "best" and encoder.config.query_tokens_per_image == 30
    build(root / "photos", root / "index", encoder)
    split_index(root / "index", root / "collection", 2)
    return root


@pytest.mark.heavy
@pytest.mark.parametrize("served", ["index", "collection"])
def test_an_identical_image_is_close_to_max_score_on_two_framings(two_framings, served):
    """Every route that answers a search (upload, batch, "more like this"), unsharded and sharded: max_score is
    the query's tokens per framing, and the image queried with itself scores > 95 % of it (before, the page divided
    by the 30 query tokens: an identical image read ~48 %)."""
    photos = two_framings / "photos"
    with TestClient(create_app(Settings(index_dir=two_framings / served))) as client:
        datas = [(photos / name).read_bytes() for name in NAMES]
        batch = client.post("/v1/search/batch", files=[("files", (n, d)) for n, d in zip(NAMES, datas, strict=True)],
                            params={"k": 1}).json()["results"]
        for name, data, in_batch in zip(NAMES, datas, batch, strict=True):
            for found in (client.post("/v1/search", files=_file(data, name), params={"k": 1}).json(), in_batch,
                          client.post("/v1/search", files=_file(data, name),
                                      params={"k": 1, "explain": "true"}).json()):
                assert found["max_score"] == 15.0
                top = found["results"][0]
                assert top["path"] == name
                assert 0.95 < top["score"] / found["max_score"] <= 1 + 1e-4, (name, top["score"])
            similar = client.get(f"/v1/images/{top['id']}/similar", params={"k": 1}).json()
            assert similar["max_score"] == 10.0
            assert similar["results"][0]["id"] == top["id"]
            assert similar["results"][0]["score"] / similar["max_score"] == pytest.approx(1.0, abs=1e-3)
