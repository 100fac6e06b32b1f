"""Near-duplicate groups (regis.duplicates): the mechanics on tiny random tokens and handmade pair tables, the
results on a small set of real photos (an edited copy found, a crop's direction right, another shot kept apart,
an upload joining its group), the REST route and the command line."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from regis.duplicates import relations as rel
from regis.duplicates.config import DuplicateConfig, parse_overrides
from regis.duplicates.groups import group_pairs
from regis.duplicates.store import PairTable
from regis.errors import ConfigError


# ------------------------------------------------------------------ relations and groups on handmade tables
def _table(rows: list[dict]) -> PairTable:
    t = PairTable.empty(len(rows))
    for k, r in enumerate(rows):
        for name, value in r.items():
            getattr(t, name)[k] = value
    return t


def test_relations_follow_the_thresholds():
    cfg = DuplicateConfig(floor=0.45, min_inliers=15, edited_min_cover=0.8, edited_max_cover=0.95, crop_cover=0.9,
                          token_edited=0.97, token_scene=0.75)
    t = _table([
        dict(a=0, b=1, s_ab=1.0, s_ba=1.0, exact=True),                                       # exact
        dict(a=0, b=2, s_ab=0.9, s_ba=0.9, inliers=100, cover_a=0.99, cover_b=0.85),          # edited (border)
        dict(a=0, b=3, s_ab=0.6, s_ba=0.7, inliers=80, cover_a=0.30, cover_b=1.0),            # 3 lies in 0: crop
        dict(a=0, b=4, s_ab=0.8, s_ba=0.8, inliers=90, cover_a=0.88, cover_b=0.86),           # shifted: scene
        dict(a=0, b=5, s_ab=0.98, s_ba=0.985),                                                # unverified copy
        dict(a=0, b=6, s_ab=0.5, s_ba=0.8),                                                   # unverified scene
        dict(a=0, b=7, s_ab=0.5, s_ba=0.6, inliers=5, cover_a=1.0, cover_b=1.0),              # too few inliers
        dict(a=0, b=8, s_ab=0.4, s_ba=0.42, inliers=200, cover_a=1.0, cover_b=1.0),           # under the floor
        dict(a=2, b=3, s_ab=0.7, s_ba=0.6, inliers=80, cover_a=1.0, cover_b=0.35),            # 2 lies in 3: crop
    ])
    relation, container = rel.classify(t, cfg)
    assert relation.tolist() == [rel.EXACT, rel.EDITED, rel.CROP, rel.SCENE, rel.EDITED, rel.SCENE, rel.NONE,
                                 rel.NONE, rel.CROP]
    assert container[2] == 0 and container[8] == 3 and (np.delete(container, [2, 8]) == -1).all()
    stricter = cfg.with_overrides({"edited_min_cover": 0.9})
    assert rel.classify(t, stricter)[0][1] == rel.CROP  # the bordered copy lies in 0 but covers too little of it
    assert rel.describe(rel.CROP, 0, 3, 0, 0.30, 1.0, True) == "image 3 is a crop of image 0 (it shows 30 % of it)"


def test_token_rule_for_verified_pairs_and_the_verification_gate():
    cfg = DuplicateConfig(floor=0.45, min_inliers=15, edited_min_cover=0.8, edited_max_cover=0.95, crop_cover=0.9,
                          token_edited=0.97, token_scene=0.75, token_edited_verified=0.95)
    t = _table([
        dict(a=0, b=4, s_ab=0.96, s_ba=0.97, inliers=90, cover_a=1.0, cover_b=0.7),            # wide border
        dict(a=0, b=5, s_ab=0.9, s_ba=0.6, inliers=90, cover_a=1.0, cover_b=0.4),              # crop
        dict(a=0, b=6, s_ab=0.96, s_ba=0.96, inliers=90, cover_a=0.8, cover_b=0.8),            # shifted, same tokens
    ])
    relation, container = rel.classify(t, cfg)
    assert relation.tolist() == [rel.EDITED, rel.CROP, rel.EDITED] and container.tolist() == [-1, 5, -1]
    off = cfg.with_overrides({"token_edited_verified": None})
    assert rel.classify(t, off)[0].tolist() == [rel.CROP, rel.CROP, rel.SCENE]
    # a gate above a pair's scores: that pair is read as unverified (a run with this gate does not verify it)
    gated = cfg.with_overrides({"verify_floor": 0.93})
    assert rel.is_verified(t, gated).tolist() == [True, False, True]
    assert rel.classify(t, gated)[0].tolist() == [rel.EDITED, rel.SCENE, rel.EDITED]  # 0.9 / 0.6: by its tokens


def test_verification_gate_and_locality_order():
    from regis.duplicates.finder import locality_order, to_verify

    t = _table([dict(a=0, b=1, s_ab=0.5, s_ba=0.9), dict(a=0, b=2, s_ab=0.5, s_ba=0.5, inliers=0),
                dict(a=1, b=2, s_ab=1.0, s_ba=1.0, exact=True)])
    assert to_verify(t, DuplicateConfig()).tolist() == [0, 1]
    assert to_verify(t, DuplicateConfig(verify_floor=0.6)).tolist() == [0]
    # a chain 0-1-2-...-9 listed shuffled: in the order, each pair shares an image with the one before it
    rng = np.random.default_rng(0)
    a = np.arange(9)
    perm = rng.permutation(9)
    order = locality_order(a[perm], a[perm] + 1)
    chain = [(int(a[perm][k]), int(a[perm][k] + 1)) for k in order]
    assert sorted(order.tolist()) == list(range(9))
    assert all(set(x) & set(y) for x, y in zip(chain, chain[1:], strict=False))


def test_groups_are_copies_only_and_every_pair_is_listed_once():
    cfg = DuplicateConfig(floor=0.4)
    t = _table([
        dict(a=0, b=1, s_ab=0.9, s_ba=0.9, inliers=50, cover_a=1.0, cover_b=0.97),   # 0 ~ 1 copies
        dict(a=1, b=2, s_ab=0.9, s_ba=0.9, inliers=50, cover_a=0.98, cover_b=1.0),   # 1 ~ 2 copies: one group
        dict(a=2, b=5, s_ab=0.6, s_ba=0.6, inliers=50, cover_a=1.0, cover_b=0.4),    # 2 in 5: crop, 5 outside
        dict(a=0, b=3, s_ab=0.8, s_ba=0.8, inliers=50, cover_a=0.85, cover_b=0.85),  # 3: another shot of 0
        dict(a=3, b=4, s_ab=0.9, s_ba=0.9, inliers=50, cover_a=1.0, cover_b=1.0),    # 3 ~ 4 copies
        dict(a=6, b=7, s_ab=0.7, s_ba=0.5, inliers=50, cover_a=0.9, cover_b=0.3),    # 6 in 7: crop, both alone
    ])
    grouping = group_pairs(t, cfg)
    # groups: copies {0, 1, 2} and {3, 4}; 5 (which contains 2) and 7 (which contains 6) alone, with their crops
    assert [g.images for g in grouping.groups] == [[0, 1, 2], [3, 4], [5], [7]]
    assert [g.pairs for g in grouping.groups] == [[0, 1], [4], [], []]
    # a crop is listed with its container's group, another shot with its lower id's (0, for the pair 0-3)
    assert [g.related for g in grouping.groups] == [[3], [], [2], [5]]
    assert grouping.container[2] == 5 and grouping.container[5] == 7
    assert grouping.counts()["duplicate_groups"] == 2 and grouping.counts()["redundant_images"] == 3
    merged = group_pairs(t, cfg, merge=("same_scene",))
    assert merged.groups[0].images == [0, 1, 2, 3, 4] and sorted(merged.groups[0].pairs) == [0, 1, 3, 4]
    with pytest.raises(ValueError, match="unknown relation"):
        group_pairs(t, cfg, merge=("edited_copy",))


def test_overrides_are_checked():
    cfg = DuplicateConfig()
    assert cfg.with_overrides({"floor": 0.6}).floor == 0.6
    with pytest.raises(ConfigError, match="unknown duplicate threshold"):
        cfg.with_overrides({"flor": 0.6})
    with pytest.raises(ConfigError, match="floor"):
        cfg.with_overrides({"floor": 3})
    assert parse_overrides(["floor=0.5", "verify=false"]) == {"floor": 0.5, "verify": False}
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_overrides(["floor"])


# ------------------------------------------------------------------ the self-join on random tokens
def _random_index(tmp_path, tiny_encoder, n=60, copies=((3, 40), (7, 41), (7, 42)), seed=0):
    """An index of n random token sets of the tiny encoder's layout; ``copies`` (source, copy) are noisy copies."""
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    rng = np.random.default_rng(seed)
    t, d = tiny_encoder.config.tokens_per_image, tiny_encoder.config.dim
    tokens = rng.normal(size=(n, t, d)).astype(np.float32)
    for src, dst in copies:
        tokens[dst] = tokens[src] + 0.15 * rng.normal(size=(t, d))
    tokens /= np.linalg.norm(tokens, axis=-1, keepdims=True)
    with IndexWriter(tmp_path / "index", tiny_encoder.config, tiny_encoder.weights_info, faiss_spec="Flat") as w:
        ids = w.allocate_ids(n)
        records = [ImageRecord(int(i), f"img{i}.png", f"{i:064x}", 64, 48, 100, 0.0) for i in ids]
        w.put(records, tokens.astype(np.float16))
        w.commit()
    return tmp_path / "index", tokens


def test_self_join_finds_the_pairs_exact_maxsim_finds(tmp_path, tiny_encoder):
    from regis.duplicates.selfjoin import self_join
    from regis.indexes.snapshot import IndexSnapshot

    index, tokens = _random_index(tmp_path, tiny_encoder)
    snap = IndexSnapshot.open(index)
    stored = snap.store.get(snap.store.live_ids).astype(np.float32)
    sims = np.einsum("atd,bsd->abts", stored, stored)
    s = sims.max(axis=3).mean(axis=2)  # s[a, b] = S(a, b) / T
    floor = 0.6
    want = {(a, b) for a in range(len(s)) for b in range(a + 1, len(s)) if max(s[a, b], s[b, a]) >= floor}
    assert want == {(3, 40), (7, 41), (7, 42), (41, 42)}
    pairs = self_join(snap, floor=floor, neighbours=8, depth=8)
    assert set(zip(pairs.a.tolist(), pairs.b.tolist(), strict=True)) == want
    for a, b, sab, sba in zip(pairs.a, pairs.b, pairs.s_ab, pairs.s_ba, strict=True):
        assert sab == pytest.approx(s[a, b], abs=1e-4) and sba == pytest.approx(s[b, a], abs=1e-4)
    only = self_join(snap, query_ids=np.array([41, 999]), floor=floor, neighbours=8, depth=8)
    assert set(zip(only.a.tolist(), only.b.tolist(), strict=True)) == {(7, 41), (41, 42)}
    snap.close()


def test_incremental_run_searches_only_new_and_changed_images(tmp_path, tiny_encoder):
    from regis.duplicates.finder import update_pairs
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    index, tokens = _random_index(tmp_path, tiny_encoder)
    cfg = DuplicateConfig(floor=0.6, depth=8, verify=False)
    with _open(index) as snap:
        first = update_pairs(snap, cfg, resolve=lambda rec: None)
    assert first.searched == 60 and first.from_version is None and len(first.stored.table) == 4
    rng = np.random.default_rng(1)
    new = tokens[3] + 0.15 * rng.normal(size=tokens[3].shape)
    new /= np.linalg.norm(new, axis=-1, keepdims=True)
    with IndexWriter(index, tiny_encoder.config, tiny_encoder.weights_info) as w:
        (i,) = w.allocate_ids(1)
        w.put([ImageRecord(int(i), "new.png", "f" * 64, 64, 48, 100, 0.0)], new[None].astype(np.float16))
        w.delete([42])
        w.commit()
    with _open(index) as snap:
        second = update_pairs(snap, cfg, resolve=lambda rec: None)
        again = update_pairs(snap, cfg, resolve=lambda rec: None)
    assert second.searched == 1 and second.from_version == 1
    pairs = set(zip(second.stored.table.a.tolist(), second.stored.table.b.tolist(), strict=True))
    assert pairs == {(3, 40), (7, 41), (3, 60), (40, 60)}  # 42 deleted, the new image 60 joins 3 and its copy
    assert not again.computed_now and again.searched == 1 and len(again.stored.table) == 4  # stored: not redone


def test_pairs_stored_by_the_join_before_centre_all_are_searched_again(tmp_path, tiny_encoder):
    """A pairs file written before the centre-all join (its candidate settings have no "join") is not reused: the
    next run searches every image again, and its file then is reused."""
    from regis.duplicates import store
    from regis.duplicates.finder import update_pairs

    index, _ = _random_index(tmp_path, tiny_encoder)
    cfg = DuplicateConfig(floor=0.6, depth=8, verify=False)
    with _open(index) as snap:
        first = update_pairs(snap, cfg, resolve=lambda rec: None)
        old = store.latest(index, snap.version)
        assert old.settings["candidates"].pop("join") == "centre-all"
        store.save(index, old)  # as written before the change
        again = update_pairs(snap, cfg, resolve=lambda rec: None)
        third = update_pairs(snap, cfg, resolve=lambda rec: None)
    assert first.searched == 60
    assert again.computed_now and again.searched == 60 and len(again.stored.table) == len(first.stored.table)
    assert not third.computed_now


class _open:
    """``IndexSnapshot.open`` as a context manager."""

    def __init__(self, index):
        from regis.indexes.snapshot import IndexSnapshot

        self.snap = IndexSnapshot.open(index)

    def __enter__(self):
        return self.snap

    def __exit__(self, *exc):
        self.snap.close()


# ------------------------------------------------------------------ real photos
def _jpeg(img: Image.Image, path, quality: int = 90) -> None:
    img.convert("RGB").save(path, format="JPEG", quality=quality)


def _captioned(img: Image.Image, text: str) -> Image.Image:
    img = img.copy()
    draw = ImageDraw.Draw(img)
    draw.text((12, img.height - 40), text, font=ImageFont.load_default(size=28), fill=(255, 255, 255),
              stroke_width=2, stroke_fill=(0, 0, 0))
    return img


@pytest.fixture(scope="module")
def dup_folder(tmp_path_factory, photos_dir):
    """Seven real-photo files: the cat photo, an edited copy of it (downscaled, captioned, JPEG q50) and a crop of
    it (the left 55 %, 40 % of the area); two shots of the coffee scene by a moved camera
    (``regis.data.near_duplicates.shot_of``); two unrelated photos."""
    from regis.data.near_duplicates import shot_of

    out = tmp_path_factory.mktemp("dups")
    cat = Image.open(photos_dir / "skimage-chelsea.png").convert("RGB")
    _jpeg(cat, out / "cat.jpg", 95)
    edit = _captioned(cat, "best cat").resize((cat.width * 6 // 10, cat.height * 6 // 10), Image.BICUBIC)
    _jpeg(edit, out / "cat-edited.jpg", 50)
    _jpeg(cat.crop((0, int(cat.height * 0.15), int(cat.width * 0.55), int(cat.height * 0.88))), out / "cat-crop.jpg")
    coffee = Image.open(photos_dir / "skimage-coffee.png").convert("RGB")
    w, h = coffee.size
    rng = np.random.default_rng(0)
    for n, (x0, y0) in enumerate(((0.0, 0.0), (0.22 * w, 0.18 * h))):  # windows of 64 % of the scene, IoU 0.45
        window = (x0, y0, x0 + 0.8 * w, y0 + 0.8 * h)
        data, _ = shot_of(coffee, window, (round(0.7 * w), round(0.7 * h)), rng)
        (out / f"coffee-shot{n + 1}.jpg").write_bytes(data)
    for name in ("skimage-astronaut.png", "skimage-rocket.jpg"):
        shutil.copy(photos_dir / name, out / name)
    return out


@pytest.fixture(scope="module")
def dup_index(tmp_path_factory, dup_folder, lite0_encoder):
    from conftest import build

    index = tmp_path_factory.mktemp("dup-index")
    build(dup_folder, index, lite0_encoder)
    return index


def _pair(out: dict, paths: dict, x: str, y: str) -> dict | None:
    """The reported pair of the images with file names x and y (any group, any list)."""
    ids = {paths[x], paths[y]}
    for g in out["groups"]:
        for p in g["pairs"] + g["related"]:
            if {p["a"], p["b"]} == ids:
                return p
    return None


def _paths(index) -> dict:
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index)
    try:
        return {r.path: i for i, r in snap.table.get_many(snap.store.live_ids.tolist()).items()}
    finally:
        snap.close()


@pytest.mark.slow
def test_real_photos_copy_found_crop_direction_right_other_shot_kept_apart(dup_index):
    from regis.duplicates.api import find_duplicates

    with _open(dup_index) as snap:
        out = find_duplicates(snap)
    paths = _paths(dup_index)
    copy = _pair(out, paths, "cat.jpg", "cat-edited.jpg")
    assert copy is not None and copy["relation"] == "edited_copy" and copy["verified"]
    group = next(g for g in out["groups"] if paths["cat.jpg"] in [i["id"] for i in g["images"]])
    assert sorted(i["id"] for i in group["images"]) == sorted([paths["cat.jpg"], paths["cat-edited.jpg"]])
    assert group["keep"] == paths["cat.jpg"]  # the larger of the two
    crop = _pair(out, paths, "cat.jpg", "cat-crop.jpg")
    assert crop["relation"] == "crop" and crop["contains"] == paths["cat.jpg"]
    assert crop["words"].startswith(f"image {paths['cat-crop.jpg']} is a crop of image {paths['cat.jpg']}")
    geo = crop["geometry"]
    assert 0.3 < (geo["a_in_b"] if crop["a"] == paths["cat.jpg"] else geo["b_covered"]) < 0.5  # 40 % of the photo
    shots = _pair(out, paths, "coffee-shot1.jpg", "coffee-shot2.jpg")
    assert shots is not None and shots["relation"] == "same_scene"  # reported ...
    for g in out["groups"]:  # ... and never in one group
        members = {i["id"] for i in g["images"]}
        assert not {paths["coffee-shot1.jpg"], paths["coffee-shot2.jpg"]} <= members
    unrelated = {paths["skimage-astronaut.png"], paths["skimage-rocket.jpg"]}
    assert not any(unrelated & {p["a"], p["b"]} for g in out["groups"] for p in g["pairs"] + g["related"])
    # the index's thresholds were written into its config on first use
    assert (dup_index / "duplicates" / "config.json").is_file()
    assert out["counts"]["duplicate_groups"] == 1


def test_two_shots_by_their_exif_times_are_never_edited_copies():
    from types import SimpleNamespace

    from regis.duplicates import finder

    cfg = DuplicateConfig(floor=0.45, min_inliers=15, edited_min_cover=0.8, edited_max_cover=0.95, crop_cover=0.9,
                          token_edited=0.97, token_scene=0.75)
    t = _table([
        dict(a=0, b=1, s_ab=0.9, s_ba=0.9, inliers=100, cover_a=0.99, cover_b=0.97),   # geometry: edited copy
        dict(a=0, b=2, s_ab=0.98, s_ba=0.985),                                         # tokens: edited copy
        dict(a=0, b=3, s_ab=1.0, s_ba=1.0, exact=True),                                # the same bytes
        dict(a=0, b=4, s_ab=0.6, s_ba=0.7, inliers=80, cover_a=0.30, cover_b=1.0),     # a crop
    ])
    assert rel.classify(t, cfg)[0].tolist() == [rel.EDITED, rel.EDITED, rel.EXACT, rel.CROP]
    meta = {0: "2024-05-01T10:00:00.10", 1: "2024-05-01T10:00:00.30", 2: "2024-05-01T10:00:01", 3: "x", 4: "y"}
    records = {i: SimpleNamespace(metadata={"file": {"captured_at": v}}) for i, v in meta.items()}
    finder.mark_shots(t, records)
    assert t.shots.all()
    assert rel.classify(t, cfg)[0].tolist() == [rel.SCENE, rel.SCENE, rel.EXACT, rel.CROP]
    assert "EXIF capture times differ" in rel.describe(rel.SCENE, 0, 1, -1, 0.99, 0.97, True, shots=True)
    # the same time, or one image without it: no evidence either way
    records[1] = SimpleNamespace(metadata={"file": {"captured_at": meta[0]}})
    records[2] = SimpleNamespace(metadata={"file": {"taken_at": "2024-05-01T10:00:01"}})
    records[3] = SimpleNamespace(metadata={})
    finder.mark_shots(t, records)
    assert t.shots.tolist() == [False, False, False, True]


def test_exif_facts_give_the_exposure_time_only_from_date_time_original():
    from regis.images.exif import captured_at, exif_facts

    def jpeg(tags: dict, sub: dict) -> bytes:
        exif = Image.Exif()
        for k, v in tags.items():
            exif[k] = v
        for k, v in sub.items():
            exif.get_ifd(0x8769)[k] = v
        buf = io.BytesIO()
        Image.new("RGB", (16, 16), "red").save(buf, format="JPEG", exif=exif)
        return buf.getvalue()

    both = exif_facts(jpeg({0x0132: "2024:05:02 09:00:00"}, {0x9003: "2024:05:01 10:00:00", 0x9291: "120"}))
    assert both["taken_at"] == "2024-05-01T10:00:00" and both["captured_at"] == "2024-05-01T10:00:00.120"
    edited = exif_facts(jpeg({0x0132: "2024:05:02 09:00:00"}, {}))  # an editor's DateTime only: not an exposure
    assert edited == {"taken_at": "2024-05-02T09:00:00"}
    assert exif_facts(jpeg({}, {0x9003: "2024:05:01 10:00:00", 0x9291: "ab"}))["captured_at"] == "2024-05-01T10:00:00"
    assert captured_at({"file": both}) == both["captured_at"] and captured_at({}) is None
    assert captured_at({"file": "not facts"}) is None


_CROP_RULES = DuplicateConfig(min_inliers=15, template_ncc=0.8, template_margin=0.05, template_max_area=0.85,
                              edited_min_cover=0.8, edited_max_cover=0.95)
_COPIES_AND_A_VERIFIED_CROP = (
    dict(a=0, b=1, s_ab=0.9, s_ba=0.9, inliers=100, cover_a=0.99, cover_b=0.97),  # 0 ~ 1: copies
    dict(a=0, b=3, s_ab=0.6, s_ba=0.6, inliers=40, cover_a=0.3, cover_b=1.0),     # 3 in 0: verified
)


def test_group_candidates_pair_a_sure_crop_with_every_copy_of_its_container():
    from regis.duplicates import finder

    cfg = DuplicateConfig(min_inliers=15, verify_floor=0.4, template_floor=0.4, template_ncc=0.8,
                          template_margin=0.05, template_max_area=0.85, edited_min_cover=0.8, edited_max_cover=0.95)
    box = [0.1, 0.1, 0.5, 0.5]
    t = _table([
        dict(a=0, b=1, s_ab=0.9, s_ba=0.9, inliers=100, cover_a=0.99, cover_b=0.97),          # 0 ~ 1: copies
        dict(a=1, b=2, s_ab=0.95, s_ba=0.95, exact=True),                                     # 1 = 2: exact
        dict(a=0, b=3, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.99, box=box),  # 3 in 0: sure crop
        dict(a=0, b=4, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.83, box=box),  # 4 in 0: not sure
        dict(a=2, b=3, s_ab=0.6, s_ba=0.6),                                                   # already a pair
    ])
    # 3 with every member of 0's group: 0 (the sure pair itself), 1 (new) and 2 (a pair already, gated out or not)
    assert finder.group_candidates(t, cfg, closed=False).tolist() == [[0, 3], [1, 3], [2, 3]]
    no_crops = cfg.with_overrides({"template_ncc": None})
    assert finder.group_candidates(t, no_crops, closed=False).tolist() == []
    alone = _table([dict(a=0, b=3, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.99, box=box)])
    assert finder.group_candidates(alone, cfg).tolist() == [[0, 3]]  # a container with no copies: only itself
    # closed: the group {0, 1, 2} also gets its own pairs, (0, 2) among them, never a candidate
    assert finder.group_candidates(t, cfg).tolist() == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
    assert finder.group_candidates(t, no_crops).tolist() == [[0, 1], [0, 2], [1, 2]]


def test_closed_group_pairs_pair_every_member_of_a_small_group_only():
    from regis.duplicates import finder

    group = {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2], 3: [3], 4: [4, 5], 5: [4, 5]}
    assert sorted(finder.closed_group_pairs(group)) == [(0, 1), (0, 2), (1, 2), (4, 5)]
    assert sorted(finder.closed_group_pairs(group, max_size=2)) == [(4, 5)]  # a group of 3 is too large: none


def test_sure_crops_of_one_photo_are_paired_with_each_other():
    """3 and 5 lie in 0 (both sure), 0 and 1 are copies: 3 and 5 are two crops of one photo, and one may lie in the
    other, so the pair (3, 5) is a candidate, though the join never paired them; 6 lies in 0 too but is not sure."""
    from regis.duplicates import finder

    cfg, box = _CROP_RULES, [0.1, 0.1, 0.5, 0.5]
    t = _table([
        *_COPIES_AND_A_VERIFIED_CROP,                                                         # 0 ~ 1, 3 in 0
        dict(a=1, b=5, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.99, box=box),  # 5 in 1: sure
        dict(a=0, b=6, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.81, box=box),  # 6 in 0: not sure
    ])
    got = finder.group_candidates(t, cfg, closed=False).tolist()
    assert got == [[0, 3], [0, 5], [1, 3], [1, 5], [3, 5]]
    assert [3, 5] not in finder.group_candidates(t, cfg, closed=False, siblings=False).tolist()
    group = {0: [0, 1], 1: [0, 1], 3: [3, 4], 4: [3, 4], 5: [5]}
    assert finder.sibling_crop_pairs([{3, 4, 5}], group) == {(3, 5), (4, 5)}  # 3 and 4 are copies: not siblings
    assert finder.sibling_crop_pairs([{3, 4, 5}], group, max_size=2) == set()


def test_group_candidates_follow_containment_through_crops_of_crops():
    """5 lies in 3 and 3 in 0 (both sure), 0 and 1 are copies: 5 is a crop of 3, 0 and 1 (a crop of a crop of a
    photo is a crop of the photo); 6 lies in 5 but is not sure, so nothing goes through it; a cycle of containment
    (two wrong sure crops) ends."""
    from regis.duplicates import finder

    cfg, box = _CROP_RULES, [0.1, 0.1, 0.5, 0.5]
    t = _table([
        *_COPIES_AND_A_VERIFIED_CROP,                                                         # 0 ~ 1, 3 in 0
        dict(a=3, b=5, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.99, box=box),  # 5 in 3: sure
        dict(a=5, b=6, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.83, box=box),  # 6 in 5: not sure
    ])
    relation, container = rel.classify(t, cfg)
    assert relation[1:3].tolist() == [rel.CROP, rel.CROP] and container[1:3].tolist() == [0, 3]
    got = finder.group_candidates(t, cfg, closed=False).tolist()
    assert got == [[0, 3], [0, 5], [1, 3], [1, 5], [3, 5]]
    cycle = _table([
        dict(a=0, b=1, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.99, box=box),  # 1 in 0: sure
        dict(a=1, b=2, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.99, box=box),  # 2 in 1: sure
        dict(a=0, b=2, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.99, ncc_ba=0.3, box=box),  # 0 in 2: sure (wrong)
    ])
    assert finder.group_candidates(cycle, cfg, closed=False).tolist() == [[0, 1], [0, 2], [1, 2]]


def test_a_group_round_verifies_and_searches_the_pairs_the_token_gates_kept_out(monkeypatch):
    """A shipped run verifies only pairs inside the token gates; the group stage marks the pairs through a sure crop
    and sends the ones never matched to verification (then the template search), the matched but unsearched ones
    to the template search alone, and new pairs to both; pairs already marked are left alone."""
    from types import SimpleNamespace

    from regis.duplicates import finder

    cfg = DuplicateConfig(floor=0.35, min_inliers=15, verify_floor=0.4, template_floor=0.45, template_ncc=0.8,
                          template_margin=0.05, template_max_area=0.85, edited_min_cover=0.8, edited_max_cover=0.95)
    box = [0.1, 0.1, 0.5, 0.5]
    t = _table([
        dict(a=0, b=1, s_ab=0.9, s_ba=0.9, inliers=100, cover_a=0.99, cover_b=0.97, files=True),  # 0 ~ 1: copies
        dict(a=1, b=2, s_ab=0.9, s_ba=0.9, inliers=100, cover_a=0.99, cover_b=0.97, files=True),  # 1 ~ 2: copies
        dict(a=0, b=5, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.99, box=box,
             files=True),                                                                        # 5 in 0: sure
        dict(a=1, b=5, s_ab=0.36, s_ba=0.3),                  # under verify_floor: never matched
        dict(a=2, b=4, s_ab=0.5, s_ba=0.5, files=True),       # unrelated to the crop: left alone
    ])
    calls = []
    monkeypatch.setattr(finder, "_verify", lambda pairs, records, resolve, config, workers, progress, rows_all=None,
                        match=True, feats=None: calls.append((len(pairs), None if rows_all is None
                                                              else rows_all.tolist(), match)))
    monkeypatch.setattr(finder, "score_pairs", lambda snap, a, b: (np.full(len(a), 0.2, np.float32),
                                                                    np.full(len(a), 0.2, np.float32)))
    monkeypatch.setattr(finder, "_exact", lambda pairs, records, resolve, config, workers=1: None)
    records = {i: SimpleNamespace(width=300, height=200, metadata={}) for i in range(6)}
    new, marked, added = finder._group_round(None, t, records, None, cfg, cfg, 1, None)
    # marked: the group's own pairs (0, 1) and (1, 2), the sure pair itself and (1, 5)
    assert t.by_group.tolist() == [1, 1, 1, 1, 0] and marked == 4
    # new: the group's pair (0, 2), never a candidate, and the crop with the third copy, (2, 5)
    assert list(zip(new.a.tolist(), new.b.tolist(), strict=True)) == [(0, 2), (2, 5)]
    assert new.by_group.tolist() == [2, 2] and added == 2
    assert calls == [(5, [3], True), (2, None, True)]  # (1, 5) matched (then searched); the new pairs
    assert finder.to_verify(new, cfg).tolist() == [0, 1]  # ... are verified though their tokens score 0.2
    calls.clear()
    again = finder._group_round(None, finder.PairTable.concat([t, new]), records, None, cfg, cfg, 1, None)
    assert again[1:] == (0, 0) and calls == []  # every pair marked already: nothing again
    # a pair matched by the run but kept out of the template search by template_floor: searched alone
    t3 = _table([dict(a=0, b=5, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.3, ncc_ba=0.99, box=box, files=True),
                 dict(a=0, b=1, s_ab=0.9, s_ba=0.9, inliers=100, cover_a=0.99, cover_b=0.97, files=True),
                 dict(a=1, b=5, s_ab=0.42, s_ba=0.3, files=True, inliers=3)])
    finder._group_round(None, t3, records, None, cfg, cfg, 1, None)
    assert calls == [(3, [2], False)]


def test_pairs_through_a_sure_crop_are_decided_by_their_evidence_not_the_token_gates():
    """A pair paired through a sure crop (``by_group``) is decided by its verification and template search even
    below the floor, ``verify_floor`` and ``template_floor``; the same evidence without the flag is not."""
    cfg = DuplicateConfig(floor=0.35, min_inliers=15, verify_floor=0.4, template_floor=0.4, template_ncc=0.8,
                          template_margin=0.05, template_max_area=0.85, crop_cover=0.8, edited_min_cover=0.8,
                          edited_max_cover=0.95)
    box = [0.1, 0.1, 0.5, 0.5]
    rows = [dict(a=0, b=1, s_ab=0.37, s_ba=0.3, inliers=90, cover_a=0.3, cover_b=1.0),            # 1 in 0: verified
            dict(a=0, b=2, s_ab=0.32, s_ba=0.3, located=True, ncc_ab=0.4, ncc_ba=0.97, box=box)]  # 2 in 0: template
    gated = _table(rows)
    assert rel.classify(gated, cfg)[0].tolist() == [rel.NONE, rel.NONE]
    from regis.duplicates import finder

    assert finder.to_verify(gated, cfg).tolist() == [] and not finder.template_gated(gated, cfg).any()
    grouped = _table([{**r, "by_group": True} for r in rows])
    relation, container = rel.classify(grouped, cfg)
    assert relation.tolist() == [rel.CROP, rel.CROP] and container.tolist() == [0, 0]
    assert finder.to_verify(grouped, cfg).tolist() == [0, 1] and finder.template_gated(grouped, cfg).all()


@pytest.mark.slow
def test_a_crop_found_in_one_copy_becomes_a_candidate_of_the_others(dup_index, tmp_path):
    """With one candidate per image the self-join pairs the cat's crop with one copy of the cat only; the crop
    found there, it is paired with the other copy through their duplicate group, scored from the stored tokens as
    the join scores, verified, and called a crop of it."""
    from regis.duplicates import finder
    from regis.duplicates.config import shipped_calibration
    from regis.duplicates.selfjoin import score_pairs
    from regis.indexes.snapshot import IndexSnapshot
    from regis.models.registry import DEFAULT_BACKBONE

    index = tmp_path / "index"
    shutil.copytree(dup_index, index, ignore=shutil.ignore_patterns("duplicates"))
    paths = _paths(index)
    cat, edited, crop = paths["cat.jpg"], paths["cat-edited.jpg"], paths["cat-crop.jpg"]
    cfg = shipped_calibration(DEFAULT_BACKBONE).with_overrides({"neighbours": 1})
    snap = IndexSnapshot.open(index)
    try:
        cand = finder.self_join(snap, floor=cfg.floor, neighbours=1)
        joined = set(zip(cand.a.tolist(), cand.b.tolist(), strict=True))
        assert sum((min(x, crop), max(x, crop)) in joined for x in (cat, edited)) == 1  # the join: one copy only
        run = finder.update_pairs(snap, cfg, full=True)
        t = run.stored.table
        relation, container = finder.rel.classify(t, cfg)
        rows = {(int(a), int(b)): r for r, (a, b) in enumerate(zip(t.a.tolist(), t.b.tolist(), strict=True))}
        assert run.stored.settings["group_candidates"]["added"] >= 1
        found = [(x, crop) for x in (cat, edited) if (min(x, crop), max(x, crop)) in rows]
        assert len(found) == 2  # both copies paired with the crop, one of them through the group
        through = []
        for x, _ in found:
            r = rows[(min(x, crop), max(x, crop))]
            assert relation[r] == finder.rel.CROP and container[r] == x
            through.append(int(t.by_group[r]))
        assert sorted(through) == [1, 2]  # the join's pair (the sure crop) marked, the other added through the group
        saved = finder.store.latest(index, snap.version).table
        assert saved.by_group.dtype == np.int8 and (saved.by_group == t.by_group).all()
        assert run.stored.settings["group_candidates"]["rounds"] >= 1
        described = np.unique(np.concatenate([t.a[t.files], t.b[t.files]]))  # images whose features were used
        computed = (run.stored.settings["verification"]["features_computed"],
                    run.stored.settings["group_candidates"]["features_computed"])
        assert sum(computed) == len(described)  # each described once: the group stage reuses the run's features
        r = rows[(min(cat, edited), max(cat, edited))]
        assert relation[r] == finder.rel.EDITED
        s_ab, s_ba = score_pairs(snap, t.a, t.b)  # every row's scores are the join's scoring of its tokens
        assert np.allclose(s_ab, t.s_ab, atol=1e-4) and np.allclose(s_ba, t.s_ba, atol=1e-4)
    finally:
        snap.close()


@pytest.mark.slow
def test_batched_self_join_gives_the_per_image_pairs_on_real_photos(dup_index):
    """The vectorised batch (one unique of (query, owner), one token read, vectorised floor and neighbour cut) keeps
    exactly the pairs and scores of the image-by-image path, with a low floor and a cut that bites (ties included),
    and says where its time went."""
    from regis.duplicates.selfjoin import STAGES, self_join
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(dup_index)
    try:
        for floor, neighbours, batch in ((0.0, 2, 3), (0.3, 1, 256), (0.5, 16, 5)):
            stats: dict = {}
            fast = self_join(snap, floor=floor, neighbours=neighbours, batch=batch, stats=stats)
            slow = self_join(snap, floor=floor, neighbours=neighbours, batch=batch, per_image=True)
            assert len(fast) > 0
            assert fast.a.tolist() == slow.a.tolist() and fast.b.tolist() == slow.b.tolist()
            np.testing.assert_allclose(fast.s_ab, slow.s_ab, atol=1e-6)
            np.testing.assert_allclose(fast.s_ba, slow.s_ba, atol=1e-6)
            assert {f"{k}_ms" for k in STAGES} <= set(stats) and stats["pairs"] == len(fast)
            assert stats["queries"] == len(snap.store.live_ids) and stats["candidates"] >= len(fast)
        # a query subset: only its pairs
        some = snap.store.live_ids[:2]
        part = self_join(snap, query_ids=some, floor=0.0, neighbours=3)
        assert len(part) > 0 and np.isin(part.a, some).__or__(np.isin(part.b, some)).all()
    finally:
        snap.close()


def test_an_upload_joins_its_group_and_only_it_is_searched(dup_index, dup_folder, tmp_path):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    index = tmp_path / "index"
    shutil.copytree(dup_index, index)
    settings = Settings(index_dir=index, images_root=dup_folder, enable_jobs=True, index_poll_s=0.2,
                        batch_max_size=1, torch_threads=1)
    with TestClient(create_app(settings)) as client:
        first = client.get("/v1/duplicates", params={"wait": 60})
        assert first.status_code == 200
        before = first.json()
        assert before["counts"]["duplicate_groups"] == 1
        cat = Image.open(dup_folder / "cat.jpg")
        data = io.BytesIO()
        _captioned(cat, "#tbt").resize((cat.width // 2, cat.height // 2)).save(data, format="JPEG", quality=70)
        up = client.post("/v1/images", files={"files": ("cat-again.jpg", data.getvalue(), "image/jpeg")})
        assert up.status_code == 201, up.text
        new_id = up.json()["images"][0]["id"]
        r = client.get("/v1/duplicates", params={"wait": 60, "explain": "true"})
        assert r.status_code == 200
        after = r.json()
        assert after["index_version"] == before["index_version"] + 1
        assert after["run"]["searched"] == 1 and after["run"]["reused_pairs"] >= 1  # only the upload was searched
        group = after["groups"][0]
        assert new_id in [i["id"] for i in group["images"]] and len(group["images"]) == 3
        pair = next(p for p in group["pairs"] if new_id in (p["a"], p["b"]))
        assert pair["relation"] == "edited_copy" and pair["explanation"]["a_to_b"]["matches"]
        assert client.get("/v1/duplicates", params={"thresholds": '{"floor": 2}'}).status_code == 422
        assert client.get("/v1/duplicates", params={"merge": "edited_copy"}).status_code == 422
        assert client.get("/duplicates").status_code == 200


@pytest.mark.slow
def test_command_line(dup_index, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    index = tmp_path / "index"
    shutil.copytree(dup_index, index)
    runner = CliRunner()
    r = runner.invoke(app, ["duplicates", str(index), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "1 duplicate groups" in r.output and "edited copy of" in r.output and "crop of" in r.output
    r = runner.invoke(app, ["duplicates", str(index), "--json", "--relation", "crop", "--no-progress"])
    out = json.loads(r.output)
    assert not out["run"]["computed_now"]  # stored with the index version by the first run
    assert {p["relation"] for g in out["groups"] for p in g["pairs"] + g["related"]} == {"crop"}
    r = runner.invoke(app, ["duplicates", str(index), "--set", "edited_min_cover=0.99", "--save", "--show-config"])
    assert r.exit_code == 0 and json.loads(r.stdout)["edited_min_cover"] == 0.99
    assert json.loads((index / "duplicates" / "config.json").read_text())["edited_min_cover"] == 0.99
    r = runner.invoke(app, ["duplicates", str(index), "--set", "flor=1"])
    assert r.exit_code != 0


# ------------------------------------------------------------------ burst frames (geometry, shipped thresholds)
def _relation_of_shots(photos_dir, name: str, shift: float) -> str:
    """The relation the shipped calibration gives two shots of a real photo by a camera moved by ``shift`` of the
    width (windows of 81 % of the area, a small perspective change, a moved subject, own exposure:
    ``regis.data.near_duplicates.shot_of``), from their geometric verification."""
    from regis.data.near_duplicates import shot_of
    from regis.duplicates.config import shipped_calibration
    from regis.duplicates.geometry import local_features, verify_pair
    from regis.models.registry import DEFAULT_BACKBONE

    img = Image.open(photos_dir / name).convert("RGB")
    w, h = img.size
    rng = np.random.default_rng(1)
    feats = []
    for x0, y0 in ((0.0, 0.0), (shift * w, 0.5 * shift * h)):
        data, _ = shot_of(img, (x0, y0, x0 + 0.9 * w, y0 + 0.9 * h), (round(0.7 * w), round(0.7 * h)), rng)
        feats.append(local_features(data))
    v = verify_pair(*feats)
    assert v is not None and v.inliers >= 100  # the shots match: the question is what they are called
    t = _table([dict(a=0, b=1, s_ab=0.9, s_ba=0.9, inliers=v.inliers, cover_a=v.cover_a, cover_b=v.cover_b)])
    return rel.NAMES.get(int(rel.classify(t, shipped_calibration(DEFAULT_BACKBONE))[0][0]), "none")


def test_exact_copies_are_the_same_bytes_or_the_same_decoded_pixels(photos_dir, tmp_path):
    """A byte copy (same SHA-256) and a PNG re-saved with other compression (other bytes, same pixels) are exact
    copies; a JPEG of the same size is not (its pixels differ), nor are the same pixels whose tokens disagree
    (never decoded: ``exact_tokens``). The pixel comparisons run on two threads."""
    import hashlib
    from types import SimpleNamespace

    from regis.duplicates import finder

    photo = Image.open(photos_dir / "skimage-chelsea.png").convert("RGB")
    files = [tmp_path / "a.png", tmp_path / "b.png", tmp_path / "c.png", tmp_path / "d.jpg"]
    photo.save(files[0], compress_level=9)
    shutil.copy(files[0], files[1])
    photo.save(files[2], compress_level=1)
    photo.save(files[3], quality=95)
    records = {i: SimpleNamespace(sha256=hashlib.sha256(f.read_bytes()).hexdigest(), width=photo.width,
                                  height=photo.height, path=f) for i, f in enumerate(files)}
    assert records[0].sha256 == records[1].sha256 != records[2].sha256
    t = _table([dict(a=0, b=1, s_ab=0.5, s_ba=0.5),     # the same bytes: whatever the tokens say
                dict(a=0, b=2, s_ab=0.99, s_ba=0.99),   # the same pixels, other bytes
                dict(a=0, b=3, s_ab=0.99, s_ba=0.99),   # a JPEG: other pixels
                dict(a=1, b=2, s_ab=0.99, s_ba=0.9)])   # the same pixels, tokens below exact_tokens one way
    finder._exact(t, records, lambda rec: rec.path, DuplicateConfig(exact_tokens=0.97), workers=2)
    assert t.exact.tolist() == [True, True, False, False]


def test_local_features_are_orbs_keypoints_strongest_first(photos_dir):
    """ORB's keypoints of the 640-px grey copy, reordered by FAST response (strongest first, ties in ORB's order),
    their positions normalised by the copy's size; a flat image has none."""
    import cv2

    from regis.duplicates.geometry import load_gray, local_features

    gray = load_gray(photos_dir / "skimage-chelsea.png")
    feats = local_features(gray)
    orb = cv2.ORB_create(nfeatures=2000, scaleFactor=1.2, nlevels=8, fastThreshold=10)
    keypoints, descriptors = orb.detectAndCompute(np.asarray(gray), None)
    order = sorted(range(len(keypoints)), key=lambda i: -keypoints[i].response)  # sorted() is stable
    assert gray.size == feats.size and max(gray.size) == 640 and len(order) > 500
    assert np.array_equal(feats.descriptors, descriptors[order])
    expected = np.array([keypoints[i].pt for i in order], np.float32) / np.array(gray.size, np.float32)
    assert feats.points.dtype == np.float32 and np.array_equal(feats.points, expected)
    flat = local_features(Image.new("L", (320, 240), 128))
    assert flat.points.shape == (0, 2) and flat.descriptors.shape == (0, 32) and flat.thumb.shape == (120, 160)


def test_verify_pair_uses_the_matcher_it_is_given(photos_dir):
    from regis.duplicates.geometry import nearest_two, verify_pair

    photo, crop = _small_photo_and_crop(photos_dir, "skimage-chelsea.png", (0.1, 0.1, 0.9, 0.9), 1.0)
    exact = verify_pair(crop, photo)
    assert exact is not None and exact.inliers >= 50
    calls = []

    def spy(a, b, ratio):
        calls.append((len(a), len(b), ratio))
        return nearest_two(a, b, ratio)

    same = verify_pair(crop, photo, match=spy)
    assert calls == [(len(crop.descriptors), len(photo.descriptors), 0.8)] and same.inliers == exact.inliers
    none = verify_pair(crop, photo, match=lambda a, b, ratio: (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    assert none is None  # no matches: no homography


@pytest.mark.parametrize("name", ["skimage-coffee.png", "skimage-chelsea.png"])
def test_a_moved_camera_shot_is_the_same_scene(photos_dir, name):
    assert _relation_of_shots(photos_dir, name, 0.20) == "same_scene"


@pytest.mark.xfail(strict=True, reason="known limitation (docs/DUPLICATES.md): without EXIF capture times, a burst "
                   "frame whose camera moved by 2 % of the width frames 95 % of the same view, so its geometry is an "
                   "edited copy's and it is grouped with the other frame; the labelled set's other shots (55-75 % "
                   "windows) do not cover it")
@pytest.mark.parametrize("name", ["skimage-coffee.png", "skimage-chelsea.png"])
def test_a_burst_frame_is_the_same_scene(photos_dir, name):
    assert _relation_of_shots(photos_dir, name, 0.02) == "same_scene"


def _shot_with_exif(img: Image.Image, path, when: str | None, subsec: str | None, scale: float = 1.0) -> None:
    """``img`` as a JPEG at ``path`` whose EXIF says it was exposed at ``when`` ("YYYY:MM:DD HH:MM:SS") and
    ``subsec`` (None: no EXIF)."""
    exif = Image.Exif()
    if when is not None:
        exif.get_ifd(0x8769)[0x9003] = when
        if subsec is not None:
            exif.get_ifd(0x8769)[0x9291] = subsec
    if scale != 1.0:
        img = img.resize((round(img.width * scale), round(img.height * scale)), Image.BICUBIC)
    img.save(path, format="JPEG", quality=85, exif=exif)


@pytest.mark.slow
def test_burst_frames_with_their_exif_times_are_two_shots_and_kept_apart(tmp_path, photos_dir, lite0_encoder):
    """Two burst frames of one scene (the camera moved by 2 % of the width, a moved subject, their own exposure:
    an edited copy's geometry, ``test_a_burst_frame_is_the_same_scene``) exposed 0.2 s apart by the EXIF: reported
    as two shots of the same scene, never grouped; a resized copy of one frame that keeps its EXIF stays its edited
    copy; without the EXIF times the same evidence would group the frames."""
    from conftest import build
    from regis.data.near_duplicates import shot_of
    from regis.duplicates import store
    from regis.duplicates.api import find_duplicates, index_config

    img = Image.open(photos_dir / "skimage-chelsea.png").convert("RGB")
    w, h = img.size
    rng = np.random.default_rng(1)
    folder = tmp_path / "burst"
    folder.mkdir()
    frames = []
    for x0, y0 in ((0.0, 0.0), (0.02 * w, 0.01 * h)):
        data, _ = shot_of(img, (x0, y0, x0 + 0.9 * w, y0 + 0.9 * h), (round(0.7 * w), round(0.7 * h)), rng)
        frames.append(Image.open(io.BytesIO(data)).convert("RGB"))
    _shot_with_exif(frames[0], folder / "frame1.jpg", "2024:05:01 10:00:00", "10")
    _shot_with_exif(frames[1], folder / "frame2.jpg", "2024:05:01 10:00:00", "30")
    _shot_with_exif(frames[0], folder / "frame1-small.jpg", "2024:05:01 10:00:00", "10", scale=0.7)
    shutil.copy(photos_dir / "skimage-astronaut.png", folder / "astronaut.png")
    index = tmp_path / "index"
    build(folder, index, lite0_encoder)
    paths = _paths(index)
    with _open(index) as snap:
        out = find_duplicates(snap)
        table, config = store.latest(index, snap.version).table, index_config(snap)
    burst = _pair(out, paths, "frame1.jpg", "frame2.jpg")
    assert burst is not None and burst["relation"] == "same_scene" and burst["verified"]
    assert "EXIF capture times differ" in burst["words"]
    copy = _pair(out, paths, "frame1.jpg", "frame1-small.jpg")
    assert copy is not None and copy["relation"] == "edited_copy"
    group = next(g for g in out["groups"] if paths["frame1.jpg"] in [i["id"] for i in g["images"]])
    assert sorted(i["id"] for i in group["images"]) == sorted([paths["frame1.jpg"], paths["frame1-small.jpg"]])
    # the evidence alone (no EXIF): the frames would be an edited copy of each other
    a, b = sorted((paths["frame1.jpg"], paths["frame2.jpg"]))
    row = int(np.flatnonzero((table.a == a) & (table.b == b))[0])
    assert table.shots[row]
    table.shots[:] = False
    assert rel.classify(table.take([row]), config)[0][0] == rel.EDITED


def test_stored_pairs_are_reused_only_when_they_were_verified_at_or_below_the_gate(monkeypatch):
    from types import SimpleNamespace

    from regis.duplicates import finder, store

    def stored(verify_floor):
        cfg = DuplicateConfig(floor=0.35, verify_floor=verify_floor)
        return SimpleNamespace(version=3, settings={"candidates": cfg.candidate_settings()})

    snapshot = SimpleNamespace(index_dir="unused", version=3)
    for have, want, reused in [(None, 0.4, True), (0.4, 0.4, True), (0.4, 0.5, True), (0.4, 0.3, False),
                               (0.4, None, False), (None, None, True)]:
        monkeypatch.setattr(store, "latest", lambda index_dir, version, have=have: stored(have))
        got = finder._reusable(snapshot, DuplicateConfig(floor=0.35, verify_floor=want), full=False)
        assert (got is not None) == reused, (have, want)
    # pairs stored before the gate existed (no verify_floor in their settings): every candidate was verified
    old = DuplicateConfig(floor=0.35).candidate_settings()
    del old["verify_floor"]
    monkeypatch.setattr(store, "latest", lambda index_dir, version: SimpleNamespace(version=3,
                                                                                     settings={"candidates": old}))
    assert finder._reusable(snapshot, DuplicateConfig(floor=0.35, verify_floor=0.4), full=False) is not None


# ------------------------------------------------------------------ template search (crops of small images)
def test_template_rule_calls_crops_verification_missed():
    cfg = DuplicateConfig(floor=0.45, min_inliers=15, token_edited=0.97, token_scene=0.75, verify_floor=0.5,
                          template_ncc=0.85, template_margin=0.1, template_max_area=0.85)
    box = [0.1, 0.2, 0.5, 0.6]  # 16 % of the container
    t = _table([
        dict(a=0, b=1, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.95, ncc_ba=0.5, box=box),   # 0 lies in 1
        dict(a=0, b=2, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.4, ncc_ba=0.93, box=box),   # 2 lies in 0
        dict(a=0, b=3, s_ab=0.6, s_ba=0.8, located=True, ncc_ab=0.95, ncc_ba=0.9, box=box),   # no margin: scene
        dict(a=0, b=4, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.95, ncc_ba=0.2,
             box=[0.0, 0.0, 1.0, 0.95]),                                                        # a whole frame
        dict(a=0, b=5, s_ab=0.46, s_ba=0.47, located=True, ncc_ab=0.95, ncc_ba=0.2, box=box),  # under the gate
        dict(a=0, b=6, s_ab=0.6, s_ba=0.6, located=False, ncc_ab=0.95, ncc_ba=0.2, box=box),  # not searched
        dict(a=0, b=7, s_ab=0.6, s_ba=0.6, inliers=90, cover_a=0.99, cover_b=0.97,            # verified copy
             located=True, ncc_ab=0.95, ncc_ba=0.2, box=box),
    ])
    relation, container = rel.classify(t, cfg)
    assert relation.tolist() == [rel.CROP, rel.CROP, rel.SCENE, rel.NONE, rel.NONE, rel.NONE, rel.EDITED]
    assert container.tolist()[:2] == [1, 0]
    assert rel.classify(t, cfg.with_overrides({"template_ncc": None}))[0][:2].tolist() == [rel.NONE, rel.NONE]


def test_pairs_stored_before_the_template_search_load_unsearched_and_are_selected(tmp_path):
    from regis.duplicates import finder, store

    t = _table([dict(a=0, b=1, s_ab=0.6, s_ba=0.6, files=True),                # unverified: search it
                dict(a=0, b=2, s_ab=0.6, s_ba=0.6, files=True, inliers=90),    # verified: no need
                dict(a=0, b=3, s_ab=0.3, s_ba=0.35, files=True)])              # under the gate
    arrays = {k: v for k, v in t.arrays().items()
              if k not in ("located", "ncc_ab", "ncc_ba", "box", "refine_from", "by_group")}
    path = store._file(tmp_path, 4)
    path.parent.mkdir(parents=True)
    np.savez(path, searched=np.arange(4), sha256=np.array([b"x"] * 4, "S64"), settings=np.array("{}"), **arrays)
    got = store.load(tmp_path, 4).table
    assert not got.located.any() and got.box.shape == (3, 4)
    assert np.isneginf(got.refine_from).all()  # written before the bar: every direction was at full size
    assert got.by_group.dtype == np.int8 and not got.by_group.any()  # written before the group stage lifted gates
    from types import SimpleNamespace

    cfg = DuplicateConfig(min_inliers=15, verify_floor=0.4)
    records = {i: SimpleNamespace(width=320, height=240) for i in range(4)}
    assert finder.to_locate(got, cfg, records).tolist() == [0]
    assert finder.to_locate(got, cfg.with_overrides({"template": False}), records).tolist() == []


def test_the_template_search_bar_is_stored_and_a_lower_crop_rule_searches_again(tmp_path, photos_dir, monkeypatch):
    """A run searches a direction at full size only when its half-size peak reaches template_ncc - 0.1
    (``finder.refine_bar``), stores that bar with the pair, and a call whose rule is lower searches it again (a
    peak reported at half size could decide there); a higher rule does not."""
    from types import SimpleNamespace

    from regis.duplicates import finder

    photo, crop = _small_photo_and_crop(photos_dir, "skimage-chelsea.png", (0.2, 0.3, 0.6, 0.7), 0.7)
    cfg = DuplicateConfig(min_inliers=15, verify_floor=0.4, template_ncc=0.8)
    assert finder.refine_bar(cfg) == pytest.approx(0.7)
    assert finder.refine_bar(cfg.with_overrides({"template_ncc": None})) == -np.inf
    t = _table([dict(a=0, b=1, s_ab=0.6, s_ba=0.6)])
    records = {i: SimpleNamespace(width=320, height=240) for i in range(2)}
    seen = []
    real_locate = finder.locate
    monkeypatch.setattr(finder, "locate", lambda a, b, refine_from=None: seen.append(refine_from)
                        or real_locate(a, b, refine_from=refine_from))
    monkeypatch.setattr(finder, "verify_pair", lambda a, b: None)  # ORB found nothing: the template search runs
    monkeypatch.setattr(finder._Features, "many", lambda self, ids, pool: {0: crop, 1: photo})
    finder._verify(t, records, lambda i: None, cfg, 1, None)
    assert seen == [pytest.approx(0.7)] and t.located[0] and t.refine_from[0] == pytest.approx(0.7)
    assert t.ncc_ab[0] >= 0.9  # the crop's direction passed the bar: searched at full size
    assert finder.to_locate(t, cfg, records).tolist() == []
    assert finder.to_locate(t, cfg.with_overrides({"template_ncc": 0.9}), records).tolist() == []
    assert finder.to_locate(t, cfg.with_overrides({"template_ncc": 0.7}), records).tolist() == [0]
    assert finder.to_locate(t, cfg.with_overrides({"template_ncc": None}), records).tolist() == []  # rule off
    finder._verify(t, records, lambda i: None, cfg.with_overrides({"template_ncc": None}), 1, None,
                   np.array([0]), match=False)
    assert seen[-1] is None and np.isneginf(t.refine_from[0])  # the rule off: every direction at full size


def test_the_template_search_is_gated_by_the_smaller_images_size():
    """``template_max_side``: only pairs whose smaller image (by its longest side) is below it are searched by
    template; the size of the larger image and an image's orientation do not matter."""
    from types import SimpleNamespace

    from regis.duplicates import finder

    t = _table([dict(a=0, b=1, s_ab=0.6, s_ba=0.6, files=True),   # 2000 x 1500 and 300 x 400: searched
                dict(a=0, b=2, s_ab=0.6, s_ba=0.6, files=True),   # 2000 x 1500 and 480 x 640 (portrait): not
                dict(a=2, b=3, s_ab=0.6, s_ba=0.6, files=True)])  # 480 x 640 and 639 x 100: searched
    records = {0: SimpleNamespace(width=2000, height=1500), 1: SimpleNamespace(width=300, height=400),
               2: SimpleNamespace(width=480, height=640), 3: SimpleNamespace(width=639, height=100)}
    cfg = DuplicateConfig(min_inliers=15, verify_floor=0.4, template_max_side=640)
    assert finder.template_sized(t, records, cfg).tolist() == [True, False, True]
    assert finder.to_locate(t, cfg, records).tolist() == [0, 2]
    assert finder.to_locate(t, cfg.with_overrides({"template_max_side": None}), records).tolist() == [0, 1, 2]


def _small_photo_and_crop(photos_dir, name: str, box: tuple[float, float, float, float], scale: float):
    """A real photo reduced to a small one (longest side 240 px), and a crop of it (``box``: fractions), rescaled
    by ``scale`` and saved as JPEG q80, as thumbnails (``template.thumbnail``) of their ORB copies."""
    from regis.duplicates.geometry import local_features

    img = Image.open(photos_dir / name).convert("RGB")
    img.thumbnail((240, 240))
    w, h = img.size
    crop = img.crop((round(box[0] * w), round(box[1] * h), round(box[2] * w), round(box[3] * h)))
    crop = crop.resize((max(1, round(crop.width * scale)), max(1, round(crop.height * scale))))
    files = []
    for im in (img, crop):
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=80)
        files.append(local_features(buf.getvalue()))
    return files


@pytest.mark.parametrize("name", ["skimage-coffee.png", "skimage-chelsea.png", "skimage-astronaut.png"])
def test_template_search_finds_a_small_crop_and_its_container(photos_dir, name):
    from regis.duplicates.template import locate

    photo, crop = _small_photo_and_crop(photos_dir, name, (0.2, 0.3, 0.6, 0.7), 0.7)  # 16 % of the area
    found = locate(crop.thumb, photo.thumb)
    assert found.ncc_ab >= 0.9 and found.ncc_ab - found.ncc_ba >= 0.2, found
    assert np.allclose(found.box, [0.2, 0.3, 0.6, 0.7], atol=0.04), found.box
    other, _ = _small_photo_and_crop(photos_dir, "skimage-rocket.jpg", (0, 0, 1, 1), 1.0)  # another photo
    unrelated = locate(crop.thumb, other.thumb)
    assert max(unrelated.ncc_ab, unrelated.ncc_ba) < 0.8, unrelated
    # without the full-size pass where the half-size one found nothing: the crop's direction is searched in full
    # (the same peak and window); a direction below the bar reports its half-size peak, still below it
    quick = locate(crop.thumb, photo.thumb, refine_from=0.7)
    assert quick.ncc_ab == found.ncc_ab and np.array_equal(quick.box, found.box), quick
    assert quick.ncc_ba < 0.7 or quick.ncc_ba == found.ncc_ba
    low = locate(crop.thumb, other.thumb, refine_from=1.01)  # nothing refined: half-size peaks only
    assert max(low.ncc_ab, low.ncc_ba) < 0.8 and (low.ncc_ab, low.ncc_ba) != (unrelated.ncc_ab, unrelated.ncc_ba)
    # a quarter-size first pass keeping 3 scales (measured, not shipped) finds the same window
    pyramid = locate(crop.thumb, photo.thumb, pyramid=3)
    assert pyramid.ncc_ab >= 0.9 and np.allclose(pyramid.box, found.box, atol=0.02), pyramid
    assert max(locate(crop.thumb, other.thumb, pyramid=3).ncc_ab, 0) < 0.8


def test_verification_ceiling_skips_pairs_the_tokens_decide(monkeypatch):
    from types import SimpleNamespace

    from regis.duplicates import finder, store

    cfg = DuplicateConfig(floor=0.35, verify_floor=0.4, token_edited=0.97, token_edited_verified=0.97,
                          verify_ceiling=0.97, min_inliers=15, edited_min_cover=0.8, edited_max_cover=0.95)
    t = _table([dict(a=0, b=1, s_ab=0.98, s_ba=0.99, inliers=90, cover_a=1.0, cover_b=0.3),  # tokens: a copy
                dict(a=0, b=2, s_ab=0.98, s_ba=0.90, inliers=90, cover_a=1.0, cover_b=0.3),  # one way below: crop
                dict(a=0, b=3, s_ab=0.5, s_ba=0.5)])
    assert finder.to_verify(t, cfg).tolist() == [1, 2]
    off = cfg.with_overrides({"verify_ceiling": None})
    assert rel.classify(t, cfg)[0].tolist() == rel.classify(t, off)[0].tolist() == [rel.EDITED, rel.CROP, rel.NONE]
    snapshot = SimpleNamespace(index_dir="unused", version=3)
    for have, want, reused in [(None, 0.97, True), (0.97, 0.97, True), (0.99, 0.97, True), (0.97, 0.99, False),
                               (0.97, None, False)]:
        stored = SimpleNamespace(version=3, settings={"candidates": cfg.with_overrides(
            {"verify_ceiling": have}).candidate_settings()})
        monkeypatch.setattr(store, "latest", lambda index_dir, version, stored=stored: stored)
        got = finder._reusable(snapshot, cfg.with_overrides({"verify_ceiling": want}), full=False)
        assert (got is not None) == reused, (have, want)


def test_prefilter_rejects_unrelated_photos_and_keeps_a_crop(photos_dir):
    from regis.duplicates.geometry import local_features, prefilter

    def feats(name, box=(0, 0, 1, 1)):
        img = Image.open(photos_dir / name).convert("RGB")
        w, h = img.size
        buf = io.BytesIO()
        img.crop((round(box[0] * w), round(box[1] * h), round(box[2] * w), round(box[3] * h))).save(buf, "JPEG")
        return local_features(buf.getvalue())

    coffee, chelsea = feats("skimage-coffee.png"), feats("skimage-chelsea.png")
    crop = feats("skimage-coffee.png", (0.1, 0.1, 0.6, 0.7))  # 30 % of the area
    assert prefilter(coffee, crop) >= 40 > 20 > prefilter(coffee, chelsea)
    cfg = DuplicateConfig(min_inliers=15, prefilter=20)
    t = _table([dict(a=0, b=1, s_ab=0.6, s_ba=0.6, inliers=90, pre=30), dict(a=0, b=2, s_ab=0.6, s_ba=0.6,
                inliers=90, pre=5), dict(a=0, b=3, s_ab=0.6, s_ba=0.6, inliers=90, pre=-1)])
    assert rel.is_verified(t, cfg).tolist() == [True, False, True]  # -1: matched in full without the first match


def test_a_template_crop_is_reported_with_its_window():
    from regis.duplicates import report
    from service.schemas_duplicates import DuplicatePair

    cfg = DuplicateConfig(template_ncc=0.85, verify_floor=0.4)
    t = _table([dict(a=0, b=1, s_ab=0.6, s_ba=0.6, located=True, ncc_ab=0.95, ncc_ba=0.5, box=[0.1, 0.2, 0.5, 0.6])])
    relation, container = rel.classify(t, cfg)
    got = DuplicatePair.model_validate(report.pair_json(t, 0, int(relation[0]), int(container[0]), cfg))
    assert (got.relation, got.contains, got.verified, got.geometry) == ("crop", 1, False, None)
    assert got.words == "image 0 is a crop of image 1 (it shows 16 % of it)"
    assert got.template.window == [0.1, 0.2, 0.5, 0.6] and got.template.a_in_b_ncc == 0.95


def centre_all(tokens: np.ndarray, t: int) -> np.ndarray:
    """s[a, b] = S(a, b) / T of the duplicates self-join on a two-framing index ("centre-all"): each of a's T
    centre-crop tokens' best cosine among all of b's tokens (both framings), averaged; tokens (n, 2T, D) float32."""
    return np.einsum("atd,bsd->abts", tokens[:, :t], tokens).max(axis=3).mean(axis=2)


def test_a_two_framing_index_is_joined_on_its_centre_crop_against_both_framings(tmp_path):
    """"center-crop+aspect" indexes (2T tokens an image): the self-join searches FAISS with the centre crop's T
    tokens and scores each direction as the centre crop's tokens against all 2T of the other image ("centre-all"):
    a crop cut off by its container's centre crop is found through the container's whole-image tokens; a pair alike
    only in the aspect framing is not found; every score is recomputed here from the stored tokens."""
    from regis.duplicates.selfjoin import self_join
    from regis.indexes.snapshot import IndexSnapshot
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter
    from regis.models.config import EncoderConfig, WeightsInfo

    config = EncoderConfig(backbone="efficientnet-lite0", kind="cnn", num_registers=4, dim=16, cue_method="grid",
                           roi_size=1, cue_pooling="gem", roi_image_size=160, query_layout="tokens+roi-cues",
                           frame="center-crop+aspect", framing_score="best", mean=(0.485, 0.456, 0.406),
                           std=(0.229, 0.224, 0.225))
    n, t2, d = 40, config.tokens_per_image, config.dim
    t = t2 // 2
    rng = np.random.default_rng(1)
    tokens = rng.normal(size=(n, t2, d)).astype(np.float32)
    tokens[30, :t] = tokens[3, :t] + 0.15 * rng.normal(size=(t, d))  # a copy in the centre crop (and not beyond)
    tokens[31, t:] = tokens[5, t:]  # alike only in the aspect framing
    tokens[[3, 30], t:] = tokens[[3, 30], :t]  # square photos: both framings alike, the aspect tokens crowd the crop's
    tokens[12, :t] = tokens[8, t:] + 0.15 * rng.normal(size=(t, d))  # a crop of 8 that 8's centre crop cuts off
    tokens /= np.linalg.norm(tokens, axis=-1, keepdims=True)
    with IndexWriter(tmp_path / "index", config, WeightsInfo(source="t", sha256="0"), faiss_spec="Flat") as w:
        ids = w.allocate_ids(n)
        w.put([ImageRecord(int(i), f"img{i}.png", f"{i:064x}", 64, 48, 100, 0.0) for i in ids],
              tokens.astype(np.float16))
        w.commit()
    snap = IndexSnapshot.open(tmp_path / "index")
    stored = snap.store.get(snap.store.live_ids).astype(np.float32)
    s = centre_all(stored, t)
    crop = stored[:, :t]
    s_centre = np.einsum("atd,bsd->abts", crop, crop).max(axis=3).mean(axis=2)  # the centre crops alone (before)
    floor = 0.6
    want = {(a, b) for a in range(n) for b in range(a + 1, n) if max(s[a, b], s[b, a]) >= floor}
    assert want == {(3, 30), (8, 12)} and max(s_centre[8, 12], s_centre[12, 8]) < floor  # the crop: centre-all only
    for per_image in (False, True):
        pairs = self_join(snap, floor=floor, neighbours=8, depth=8, per_image=per_image)
        assert set(zip(pairs.a.tolist(), pairs.b.tolist(), strict=True)) == want
        for a, b, sab, sba in zip(pairs.a, pairs.b, pairs.s_ab, pairs.s_ba, strict=True):
            assert sab == pytest.approx(s[a, b], abs=1e-4) and sba == pytest.approx(s[b, a], abs=1e-4)
    # depth per framing: a crop token's 2 nearest are its own two framings' tokens, its copy's come next
    shallow = self_join(snap, floor=floor, neighbours=8, depth=2)
    assert {(3, 30)} <= set(zip(shallow.a.tolist(), shallow.b.tolist(), strict=True)) <= want
    snap.close()


@pytest.fixture(scope="module")
def dup_index_two_framings(tmp_path_factory, dup_folder):
    """``dup_folder`` indexed by EfficientNet-Lite0 (real weights) with two framings per image, scored apart: the
    default of new CNN indexes ("center-crop+aspect", framing score "best")."""
    from conftest import build
    from regis.models.encoder import build_encoder

    encoder = build_encoder("efficientnet-lite0", frame="center-crop+aspect", framing_score="best")
    index = tmp_path_factory.mktemp("dup-index-2f")
    build(dup_folder, index, encoder)
    return index


@pytest.mark.slow
def test_a_two_framing_pairs_explanation_is_of_what_the_join_scored(dup_index_two_framings):
    """On a two-framing index the self-join scores each direction's centre crop against all of the other image's
    tokens (S / T over the centre crop's T tokens); a pair's explanation (CLI and REST: ``find_duplicates(
    explain=True)``) explains exactly that, so its score is the pair's score in both directions, with matches in
    either framing of the other image."""
    from regis.duplicates.api import find_duplicates
    from regis.duplicates.report import explain_pair
    from regis.duplicates.selfjoin import self_join

    with _open(dup_index_two_framings) as snap:
        assert snap.manifest.encoder.framings == 2 and snap.manifest.encoder.framing_score == "best"
        t = snap.manifest.tokens_per_image // 2
        pairs = self_join(snap, floor=0.3, neighbours=8)
        assert len(pairs) >= 3
        in_whole = 0
        for a, b, sab, sba in zip(pairs.a, pairs.b, pairs.s_ab, pairs.s_ba, strict=True):
            ex = explain_pair(snap, int(a), int(b))
            assert ex["framing"] == "crop"
            for key, want in (("a_to_b", sab), ("b_to_a", sba)):
                e = ex[key]
                assert e["score"] / t == pytest.approx(float(want), abs=2e-5), (a, b, key)
                assert e["score_per_token"] == pytest.approx(float(want), abs=2e-5)
                assert len(e["matches"]) == t and all(m["query_name"].startswith("crop-") for m in e["matches"])
                in_whole += sum(m["result_token"] >= t for m in e["matches"])
        assert in_whole > 0  # some centre-crop tokens matched best in the other image's whole-image framing
        out = find_duplicates(snap, overrides={"verify": False}, explain=True)
    reported = [p for g in out["groups"] for p in g["pairs"] + g["related"]]
    assert reported
    for p in reported:
        ex = p["explanation"]
        assert ex["framing"] == "crop"
        for key in ("a_to_b", "b_to_a"):
            assert ex[key]["score_per_token"] == pytest.approx(p["scores"][key], abs=6e-5)


@pytest.mark.slow
def test_a_two_framing_join_reads_whole_rows_and_scores_centre_all(dup_index_two_framings, monkeypatch):
    """The join of a two-framing index reads whole rows (both framings' 2T tokens) and keeps the pairs and scores
    of the exact centre-all MaxSim over them, vectorised and image by image alike."""
    from regis.duplicates.selfjoin import self_join
    from regis.indexes import store as store_module

    reads: list[int] = []
    pread = store_module._pread_into

    def counted(fd, view, offset):
        reads.append(len(view))
        return pread(fd, view, offset)

    with _open(dup_index_two_framings) as snap:
        ids = snap.store.live_ids
        t2, d = snap.manifest.tokens_per_image, snap.manifest.encoder.dim
        t = t2 // 2
        s = centre_all(snap.store.get(ids).astype(np.float32), t)
        monkeypatch.setattr(store_module, "_pread_into", counted)
        for floor, neighbours, per_image in ((0.0, 3, False), (0.0, 3, True), (0.4, 16, False), (0.4, 16, True)):
            reads.clear()
            pairs = self_join(snap, floor=floor, neighbours=neighbours, per_image=per_image, batch=4)
            assert reads and all(r % (t2 * d * 2) == 0 for r in reads)  # whole rows (2T x D float16), both framings
            rows = {(int(ids[a]), int(ids[b])) for a in range(len(ids)) for b in range(a + 1, len(ids))
                    if max(s[a, b], s[b, a]) >= floor}
            got = set(zip(pairs.a.tolist(), pairs.b.tolist(), strict=True))
            assert got <= rows and (neighbours < len(ids) - 1 or got == rows)
            pos = {int(i): k for k, i in enumerate(ids)}
            for a, b, sab, sba in zip(pairs.a, pairs.b, pairs.s_ab, pairs.s_ba, strict=True):
                assert sab == pytest.approx(s[pos[a], pos[b]], abs=1e-5)
                assert sba == pytest.approx(s[pos[b], pos[a]], abs=1e-5)
        fast = self_join(snap, floor=0.0, neighbours=2, batch=3)
        slow = self_join(snap, floor=0.0, neighbours=2, batch=3, per_image=True)
        assert fast.a.tolist() == slow.a.tolist() and fast.b.tolist() == slow.b.tolist()
        np.testing.assert_allclose(fast.s_ab, slow.s_ab, atol=1e-6)
        np.testing.assert_allclose(fast.s_ba, slow.s_ba, atol=1e-6)
