"""The hard real-photo set (regis.data.hard_cases) and the encoder defaults it chose (docs/RESULTS.md, section
"Hard cases"): a tile against its whole photo."""

import numpy as np
import pytest
import torch
from PIL import Image

from regis.data.augment import color_jitter, encode_jpeg
from regis.data.hard_cases import (
    ASPECT_KINDS,
    QUERY_KINDS,
    Item,
    absent_kinds,
    build_hard_set,
    is_relevant,
    query_items,
    tile_boxes,
)
from regis.errors import ConfigError
from regis.images.decode import decode_image
from regis.models.encoder import EncoderConfig, build_encoder
from regis.models.transforms import eval_transform
from regis.scores.maxsim import maxsim_scores

BLANK = Image.new("RGB", (8, 8))


def item(kind: str, box, photo: str = "a.png") -> Item:
    return Item(BLANK, photo, kind, box)


def test_relevance_follows_the_geometry():
    w, h = 300, 300
    photo = item("photo", (0, 0, w, h))
    tiles = [item("tile", b) for b in tile_boxes(w, h)]
    corner = item("overlap", (0, 0, 200, 200))
    # a slightly shifted centre tile: its own tile only (it fills 11 % of the photo, 25 % of the corner crop)
    q = item("tile", (105, 105, 205, 205))
    assert [is_relevant(q, t) for t in tiles] == [False] * 4 + [True] + [False] * 4
    assert not is_relevant(q, photo) and not is_relevant(q, corner)
    # a 70 % view: the photo, not the tiles nor the corner crop (which shows 2/3 of it)
    view = item("view", (0, 0, 250, 250))
    assert is_relevant(view, photo) and not is_relevant(view, corner)
    assert not any(is_relevant(view, t) for t in tiles)
    # a partial view inside the corner crop: the photo and that crop
    part = item("partial", (10, 10, 190, 190))
    assert is_relevant(part, photo) and is_relevant(part, corner)
    # never across photos
    assert not is_relevant(item("view", (0, 0, 250, 250), photo="b.png"), photo)


def test_hard_set_is_seeded_and_every_query_has_an_answer(photos_dir):
    paths = sorted(photos_dir.glob("skimage-c*.png"))[:2]  # camera, cell: small grey photos
    a = build_hard_set(paths, repeats=1, seed=3)
    b = build_hard_set(paths, repeats=1, seed=3)
    assert len(a.gallery) == 2 * 16 and len(a.queries) == 2 * 7
    assert sorted(q.kind for q in a.queries) == sorted(2 * [k for k in QUERY_KINDS
                                                            if k not in ("stereo", *ASPECT_KINDS)])
    assert a.relevance.shape == (14, 32) and a.relevance.any(axis=1).all()
    assert list(absent_kinds(a.queries)) == ["stereo", *ASPECT_KINDS]  # no stereo pair, no aspect photos
    assert "motorcycle_right.png" in absent_kinds(a.queries)["stereo"]
    assert [q.box for q in a.queries] == [q.box for q in b.queries]
    pairs = zip(a.queries, b.queries, strict=True)
    assert all(np.array_equal(np.asarray(x.image), np.asarray(y.image)) for x, y in pairs)


def test_color_jpeg_has_its_own_random_stream(photos_dir):
    """The harder colour kind was added after seeds 0 and 1 were measured: it draws from its own generator, so
    every other kind's queries are what they were without it."""
    img = decode_image(photos_dir / "skimage-camera.png").image
    without = query_items("a.png", img, np.random.default_rng(5), 1)
    with_it = query_items("a.png", img, np.random.default_rng(5), 1, np.random.default_rng([5, 1]))
    assert [q.kind for q in with_it] == [q.kind for q in without] + ["color-jpeg"]
    pairs = zip(without, with_it[:-1], strict=True)
    assert all(x.box == y.box and np.array_equal(np.asarray(x.image), np.asarray(y.image)) for x, y in pairs)
    small = with_it[-1].image
    assert small.width <= 0.5 * img.width + 1 and small.height <= 0.5 * img.height + 1


def test_old_manifest_config_keeps_the_centre_crop():
    """An index written before ``frame`` existed has no such field: it reads as the centre crop it used."""
    old = dict(backbone="efficientnet-lite0", kind="cnn", num_registers=4, dim=1280, cue_method="grid",
               mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    config = EncoderConfig.model_validate(old)
    assert config.frame == "center-crop"
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (120, 300, 3), dtype=np.uint8))
    x = eval_transform(config)(img)
    # the central 224 x 224 square of the image resized to a 224-px shorter side
    from torchvision.transforms import functional as TF

    ref = TF.center_crop(TF.resize(img, 224, interpolation=TF.InterpolationMode.BICUBIC), 224)
    ref = TF.normalize(TF.to_tensor(ref), config.mean, config.std)
    assert torch.equal(x, ref)


@pytest.mark.slow
def test_defaults_tell_a_tile_from_its_photo(photos_dir, one_thread):
    """Gallery: a real photo and its 3 x 3 tiles. A re-shot 75 % view finds the photo, an edited tile its tile,
    with the default encoder: the 10 indexed tokens, and the query's 15 (``query_layout``) against them."""
    encoder = build_encoder("efficientnet-lite0")
    tf = eval_transform(encoder.config)
    img = decode_image(photos_dir / "skimage-coffee.png").image
    w, h = img.size
    boxes = tile_boxes(w, h)
    gallery = [img] + [img.crop(b) for b in boxes]
    rng = np.random.default_rng(0)
    view = img.crop((round(0.1 * w), round(0.05 * h), round(0.95 * w), round(0.93 * h))).rotate(5, Image.BICUBIC)
    view = decode_image(encode_jpeg(color_jitter(view, rng, 0.2), 60)).image
    x0, y0, x1, y1 = boxes[5]
    tile = img.crop((x0 + 6, y0 - 4, x1 + 6, y1 - 4))
    tile = decode_image(encode_jpeg(color_jitter(tile, rng, 0.2), 60)).image
    g = encoder.encode(torch.stack([tf(im) for im in gallery]))
    q = encoder.encode_query(torch.stack([tf(view), tf(tile)]))
    assert q.shape[1] == 15 and torch.allclose(q[:, :10], encoder.encode(torch.stack([tf(view), tf(tile)])))
    assert maxsim_scores(q, g).argmax(dim=1).tolist() == [0, 1 + 5]
    assert maxsim_scores(q[:, :10], g).argmax(dim=1).tolist() == [0, 1 + 5]  # an index without query_layout


def partial_view(img: Image.Image, box: tuple[float, float, float, float], seed: int) -> Image.Image:
    """The photo's region ``box`` (fractions of its sides), colour-jittered 10 %, JPEG q70, decoded."""
    w, h = img.size
    crop = img.crop((round(box[0] * w), round(box[1] * h), round(box[2] * w), round(box[3] * h)))
    return decode_image(encode_jpeg(color_jitter(crop, np.random.default_rng(seed), 0.1), 70)).image


# (photo, region of the partial view): on both, the one-pass readout (``roi_image_size=0``, the defaults before
# the 160 px ROI pass) ranks one of the photo's own tiles first (checked by hand: build_encoder(...,
# roi_image_size=0) in this test gives tiles 2 and 5)
PARTIAL_VIEWS = [("sklearn-flower.jpg", (0.05, 0.05, 0.6, 0.65)), ("skimage-page.png", (0.25, 0.2, 0.85, 0.8))]


@pytest.mark.slow
@pytest.mark.parametrize("photo, box", PARTIAL_VIEWS)
def test_defaults_find_the_photo_of_a_partial_view_not_its_tile(photos_dir, one_thread, lite0_encoder, photo, box):
    """Gallery: a real photo and its 3 x 3 tiles. A partial view (a third of the photo, spanning several tiles)
    finds the whole photo first with the default encoder, whose ROI tokens come from the 160 px pass: the
    photo's patches at that scale match the zoomed-in view better than any one tile does."""
    tf = eval_transform(lite0_encoder.config)
    img = decode_image(photos_dir / photo).image
    gallery = [img] + [img.crop(b) for b in tile_boxes(*img.size)]
    g = lite0_encoder.encode(torch.stack([tf(im) for im in gallery]))
    q = lite0_encoder.encode_query(tf(partial_view(img, box, 0))[None])
    for m in (15, 10):  # the query's default 15 tokens, and the 10 of an index without query_layout
        scores = maxsim_scores(q[:, :m], g)[0]
        assert int(scores.argmax()) == 0, (m, scores.tolist())


def test_gem_pooling_by_hand():
    from regis.models.cues import cnn_cues, gem_pool

    feats = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 8.0]]])  # (1, 4 patches, 2 dims), 2 x 2 grid
    expected = torch.tensor([(100 / 4) ** (1 / 3), (512 / 4) ** (1 / 3)])
    assert torch.allclose(gem_pool(feats, 1)[0], expected, atol=1e-4)
    cues = cnn_cues(feats, (2, 2), 4, "grid", "gem")
    # each grid cell is one patch: GeM of one value is the value (zeros clamp to 1e-6)
    assert torch.allclose(cues[0, 0], expected, atol=1e-4)
    assert torch.allclose(cues[0, 1:], feats[0].clamp(min=1e-6), atol=1e-5)
    assert torch.allclose(cnn_cues(feats, (2, 2), 4, "grid", "mean")[0, 0], feats[0].mean(0))


def test_defaults_and_old_manifests(tiny_encoder, lite0_encoder):
    """New CNN encoders: GeM pooling, N = 1; ViTs keep N = 3. A CNN index written before cue_pooling existed
    rebuilds with mean pooling and its stored N, and still matches its manifest."""
    from regis.models.encoder import encoder_from_manifest

    assert (lite0_encoder.config.cue_pooling, lite0_encoder.config.roi_size) == ("gem", 1)
    assert (lite0_encoder.config.frame, lite0_encoder.config.roi_image_size) == ("center-crop", 160)
    assert (tiny_encoder.config.cue_pooling, tiny_encoder.config.roi_size) == ("mean", 3)
    assert tiny_encoder.config.roi_image_size is None
    old = lite0_encoder.config.model_dump(exclude={"cue_pooling", "frame", "roi_image_size", "query_layout"})
    config = EncoderConfig.model_validate(old | {"roi_size": 3})
    assert (config.cue_pooling, config.frame, config.roi_image_size) == ("mean", "center-crop", None)
    assert (config.query_layout, config.query_tokens_per_image) == ("tokens", 10)
    rebuilt = encoder_from_manifest(config, lite0_encoder.weights_info)
    assert rebuilt.config == config
    # an index of the previous defaults (GeM, N = 1, one pass) rebuilds as one pass too
    one_pass = EncoderConfig.model_validate(lite0_encoder.config.model_dump(exclude={"roi_image_size",
                                                                                   "query_layout"}))
    assert encoder_from_manifest(one_pass, lite0_encoder.weights_info).forward_roi_parts(
        torch.zeros(1, 3, 224, 224)) is None


def test_query_layout_defaults_and_old_manifests(tiny_encoder, lite0_encoder):
    """New CNN encoders with a ROI pass give queries 15 tokens: the 10 indexed ones, then the 5 cues of the ROI
    pass. A manifest without ``query_layout`` (every index before it) keeps 10 query tokens; so do ViTs and
    one-pass CNNs; asking for 15 without a ROI pass is refused."""
    from regis.errors import ConfigError
    from regis.models.encoder import encoder_from_manifest

    cfg = lite0_encoder.config
    assert (cfg.query_layout, cfg.tokens_per_image, cfg.query_tokens_per_image) == ("tokens+roi-cues", 10, 15)
    assert (tiny_encoder.config.query_layout, tiny_encoder.config.query_tokens_per_image) == ("tokens", 10)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    q, t = lite0_encoder.encode_query(x), lite0_encoder.encode(x)
    assert q.shape == (2, 15, 1280) and torch.equal(q[:, :10], t)
    with torch.inference_mode():
        cues = lite0_encoder.forward_roi_parts(x)[0]
    assert torch.allclose(q[:, 10:], torch.nn.functional.normalize(cues, dim=-1), atol=1e-6)
    # an index written before the field: 10 query tokens, the same encoder otherwise
    old = EncoderConfig.model_validate(cfg.model_dump(exclude={"query_layout"}))
    rebuilt = encoder_from_manifest(old, lite0_encoder.weights_info)
    assert rebuilt.config == old and rebuilt.config.query_layout == "tokens"
    assert torch.equal(rebuilt.encode_query(x), t)
    assert build_encoder("efficientnet-lite0", roi_image_size=0).config.query_layout == "tokens"
    with pytest.raises(ConfigError):
        build_encoder("efficientnet-lite0", roi_image_size=0, query_layout="tokens+roi-cues")
    with pytest.raises(ValueError):
        EncoderConfig.model_validate(cfg.model_dump(exclude={"roi_image_size"}))


def test_end_and_middle_crops_of_portrait_and_panoramic_photos(photos_dir, tmp_path):
    """The end-crop / mid-crop kinds (issue 29) on a portrait and a panorama cut from bundled photos (the real
    corpus for the figures is Debian's: scripts/eval_hard_cases.py --aspect-photos): 10-25 % of the area, flush
    with an end of the long side (or centred on it), each with a right answer; the other kinds' queries and
    gallery items are what they are without the aspect photos (their own random stream)."""
    src = decode_image(photos_dir / "skimage-coffee.png").image  # 600 x 400
    portrait, panorama = tmp_path / "portrait.png", tmp_path / "panorama.png"
    src.crop((150, 0, 417, 400)).save(portrait)  # 267 x 400 (2:3)
    src.crop((0, 70, 600, 310)).save(panorama)  # 600 x 240 (5:2)
    base = [photos_dir / "skimage-camera.png"]
    plain = build_hard_set(base, repeats=1, seed=4)
    both = build_hard_set(base, repeats=2, seed=4, aspect_photos=[portrait, panorama])
    again = build_hard_set(base, repeats=2, seed=4, aspect_photos=[portrait, panorama])
    assert len(both.gallery) == 3 * 16 and [q.box for q in both.queries] == [q.box for q in again.queries]
    one = build_hard_set(base, repeats=1, seed=4, aspect_photos=[portrait])
    assert [q.box for q in one.queries][: len(plain.queries)] == [q.box for q in plain.queries]
    assert [g.box for g in one.gallery][:16] == [g.box for g in plain.gallery]
    aspect = [(i, q) for i, q in enumerate(both.queries) if q.kind in ASPECT_KINDS]
    assert sorted(q.kind for _, q in aspect) == sorted(2 * 2 * ["end-crop", "mid-crop"])
    for i, q in aspect:
        w, h = (267, 400) if q.photo == "portrait.png" else (600, 240)
        x0, y0, x1, y1 = q.box
        assert 0.09 <= (x1 - x0) * (y1 - y0) / (w * h) <= 0.26
        start, stop, size = (y0, y1, h) if h > w else (x0, x1, w)
        if q.kind == "end-crop":
            assert start == 0 or stop == size
        else:
            assert abs((start + stop) / 2 - size / 2) <= 1
        assert both.relevance[i].any(), q
    with pytest.raises(ConfigError, match="not a portrait"):
        build_hard_set(base, aspect_photos=[photos_dir / "skimage-astronaut.png"])
