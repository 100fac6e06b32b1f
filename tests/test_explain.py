"""Match explanations: MaxSim term by term, buddy patches stored in the index, ROI boxes in the original
image's pixels, and the explain API (``?explain=true`` and ``POST /v1/explain``)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient
from PIL import Image
from torch import nn

from conftest import build
from regis.data.augment import edit_mixed
from regis.indexes.layout import BUDDIES_FILE, MANIFEST_FILE, VERSIONS_DIR, read_current
from regis.indexes.snapshot import IndexSnapshot
from regis.models.encoder import EncoderConfig, RegisEncoder, WeightsInfo
from regis.models.geometry import grid_box, input_region
from regis.models.registry import get_backbone_spec
from regis.models.transforms import eval_transform
from regis.retrieve.explain import explain_hits
from regis.scores.explain import token_box, token_matches
from service.app import create_app
from service.settings import Settings


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# ------------------------------------------------------------------ the scoring, by hand
def test_token_matches_by_hand():
    q = np.array([[1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32)
    d = np.array([[0.8, 0.6], [0, 1], [-1, 0]], dtype=np.float32)
    m = token_matches(q, d)
    # q0: d0 0.8, d1 0, d2 -1 -> d0; q1: 0.6, 1, 0 -> d1; q2: 0.48 + 0.48 = 0.96, 0.8, -0.6 -> d0
    np.testing.assert_array_equal(m.best, [0, 1, 0])
    np.testing.assert_allclose(m.similarity, [0.8, 1.0, 0.96], rtol=1e-6)
    np.testing.assert_allclose(m.contribution, m.similarity)
    assert m.score == pytest.approx(2.76, rel=1e-6)
    np.testing.assert_allclose(m.share, np.array([0.8, 1.0, 0.96]) / 2.76, rtol=1e-6)


def test_ties_pick_the_first_result_token_like_the_max():
    q = np.array([[1.0, 0.0]], dtype=np.float32)
    d = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    assert token_matches(q, d).best.tolist() == [1]


# ------------------------------------------------------------------ geometry: grid cells <-> original pixels
@pytest.mark.parametrize("frame", ["center-crop", "squash", "pad", "aspect"])
@pytest.mark.parametrize("size", [(451, 300), (300, 451), (224, 224), (1000, 250), (97, 61)])
def test_a_painted_grid_box_lands_on_its_cell_after_the_transform(lite0_encoder, size, frame):
    """Paint the box grid_box gives for one cell; the eval transform must put the paint on that cell (and only
    there). Cells the image does not reach (the "pad" frame's padding) have no box to paint."""
    cfg = lite0_encoder.config
    if getattr(cfg, "frame", "center-crop") != frame:
        if "frame" not in EncoderConfig.model_fields:
            pytest.skip(f"this EncoderConfig has no frame option, so no {frame!r} transform to check")
        cfg = cfg.model_copy(update={"frame": frame})
    grid = (7, 7)
    tf = eval_transform(cfg)
    width, height = size
    mean, std = torch.tensor(cfg.mean)[:, None, None], torch.tensor(cfg.std)[:, None, None]

    def cells(a: np.ndarray) -> torch.Tensor:  # brightness per grid cell of the encoder's input, in [0, 1]
        x = tf(Image.fromarray(a)) * std + mean
        return F.adaptive_avg_pool2d(x.mean(0, keepdim=True), grid)[0]

    black = np.zeros((height, width, 3), np.uint8)
    baseline = cells(black)
    rx0, ry0, rx1, ry1 = input_region(cfg, width, height)
    cw, ch = (rx1 - rx0) / 7, (ry1 - ry0) / 7
    full = [(r, c) for r in range(7) for c in range(7)  # cells the image fills (the "pad" frame's are fewer)
            if rx0 + c * cw >= -0.5 and ry0 + r * ch >= -0.5 and rx0 + (c + 1) * cw <= width + 0.5
            and ry0 + (r + 1) * ch <= height + 0.5]
    rows, cols = sorted({r for r, _ in full}), sorted({c for _, c in full})
    corners = {(rows[0], cols[0]), (rows[0], cols[-1]), (rows[-1], cols[0]), (rows[-1], cols[-1]),
               (rows[len(rows) // 2], cols[len(cols) // 2])}
    for r, c in sorted(corners):
        x0, y0, x1, y1 = grid_box(cfg, grid, (r, r + 1, c, c + 1), width, height)
        a = black.copy()
        a[round(y0):round(y1), round(x0):round(x1)] = 255
        diff = cells(a) - baseline
        assert diff[r, c] > 0.85, (size, frame, r, c, diff)  # integer pixel edges: a 61 px image has 8.7 px cells
        diff[r, c] = 0
        assert diff.abs().max() < 0.15, (size, frame, r, c, diff)
    if frame != "pad":
        assert len(full) == 49


class _Brightness(nn.Module):
    """A stand-in CNN whose features are each 32 px cell's mean colour (un-normalised): the brightest cell has
    the largest dot product with every positive cue, so every buddy patch is the bright square's cell."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.register_buffer("std", torch.tensor(cfg.std)[None, :, None, None])
        self.register_buffer("mean", torch.tensor(cfg.mean)[None, :, None, None])
        self.offset = nn.Parameter(torch.tensor(0.1))  # an encoder has parameters (they say its device)

    def forward_features(self, x):
        return F.avg_pool2d(x * self.std + self.mean, 32) + self.offset


@pytest.mark.parametrize("size, square", [
    ((480, 320), (300, 40, 40)), ((320, 480), (100, 300, 40)), ((400, 400), (40, 250, 50)),
    ((640, 427), (180, 10, 50)), ((300, 300), (258, 258, 40)),
])
def test_roi_box_of_a_bright_square_covers_it(size, square):
    """End to end through the encoder: transform -> grid -> buddy patches -> N x N window -> original pixels."""
    spec = get_backbone_spec("efficientnet-lite0")
    cfg = EncoderConfig(backbone=spec.name, kind="cnn", num_registers=4, dim=3, cue_method="grid",
                        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    encoder = RegisEncoder(_Brightness(cfg), spec, cfg, WeightsInfo(source="test", sha256="0"))
    width, height = size
    x, y, s = square
    rng = np.random.default_rng(0)
    a = rng.normal(50, 10, (height, width, 3)).clip(0, 255).astype(np.uint8)
    a[y:y + s, x:x + s] = 255
    tokens, buddies, grid = encoder.encode_with_buddies(eval_transform(cfg)(Image.fromarray(a))[None])
    assert grid == (7, 7) and tokens.shape == (1, 10, 3)
    for position in range(5, 10):  # the five ROI tokens
        x0, y0, x1, y1 = token_box(cfg, grid, buddies[0].numpy(), position, width, height)
        assert x0 <= x and y0 <= y and x1 >= x + s and y1 >= y + s, (position, (x0, y0, x1, y1))
        assert (x1 - x0) <= 3 * width / 7 * 1.01 + 1  # an N x N = 3 x 3 window, not the whole image
    for position in range(5):
        assert token_box(cfg, grid, buddies[0].numpy(), position, width, height) is None


def test_encode_with_buddies_gives_the_encode_tokens(tiny_encoder):
    x = torch.randn(3, 3, 64, 64)
    tokens, buddies, grid = tiny_encoder.encode_with_buddies(x)
    torch.testing.assert_close(tokens, tiny_encoder.encode(x))
    cues, patches, g = tiny_encoder.forward_parts(x)
    assert grid == g == (8, 8) and buddies.shape == (3, 5)
    assert torch.equal(buddies, torch.einsum("bcd,bpd->bcp", cues, patches).argmax(-1))


# ------------------------------------------------------------------ the index stores buddy patches
def test_buddies_are_stored_updated_and_old_indexes_still_explain(tmp_path, photos_dir, tiny_encoder):
    photos = tmp_path / "photos"
    photos.mkdir()
    names = sorted(p.name for p in photos_dir.iterdir())
    for name in names[:6]:
        (photos / name).write_bytes((photos_dir / name).read_bytes())
    index = tmp_path / "index"
    build(photos, index, tiny_encoder)
    snap = IndexSnapshot.open(index)
    assert snap.manifest.buddies.grid == (8, 8) and snap.buddies.shape == (6, 5)
    assert (snap.buddies >= 0).all() and (snap.buddies < 64).all()
    # the stored buddies are the encoder's for that image
    first = snap.table.get(0)
    from regis.images.decode import decode_image

    pixels = eval_transform(tiny_encoder.config)(decode_image(photos / first.path).image)[None]
    _, buddies, _ = tiny_encoder.encode_with_buddies(pixels)
    assert snap.buddies[0].tolist() == buddies[0].tolist()
    snap.close()

    # an index written before buddies existed: no file, no manifest field
    vdir = index / VERSIONS_DIR / read_current(index)
    manifest = json.loads((vdir / MANIFEST_FILE).read_text())
    del manifest["buddies"]
    (vdir / MANIFEST_FILE).write_text(json.dumps(manifest))
    (vdir / BUDDIES_FILE).unlink()
    old = IndexSnapshot.open(index)
    assert old.buddies is None
    hits = [{"id": 0, "width": first.width, "height": first.height}]
    query = old.store.get(np.array([1]))[0].astype(np.float32)
    explain_hits(old, query, hits)
    matches = hits[0]["explanation"]["matches"]
    assert len(matches) == 10 and all(m["result_box"] is None for m in matches)
    old.close()

    # growing the old index: new images get buddies, old rows stay unknown (-1); deleted rows go to -1
    for name in names[6:9]:
        (photos / name).write_bytes((photos_dir / name).read_bytes())
    (photos / first.path).unlink()
    build(photos, index, tiny_encoder)
    grown = IndexSnapshot.open(index)
    assert grown.buddies.shape == (9, 5)
    assert (grown.buddies[:6] == -1).all() and (grown.buddies[6:] >= 0).all()
    grown.close()


# ------------------------------------------------------------------ the API, on the real photos
@pytest.fixture(scope="module")
def client(lite0_index):
    with TestClient(create_app(Settings(index_dir=lite0_index))) as c:
        yield c


def test_search_explain_shares_sum_to_the_returned_score(client, photos_dir):
    query = edit_mixed(Image.open(photos_dir / "skimage-chelsea.png").convert("RGB"), np.random.default_rng(1))
    r = client.post("/v1/search", files={"file": ("q.jpg", query)}, params={"k": 5, "explain": "true"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["results"][0]["path"] == "skimage-chelsea.png"
    q = body["query"]
    # the default CNN encoder's 15 query tokens: its 10 indexed ones, then the 5 cues of its 160 px ROI pass
    assert [t["kind"] for t in q["tokens"]] == ["cls"] + ["register"] * 4 + ["roi"] * 5 + ["cls"] + ["register"] * 4
    assert [t["name"] for t in q["tokens"]][9:] == ["roi-reg4", "pass2-cls"] + [f"pass2-reg{i}" for i in range(1, 5)]
    for t in q["tokens"]:
        if t["kind"] == "roi":
            x0, y0, x1, y1 = t["box"]
            assert 0 <= x0 < x1 <= q["width"] and 0 <= y0 < y1 <= q["height"]
        else:
            assert t["box"] is None
    for hit in body["results"]:
        e = hit["explanation"]
        assert len(e["matches"]) == 15
        assert sum(m["contribution"] for m in e["matches"]) == pytest.approx(hit["score"], abs=1e-4)
        assert e["score"] == pytest.approx(hit["score"], abs=1e-4)
        assert sum(m["share"] for m in e["matches"]) == pytest.approx(1.0, abs=1e-5)
        for m in e["matches"]:
            assert m["similarity"] == m["contribution"] and -1.001 <= m["similarity"] <= 1.001
            assert (m["result_box"] is not None) == (m["result_token"] >= 5)
            if m["result_box"]:
                x0, y0, x1, y1 = m["result_box"]
                assert 0 <= x0 < x1 <= hit["width"] and 0 <= y0 < y1 <= hit["height"]
    # without explain: no explanations, the same ranking, the same timing stages as before
    plain = client.post("/v1/search", files={"file": ("q.jpg", query)}, params={"k": 5}).json()
    assert plain["query"] is None and all(h["explanation"] is None for h in plain["results"])
    assert "explain" not in plain["timings_ms"] and body["timings_ms"]["explain"] >= 0
    assert [h["id"] for h in plain["results"]] == [h["id"] for h in body["results"]]


def test_pair_explanation_with_heatmap(client, photos_dir):
    data = (photos_dir / "skimage-coffee.png").read_bytes()
    search = client.post("/v1/search", files={"file": ("q.png", data)}, params={"k": 2}).json()
    top, second = search["results"]
    r = client.post("/v1/explain", files={"file": ("q.png", data)}, data={"id": second["id"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["result"] == {"id": second["id"], "width": second["width"], "height": second["height"]}
    assert body["explanation"]["score"] == pytest.approx(second["score"], abs=1e-4)
    heat = np.array(body["heatmap"]["values"])
    # on the grid of the buddy patches: the offline backbone's 160 px ROI pass, 5 x 5
    assert heat.shape == (15, 5, 5) and heat.min() >= -1.001 and heat.max() <= 1.001  # 15 query tokens
    x0, y0, x1, y1 = body["heatmap"]["region"]
    assert 0 <= x0 < x1 <= second["width"] and 0 <= y0 < y1 <= second["height"]
    same = client.post("/v1/explain", files={"file": ("q.png", data)}, data={"id": top["id"]}).json()
    # the indexed photo itself: its 10 tokens match themselves (10.0); the 5 ROI-pass cues add their best cosines
    assert same["explanation"]["score"] == pytest.approx(top["score"], abs=1e-3) and 10.0 < top["score"] < 15.0
    assert all(m["query_token"] == m["result_token"] or m["similarity"] > 0.999
               for m in same["explanation"]["matches"][:10])


@pytest.mark.parametrize("files, data, status, code", [
    ({"file": ("q.txt", b"not an image")}, {"id": 0}, 400, "invalid_image"),
    (None, {"id": 99999}, 404, "image_not_found"),
    (None, {"id": "x"}, 422, "invalid_request"),
])
def test_pair_explanation_errors(client, photos_dir, files, data, status, code):
    files = files or {"file": ("q.png", (photos_dir / "skimage-coffee.png").read_bytes())}
    r = client.post("/v1/explain", files=files, data=data)
    assert r.status_code == status and r.json()["error"]["code"] == code


def test_explain_with_offset_and_more_like_this(client, photos_dir):
    data = (photos_dir / "skimage-coffee.png").read_bytes()
    full = client.post("/v1/search", files={"file": ("q.png", data)}, params={"k": 4}).json()["results"]
    paged = client.post("/v1/search", files={"file": ("q.png", data)},
                        params={"k": 2, "offset": 2, "explain": "true"})
    assert paged.status_code == 200, paged.text
    hits = paged.json()["results"]
    assert [h["id"] for h in hits] == [h["id"] for h in full[2:4]] and hits[0]["rank"] == 3
    for hit in hits:
        assert hit["explanation"]["score"] == pytest.approx(hit["score"], abs=1e-4)

    # "more like this" by id: the query is the indexed image itself, boxes from its stored buddy patches
    top = full[0]
    r = client.get(f"/v1/images/{top['id']}/similar", params={"k": 3, "explain": "true"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["results"][0]["id"] == top["id"]
    assert body["query"]["width"] == top["width"] and body["query"]["height"] == top["height"]
    assert [t["box"] is not None for t in body["query"]["tokens"]] == [False] * 5 + [True] * 5
    for hit in body["results"]:
        assert sum(m["contribution"] for m in hit["explanation"]["matches"]) == pytest.approx(hit["score"], abs=1e-4)
    first = body["results"][0]["explanation"]["matches"]
    assert all(m["similarity"] == pytest.approx(1.0, abs=1e-3) for m in first)
    plain = client.get(f"/v1/images/{top['id']}/similar", params={"k": 3}).json()
    assert "query" not in plain and [h["id"] for h in plain["results"]] == [h["id"] for h in body["results"]]
