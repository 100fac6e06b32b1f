"""The torch-free query path of `regis search` (issue 25, item 5): preprocessing in PIL + numpy, the backbone as an
ONNX model, the readout and the MaxSim rerank in numpy (``regis.models.query_bundle``, ``regis.retrieve.light``).
It must give the torch path's answers on real photos, and a search in a fresh process must import neither torch nor
timm once the bundle is on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import build

# ~1.5 min in all (ONNX export of a real backbone), so CI runs it in `make test-heavy`
pytestmark = [pytest.mark.slow, pytest.mark.heavy]


@pytest.fixture(scope="module")
def regis_encoder():
    """The demo's encoder: EfficientNet-Lite0 with regis's token head (D = 256, a ROI pass, 15 query tokens)."""
    from regis.models.encoder import build_encoder

    return build_encoder("efficientnet-lite0-regis")


@pytest.fixture(scope="module")
def regis_index(tmp_path_factory, photos_dir, regis_encoder) -> Path:
    """The 21 bundled photos indexed as `make demo` indexes them."""
    index = tmp_path_factory.mktemp("regis-index")
    build(photos_dir, index, regis_encoder)
    return index


@pytest.fixture(scope="module")
def bundle_root(tmp_path_factory, regis_encoder) -> Path:
    """A bundle folder holding the demo encoder's bundle."""
    from regis.models.query_export import write_query_bundle

    root = tmp_path_factory.mktemp("bundles")
    write_query_bundle(regis_encoder, root)
    return root


def _photos(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in {".png", ".jpg", ".jpeg"})


@pytest.mark.parametrize("frame", ["center-crop", "squash", "pad", "aspect", "center-crop+aspect"])
@pytest.mark.parametrize("resize_size", [224, 256])
def test_pixels_equal_torchvision_bit_for_bit(photos_dir, frame, resize_size):
    from regis.images.decode import decode_image
    from regis.models.config import EncoderConfig
    from regis.models.np_transforms import eval_pixels
    from regis.models.transforms import eval_transform

    config = EncoderConfig(backbone="efficientnet-lite0", kind="cnn", num_registers=4, dim=1280, cue_method="grid",
                           frame=frame, resize_size=resize_size, mean=(0.485, 0.456, 0.406),
                           std=(0.229, 0.224, 0.225))
    transform = eval_transform(config)
    shapes = set()
    for path in _photos(photos_dir):
        image = decode_image(path.read_bytes(), draft_size=config.resize_size).image
        want, got = transform(image).numpy(), eval_pixels(image, config)
        assert got.dtype == np.float32 and got.shape == want.shape, path.name
        assert np.array_equal(got, want), f"{path.name}: max diff {np.abs(got - want).max()}"
        shapes.add(got.shape)
    assert len(shapes) > 1 if "aspect" in frame else shapes == {(3, 224, 224)}


@pytest.mark.parametrize("out", [(160, 160), (157, 203), (224, 224), (300, 100)])
def test_roi_resize_matches_torch_interpolate(out):
    import torch.nn.functional as F

    from regis.models.np_transforms import resize_aa_bicubic

    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    want = F.interpolate(torch.from_numpy(x), size=out, mode="bicubic", align_corners=False, antialias=True).numpy()
    got = resize_aa_bicubic(x, out)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.abs(got - want).max() < 1e-5


def test_numpy_maxsim_matches_torch():
    from regis.scores.maxsim import maxsim_gemm
    from regis.scores.maxsim_np import maxsim_gemm_np

    rng = np.random.default_rng(1)
    query = rng.standard_normal((15, 64)).astype(np.float32)
    docs = rng.standard_normal((50, 10, 64)).astype(np.float16)
    want = maxsim_gemm(torch.from_numpy(query), torch.from_numpy(docs)).numpy()
    for chunk in (None, 3, 50):
        got = maxsim_gemm_np(query, docs, chunk_size=chunk)
        assert got.shape == (50,) and np.allclose(got, want, atol=1e-4)
    with pytest.raises(ValueError, match="widths"):
        maxsim_gemm_np(query[:, :32], docs)


def test_the_bundle_encodes_real_photos_as_the_encoder_does(regis_encoder, bundle_root, photos_dir, one_thread):
    from regis.images.decode import decode_image
    from regis.models.np_transforms import eval_pixels
    from regis.models.query_bundle import load_bundle
    from regis.models.transforms import eval_transform

    fast = load_bundle(regis_encoder.config, regis_encoder.weights_info, bundle_root)
    assert fast is not None and fast.head is not None
    transform = eval_transform(regis_encoder.config)
    for path in _photos(photos_dir)[::3]:
        image = decode_image(path.read_bytes(), draft_size=224).image
        want = regis_encoder.encode_query(transform(image)[None]).numpy()
        got = fast.encode_query(eval_pixels(image, regis_encoder.config)[None])
        assert got.shape == want.shape == (1, 15, 256)
        assert np.abs(got - want).max() < 1e-4, path.name


def test_aspect_frame_without_head_encodes_as_the_encoder_does(photos_dir, tmp_path, one_thread):
    """Non-square inputs of several shapes, a ROI pass sized by ``roi_input_size``, no token head."""
    from regis.images.decode import decode_image
    from regis.models.encoder import build_encoder
    from regis.models.np_transforms import eval_pixels
    from regis.models.query_bundle import load_bundle
    from regis.models.query_export import write_query_bundle
    from regis.models.transforms import eval_transform

    encoder = build_encoder("efficientnet-lite0", frame="aspect")
    write_query_bundle(encoder, tmp_path)
    fast = load_bundle(encoder.config, encoder.weights_info, tmp_path)
    assert fast is not None and fast.head is None
    transform = eval_transform(encoder.config)
    shapes = set()
    for path in _photos(photos_dir)[::5]:
        image = decode_image(path.read_bytes(), draft_size=224).image
        pixels = eval_pixels(image, encoder.config)
        shapes.add(pixels.shape)
        want = encoder.encode_query(transform(image)[None]).numpy()
        assert np.abs(fast.encode_query(pixels[None]) - want).max() < 1e-4, path.name
    assert len(shapes) > 1


def test_numpy_path_returns_the_torch_path_answers(regis_index, bundle_root, photos_dir, one_thread):
    """Same ids, scores within 1e-4, for every photo and an augmented JPEG query (exact mode for every fourth),
    and a search by id."""
    from PIL import Image

    from regis.data.augment import encode_jpeg, random_crop, rescale
    from regis.retrieve.light import LightQueryEngine
    from regis.retrieve.query import QueryEngine
    from tests.conftest import assert_same_json

    torch_engine = QueryEngine.open(regis_index, fast_encode=False)
    light = LightQueryEngine.open(regis_index, root=bundle_root)
    assert light is not None and light.searcher.device is None
    original = Image.open(photos_dir / "skimage-chelsea.png").convert("RGB")
    rng = np.random.default_rng(0)
    augmented = encode_jpeg(rescale(random_crop(original, rng), rng), quality=40)
    queries = [p.read_bytes() for p in _photos(photos_dir)] + [augmented]
    try:
        for i, data in enumerate(queries):
            for mode in ("ann", "exact") if i % 4 == 0 else ("ann",):
                want = torch_engine.search_bytes(data, k=10, mode=mode)
                got = light.search_bytes(data, k=10, mode=mode)
                assert [h["id"] for h in got["results"]] == [h["id"] for h in want["results"]], (i, mode)
                assert_same_json(got, want, f"query {i} {mode}", atol=1e-4)
        assert light.search_bytes(augmented, k=1)["results"][0]["path"] == "skimage-chelsea.png"
        assert_same_json(light.search_id(3, k=5), torch_engine.search_id(3, k=5), "by id", atol=1e-4)
    finally:
        torch_engine.close()
        light.close()


@pytest.fixture(scope="module")
def two_framing_encoder():
    """The demo encoder with the new CNN indexes' default frame: both framings, scored apart ("best")."""
    from regis.models.encoder import build_encoder

    return build_encoder("efficientnet-lite0-regis", frame="center-crop+aspect", framing_score="best")


def test_two_framings_encode_as_the_encoder_does(two_framing_encoder, photos_dir, tmp_path, one_thread):
    """"center-crop+aspect": the central square's 15 tokens, then the whole input's 15, on real photos of several
    shapes and on a 3:1 panorama (its central square resized to image_size)."""
    from PIL import Image

    from regis.images.decode import decode_image
    from regis.models.np_transforms import eval_pixels
    from regis.models.query_bundle import load_bundle
    from regis.models.query_export import write_query_bundle
    from regis.models.transforms import eval_transform

    encoder = two_framing_encoder
    write_query_bundle(encoder, tmp_path)
    fast = load_bundle(encoder.config, encoder.weights_info, tmp_path)
    assert fast is not None and fast.head is not None
    transform = eval_transform(encoder.config)
    images = [decode_image(p.read_bytes(), draft_size=224).image for p in _photos(photos_dir)[::3]]
    wide = Image.open(photos_dir / "skimage-chelsea.png").convert("RGB")
    images.append(wide.resize((wide.width, wide.width // 3)))
    shapes = set()
    for i, image in enumerate(images):
        pixels = eval_pixels(image, encoder.config)
        shapes.add(pixels.shape)
        want = encoder.encode_query(transform(image)[None]).numpy()
        got = fast.encode_query(pixels[None])
        assert got.shape == want.shape == (1, 30, 256)
        assert np.abs(got - want).max() < 1e-4, i
    assert len(shapes) > 1 and any(s[1] != 224 and s[2] != 224 for s in shapes)  # a panorama's input: not square


def test_numpy_path_returns_the_torch_path_answers_on_two_framings(two_framing_encoder, photos_dir, tmp_path,
                                                                   one_thread):
    """An index of both framings with the "best" framing score (new CNN indexes' default): same ids, scores within
    1e-4, ann and exact, for every photo."""
    from regis.models.query_export import write_query_bundle
    from regis.retrieve.light import LightQueryEngine
    from regis.retrieve.query import QueryEngine
    from tests.conftest import assert_same_json

    index, root = tmp_path / "index", tmp_path / "bundles"
    build(photos_dir, index, two_framing_encoder)
    write_query_bundle(two_framing_encoder, root)
    torch_engine = QueryEngine.open(index, fast_encode=False)
    light = LightQueryEngine.open(index, root=root)
    assert light is not None and light.searcher.framings == 2
    try:
        for i, path in enumerate(_photos(photos_dir)):
            data = path.read_bytes()
            for mode in ("ann", "exact") if i % 4 == 0 else ("ann",):
                want = torch_engine.search_bytes(data, k=10, mode=mode)
                got = light.search_bytes(data, k=10, mode=mode)
                assert [h["id"] for h in got["results"]] == [h["id"] for h in want["results"]], (i, mode)
                assert_same_json(got, want, f"query {i} {mode}", atol=1e-4)
            assert got["results"][0]["path"] == path.name
    finally:
        torch_engine.close()
        light.close()


def _search_in_fresh_process(index: Path, query: str, *args: str, bundles: Path) -> tuple[dict, dict, str]:
    """``regis search INDEX QUERY --json ARGS`` through the console entry point in a new interpreter; returns
    its JSON answer, {"torch": imported?, "timm": imported?} read from ``sys.modules`` after it, and its stderr."""
    code = ("import json, sys\nfrom cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    code = e.code\nmods = {m: m in sys.modules for m in ('torch', 'timm', 'torchvision')}\n"
            "print('MODULES ' + json.dumps(mods), file=sys.stderr)\nsys.exit(code)\n")
    argv = ["search", str(index), *([query] if query else []), "--json", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "REGIS_QUERY_BUNDLES": str(bundles)}
    env.pop("REGIS_QUERY_RUNTIME", None)
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stderr.splitlines() if x.startswith("MODULES ")][-1]
    return json.loads(out.stdout), json.loads(line.removeprefix("MODULES ")), out.stderr


def test_cli_search_imports_neither_torch_nor_timm(regis_index, bundle_root, photos_dir, tmp_path, cli):
    query = str(photos_dir / "skimage-coffee.png")
    answer, modules, _ = _search_in_fresh_process(regis_index, query, "-k", "5", bundles=bundle_root)
    assert modules == {"torch": False, "timm": False, "torchvision": False}
    assert answer["results"][0]["path"] == "skimage-coffee.png" and len(answer["results"]) == 5
    # the torch path (no bundle in an empty folder) answers the same, and then writes the bundle
    empty = tmp_path / "bundles"
    first = cli("search", regis_index, query, "-k", "5", "--json", env={"REGIS_QUERY_BUNDLES": str(empty)})
    assert first.returncode == 0 and "saved the torch-free query encoder" in first.stderr
    from tests.conftest import assert_same_json

    assert_same_json(answer, json.loads(first.stdout), "cli", atol=1e-4)
    assert len([p for p in empty.iterdir() if not p.name.startswith(".")]) == 1
    # a search by id needs no encoder at all: no bundle, no torch
    by_id, modules, _ = _search_in_fresh_process(regis_index, "", "--id", "7", "-k", "3", bundles=tmp_path / "none")
    assert modules["torch"] is False and by_id["results"][0]["id"] == 7


def test_cli_search_with_weights_loads_them_instead_of_the_bundle(regis_index, bundle_root, photos_dir, tmp_path,
                                                                  cli):
    """`regis search --weights X` used to be ignored whenever the index's bundle could answer: a file that does not
    exist searched anyway, exit 0. The weights now take the encoder path, which loads and checks them."""
    query = photos_dir / "skimage-coffee.png"
    env = {"REGIS_QUERY_BUNDLES": str(bundle_root)}
    assert "onnx+numpy encoder" in cli("search", regis_index, query, "-k", "1", env=env).stderr  # the bundle serves
    out = cli("search", regis_index, query, "-k", "1", "--weights", tmp_path / "nope.safetensors", env=env)
    assert out.returncode == 1 and "nope.safetensors does not exist" in out.stderr, out.stderr


def test_a_bundle_that_does_not_match_or_cannot_be_read_is_not_used(regis_encoder, bundle_root, tmp_path):
    import shutil

    from regis.models.query_bundle import META_FILE, bundle_dir, load_bundle

    copy = tmp_path / "copy"
    shutil.copytree(bundle_root, copy)
    folder = bundle_dir(regis_encoder.config, regis_encoder.weights_info, copy)
    meta = json.loads((folder / META_FILE).read_text())
    assert load_bundle(regis_encoder.config, regis_encoder.weights_info, copy) is not None
    (folder / META_FILE).write_text(json.dumps({**meta, "weights_sha256": "0" * 64}))
    assert load_bundle(regis_encoder.config, regis_encoder.weights_info, copy) is None
    (folder / META_FILE).write_text(json.dumps({**meta, "onnxruntime": "0.0.1"}))  # another ONNX Runtime wrote it
    assert load_bundle(regis_encoder.config, regis_encoder.weights_info, copy) is None
    (folder / META_FILE).write_text("{not json")
    assert load_bundle(regis_encoder.config, regis_encoder.weights_info, copy) is None
    from regis.models.query_export import write_query_bundle

    assert write_query_bundle(regis_encoder, copy) == folder  # the unreadable bundle is replaced
    assert load_bundle(regis_encoder.config, regis_encoder.weights_info, copy) is not None
    assert [p.name for p in copy.iterdir()] == [folder.name]
    other = regis_encoder.config.model_copy(update={"roi_size": 3})
    assert load_bundle(other, regis_encoder.weights_info, bundle_root) is None  # another key: no folder


def test_encoders_the_numpy_readout_does_not_cover_keep_the_torch_path(tiny_encoder, tmp_path):
    from regis.errors import ConfigError
    from regis.models.query_bundle import load_bundle
    from regis.models.query_export import write_query_bundle

    with pytest.raises(ConfigError, match="CNN"):
        write_query_bundle(tiny_encoder, tmp_path)
    assert load_bundle(tiny_encoder.config, tiny_encoder.weights_info, tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_a_bundle_whose_tokens_differ_is_not_written(regis_encoder, tmp_path, monkeypatch):
    """The token check fails (its tolerance set below any real gap): nothing is published, no temporary left."""
    from regis.errors import ConfigError
    from regis.models import query_export

    monkeypatch.setattr(query_export, "MAX_ABS_DIFF", -1.0)
    with pytest.raises(ConfigError, match="differs from the encoder"):
        query_export.write_query_bundle(regis_encoder, tmp_path)
    assert list(tmp_path.iterdir()) == []
