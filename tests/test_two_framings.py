"""Two framings per image (issue 29, frame "center-crop+aspect"): every image indexed with the tokens of its central
square and of the whole image; a crop from the end of a portrait is found where the centre crop alone misses it;
the manifest records the frame, queries follow the index, explanation boxes lie where each framing looked."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from conftest import build
from regis.errors import ConfigError
from regis.indexes.snapshot import IndexSnapshot
from regis.models.batching import encode_grouped
from regis.models.encoder import EncoderConfig, RegisEncoder, WeightsInfo, build_encoder
from regis.models.geometry import crop_region, image_grids, input_region, nominal_grid
from regis.models.registry import get_backbone_spec
from regis.models.transforms import eval_transform
from regis.scores.explain import token_box, token_names
from regis.scores.maxsim import maxsim_scores

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
GREY, RED, ORANGE = (110, 110, 110), (230, 20, 20), (200, 110, 60)


class _Colour(nn.Module):
    """A stand-in CNN whose features are each 32 px cell's mean colour (a 3-d token space where red is near red)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("std", torch.tensor(STD)[None, :, None, None])
        self.register_buffer("mean", torch.tensor(MEAN)[None, :, None, None])
        self.offset = nn.Parameter(torch.tensor(0.05))

    def forward_features(self, x):
        return F.avg_pool2d(x * self.std + self.mean, 32) + self.offset


def _cfg(frame: str, **kw) -> EncoderConfig:
    base = dict(backbone="efficientnet-lite0", kind="cnn", num_registers=4, dim=3, cue_method="grid", roi_size=1,
                cue_pooling="gem", roi_image_size=160, query_layout="tokens+roi-cues", frame=frame, mean=MEAN,
                std=STD)
    return EncoderConfig(**(base | kw))


def _stand_in(frame: str) -> RegisEncoder:
    return RegisEncoder(_Colour(), get_backbone_spec("efficientnet-lite0"), _cfg(frame),
                        WeightsInfo(source="t", sha256="0"))


def _portrait(band: tuple[int, int] | None, colour) -> Image.Image:
    """A 400 x 600 grey portrait with rows band[0]..band[1] painted ``colour``."""
    a = np.full((600, 400, 3), GREY, np.uint8)
    if band:
        a[band[0]:band[1]] = colour
    return Image.fromarray(a)


def test_the_layout_counts_both_framings():
    cfg = _cfg("center-crop+aspect")
    assert (cfg.framings, cfg.tokens_per_image, cfg.query_tokens_per_image, cfg.buddies_per_image) == (2, 20, 30, 10)
    assert _cfg("aspect").tokens_per_image == 10 and _cfg("aspect").buddies_per_image == 5
    names = [n for n, _ in token_names(4, 20, framings=2)]
    assert names[0] == "crop-cls" and names[5] == "crop-roi-cls" and names[10] == "whole-cls" and len(names) == 20
    # one rule for the split (regis.scores.framings.framing_split): a count that is not two equal blocks is refused,
    # not named or boxed by a floored half
    with pytest.raises(ConfigError, match="framings"):
        token_names(4, 21, framings=2)
    with pytest.raises(ConfigError, match="framings"):
        token_box(cfg, (7, 7), None, 0, 400, 600, count=31)
    with pytest.raises(ConfigError, match="needs a CNN"):
        build_encoder("vit-tiny-reg4-test", random_init=True, frame="center-crop+aspect")


def test_a_crop_from_the_top_of_a_portrait_is_found_with_both_framings_not_with_the_centre_crop(tmp_path):
    """Gallery: a portrait with a red band in its top sixth (what a centre crop cuts off) and one with an orange
    band across its middle. The query, a crop of the red band, finds the first with "center-crop+aspect" (its
    whole-image tokens saw the band), the second with "center-crop" (neither centre crop shows red; orange is
    nearer red than grey). Through the index: stored tokens and buddies per image, queries in the index's layout."""
    folder = tmp_path / "images"
    folder.mkdir()
    _portrait((0, 100), RED).save(folder / "a-red-top.png")
    _portrait((250, 350), ORANGE).save(folder / "b-orange-middle.png")
    query_image = _portrait((0, 100), RED).crop((100, 0, 300, 100))
    best = {}
    for frame in ("center-crop", "center-crop+aspect"):
        encoder = _stand_in(frame)
        build(folder, tmp_path / frame, encoder, batch_size=4)
        snap = IndexSnapshot.open(tmp_path / frame)
        assert snap.manifest.encoder.frame == frame
        assert snap.manifest.tokens_per_image == encoder.config.tokens_per_image
        ids = sorted(r.id for r in snap.table.iter_all())
        docs = torch.from_numpy(snap.store.get(np.asarray(ids)).astype(np.float32))
        assert docs.shape[1] == encoder.config.tokens_per_image
        query = encoder.encode_query(eval_transform(encoder.config)(query_image)[None])
        assert query.shape[1] == encoder.config.query_tokens_per_image
        scores = maxsim_scores(query, docs)[0]
        best[frame] = snap.table.get(ids[int(scores.argmax())]).path
    assert best["center-crop"].endswith("b-orange-middle.png")
    assert best["center-crop+aspect"].endswith("a-red-top.png")


@pytest.mark.parametrize("size, square, framing", [
    ((400, 600), (170, 20, 60), 1),     # portrait, top sixth: only the whole image's windows can show it
    ((400, 600), (170, 270, 60), 0),    # portrait, middle: the central square's windows show it too
    ((1920, 1080), (30, 500, 120), 1),  # panorama, left end
    ((1920, 1080), (900, 480, 120), 0),  # panorama, centre
])
def test_each_framings_boxes_lie_where_it_looked(size, square, framing):
    """A bright square's ROI boxes: the whole image's lie on the image's own grid and cover the square; the
    central square's lie inside ``crop_region`` on the square grid and cover it when it is there."""
    encoder = _stand_in("center-crop+aspect")
    cfg = encoder.config
    width, height = size
    x, y, s = square
    a = np.random.default_rng(0).normal(50, 10, (height, width, 3)).clip(0, 255).astype(np.uint8)
    a[y:y + s, x:x + s] = 255
    tokens, buddies, grid = encode_grouped(encoder, [eval_transform(cfg)(Image.fromarray(a))])
    assert tokens.shape == (1, 20, 3) and buddies.shape == (1, 10) and grid == nominal_grid(cfg)
    region = crop_region(cfg, width, height)
    assert input_region(cfg, width, height) == (0.0, 0.0, float(width), float(height))
    rows, cols = image_grids(cfg, width, height)[1]
    sq_rows, sq_cols = nominal_grid(cfg)

    def shown(box):
        return max(0.0, min(box[2], x + s) - max(box[0], x)) * max(0.0, min(box[3], y + s) - max(box[1], y))

    for position in range(5, 10):  # the central square's ROI tokens
        x0, y0, x1, y1 = token_box(cfg, grid, buddies[0].numpy(), position, width, height)
        assert region[0] - 1e-6 <= x0 < x1 <= region[2] + 1e-6 and region[1] - 1e-6 <= y0 < y1 <= region[3] + 1e-6
        assert x1 - x0 == pytest.approx((region[2] - region[0]) / sq_cols)
        if framing == 0:
            assert shown((x0, y0, x1, y1)) > 0, position
    for position in range(15, 20):  # the whole image's
        box = token_box(cfg, grid, buddies[0].numpy(), position, width, height)
        assert box[2] - box[0] == pytest.approx(width / cols) and box[3] - box[1] == pytest.approx(height / rows)
        assert shown(box) > 0, position
    # the query's layout: 15 tokens per framing, its ROI tokens at 5..9 and 20..24
    qbox = token_box(cfg, grid, buddies[0].numpy(), 20, width, height, count=30)
    assert qbox == token_box(cfg, grid, buddies[0].numpy(), 15, width, height)
    assert token_box(cfg, grid, buddies[0].numpy(), 10, width, height, count=30) is None  # a pass-2 cue


def test_index_build_records_two_framings_and_queries_follow_the_index(cli, tmp_path, photos_dir):
    """regis index build --frame center-crop+aspect (random EfficientNet-Lite0): the manifest records the frame,
    20 tokens and 10 buddies per image; the engine opened on the index encodes queries whole with 30 tokens; its
    explanations' boxes lie inside each result image."""
    from regis.retrieve.explain import search_explained
    from regis.retrieve.query import QueryEngine

    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("skimage-chelsea.png", "skimage-rocket.jpg"):
        (folder / name).write_bytes((photos_dir / name).read_bytes())
    index = tmp_path / "index"
    assert cli("index", "build", str(folder), "--index", str(index), "--backbone", "efficientnet-lite0",
               "--random-init", "--no-progress", "--frame", "center-crop+aspect").returncode == 0
    snap = IndexSnapshot.open(index)
    cfg = snap.manifest.encoder
    assert cfg.frame == "center-crop+aspect" and snap.manifest.tokens_per_image == 20
    assert snap.buddies.shape == (2, 10) and (snap.buddies >= 0).all()
    engine = QueryEngine.open(index, fast_encode=False)
    assert engine.encoder.config == cfg
    portrait = Image.open(photos_dir / "skimage-chelsea.png").convert("RGB").crop((0, 0, 200, 300))
    assert tuple(engine.transform(portrait).shape) == (3, 352, 224)  # the whole portrait, the encoder crops it
    buf = io.BytesIO()
    portrait.save(buf, "PNG")
    tokens, _ = engine.encode_bytes(buf.getvalue())
    assert tokens.shape == (30, cfg.dim)
    out = search_explained(engine, buf.getvalue(), k=2)
    assert len(out["results"]) == 2
    for hit in out["results"]:
        boxes = [m["result_box"] for m in hit["explanation"]["matches"] if m["result_box"]]
        assert boxes
        for x0, y0, x1, y1 in boxes:
            assert 0 <= x0 < x1 <= hit["width"] and 0 <= y0 < y1 <= hit["height"]
