"""The Debian real-photo corpus (issue 22) on a tiny fake package tree: no network, no apt-get."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from regis.data.debian_photos import build_corpus, corpus_photos, read_corpus
from regis.data.debian_photos.sources import licence_line
from regis.data.qt_rcc import RccBundle, RccFormatError


def write_rcc(files: dict[str, bytes], compress: set[str] = frozenset()) -> bytes:
    """A version-3 Qt resource bundle holding ``files`` ({"a/b/c.webp": bytes}); those in ``compress`` zlib'd."""
    tree: dict = {}
    for path, data in files.items():
        node = tree
        *dirs, leaf = path.split("/")
        for d in dirs:
            node = node.setdefault(d, {})
        node[leaf] = data
    names, payload, nodes = bytearray(), bytearray(), []
    name_off: dict[str, int] = {}

    def name(n: str) -> int:
        if n not in name_off:
            name_off[n] = len(names)
            raw = n.encode("utf-16-be")
            names.extend(struct.pack(">HI", len(raw) // 2, 0) + raw)
        return name_off[n]

    # breadth-first: a directory's children are consecutive nodes
    nodes.append(None)
    queue = [(0, "", tree, "")]
    while queue:
        idx, n, content, path = queue.pop(0)
        if isinstance(content, dict):
            first = len(nodes)
            children = sorted(content.items())
            nodes.extend([None] * len(children))
            nodes[idx] = struct.pack(">IHII", name(n) if idx else 0, 2, len(children), first) + bytes(8)
            for k, (cn, cc) in enumerate(children):
                queue.append((first + k, cn, cc, f"{path}/{cn}".lstrip("/")))
        else:
            data = content
            flags = 0
            if path in compress:
                data, flags = struct.pack(">I", len(content)) + zlib.compress(content), 1
            off = len(payload)
            payload.extend(struct.pack(">I", len(data)) + data)
            nodes[idx] = struct.pack(">IHHHI", name(n), flags, 0, 0, off) + bytes(8)
    tree_b = b"".join(nodes)
    header = 24
    tree_off, data_off = header, header + len(tree_b)
    names_off = data_off + len(payload)
    return b"qres" + struct.pack(">IIIII", 3, tree_off, data_off, names_off, 0) + tree_b + bytes(payload) + bytes(names)


def photo(seed: int, size=(96, 72), fmt="JPEG", alpha=False) -> bytes:
    """A photo-like image: smooth random structure plus sensor-like noise (no flat regions)."""
    rng = np.random.default_rng(seed)
    low = rng.uniform(0, 255, (size[1] // 8 + 1, size[0] // 8 + 1, 3))
    img = np.kron(low, np.ones((8, 8, 1)))[: size[1], : size[0]] + rng.normal(0, 12, (size[1], size[0], 3))
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    if alpha:
        a = np.zeros((size[1], size[0]), np.uint8)
        a[4:-4, 4:-4] = 255
        im.putalpha(Image.fromarray(a))
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


def drawing(size=(96, 96)) -> bytes:
    """A clip-art-like RGBA image: two flat colours."""
    im = Image.new("RGBA", size, (0, 0, 0, 0))
    im.paste((200, 30, 30, 255), (8, 8, 88, 88))
    im.paste((30, 30, 200, 255), (30, 30, 60, 60))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/

Files: *
Copyright: someone
License: GPL-3+

Files: src/activities/categorization/resource/*
Copyright: someone else
License: CC-BY-SA-4.0
"""


def put(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


@pytest.fixture()
def fake_tree(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    root = tmp_path / "extracted"
    g = root / "gcompris-qt-data"
    put(g / "usr/share/gcompris-qt/rcc/categorization.rcc", write_rcc({
        "gcompris/src/activities/categorization/resource/images/tools/hammer.webp": photo(1, fmt="WEBP"),
        "gcompris/src/activities/categorization/resource/images/tools/saw.webp": photo(2, fmt="WEBP"),
        "gcompris/src/activities/categorization/resource/images/tools/logo.svg": b"<svg/>",
        "gcompris/src/activities/categorization/Categorization.qml": b"Item {}",
    }, compress={"gcompris/src/activities/categorization/resource/images/tools/saw.webp"}))
    put(g / "usr/share/gcompris-qt/rcc/explore_monuments.rcc", write_rcc({
        "gcompris/src/activities/explore_monuments/resource/egypt/pyramid.webp": photo(3, size=(200, 150),
                                                                                         fmt="WEBP"),
    }))
    put(g / "usr/share/doc/gcompris-qt-data/copyright", DEP5)
    m = root / "mate-backgrounds"
    put(m / "usr/share/backgrounds/mate/nature/Leaf.jpg", photo(4))
    put(m / "usr/share/backgrounds/mate/abstract/Waves.png", drawing())  # a render: not in nature/
    # the same photo as the monument, smaller: a cross-package duplicate
    small = Image.open(io.BytesIO(photo(3, size=(200, 150), fmt="PNG"))).resize((100, 75), Image.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="JPEG", quality=90)
    put(m / "usr/share/backgrounds/mate/nature/Pyramid.jpg", buf.getvalue())
    put(m / "usr/share/doc/mate-backgrounds/copyright", "Files: nature/*\nLicense: GPL-2+\n")
    s = root / "tuxpaint-stamps-default"
    put(s / "usr/share/tuxpaint/stamps/animals/cat.png", photo(5, fmt="PNG", alpha=True))
    put(s / "usr/share/tuxpaint/stamps/animals/clipart.png", drawing())
    put(s / "usr/share/tuxpaint/stamps/symbols/alphabets/a.png", photo(6, fmt="PNG", alpha=True))
    put(s / "usr/share/tuxpaint/stamps/animals/thumbs/cat.png", photo(7, fmt="PNG", alpha=True))
    return {"gcompris-qt-data": (g, "3.1-2"), "mate-backgrounds": (m, "1.26.0-1"),
            "tuxpaint-stamps-default": (s, "2022.06.04-1")}


def test_rcc_reader_lists_and_decompresses():
    files = {"a/b/one.txt": b"hello", "a/two.bin": bytes(range(256)) * 4}
    bundle = RccBundle(write_rcc(files, compress={"a/two.bin"}))
    entries = {e.path: e for e in bundle.entries()}
    assert set(entries) == set(files)
    assert entries["a/two.bin"].flags == 1
    assert {p: bundle.read(e) for p, e in entries.items()} == files
    with pytest.raises(RccFormatError, match="qres"):
        RccBundle(b"not a bundle at all")


def test_corpus_from_fake_packages(fake_tree, tmp_path):
    out = tmp_path / "corpus"
    records = build_corpus(fake_tree, out, seed=0, max_side=128)
    by_source = {r.source.split(":")[-1].split("/")[-1]: r for r in records}
    # photos kept; the svg, the qml, the abstract render, the clip-art stamp, the alphabet stamp, thumbs dropped
    assert set(by_source) == {"hammer.webp", "saw.webp", "pyramid.webp", "Leaf.jpg", "cat.png"}
    # the mate copy of the pyramid is smaller: dropped in favour of gcompris's, and recorded
    pyramid = by_source["pyramid.webp"]
    assert pyramid.duplicates == [{"package": "mate-backgrounds",
                                   "source": "usr/share/backgrounds/mate/nature/Pyramid.jpg"}]
    assert pyramid.kind == "scene" and by_source["hammer.webp"].kind == "object"
    # licence: the DEP-5 stanza that matches the upstream path, else Files: *
    assert by_source["hammer.webp"].licence == "License: CC-BY-SA-4.0"
    assert pyramid.licence == "License: GPL-3+"
    assert by_source["Leaf.jpg"].licence == "License: GPL-2+"
    assert by_source["Leaf.jpg"].version == "1.26.0-1"
    # written photos: RGB, longest side <= max_side, the stamp composited on white
    for r in records:
        img = Image.open(out / r.file)
        assert img.mode == "RGB" and max(img.size) <= 128 and (img.width, img.height) == (r.width, r.height)
    cat = np.asarray(Image.open(out / by_source["cat.png"].file))
    assert cat[0, 0].min() >= 245  # the transparent border became white
    # the manifest reads back; the split is fixed by the seed and written there
    meta, back = read_corpus(out)
    assert [r.file for r in back] == [r.file for r in records]
    assert meta["packages"] == {"gcompris-qt-data": "3.1-2", "mate-backgrounds": "1.26.0-1",
                                "tuxpaint-stamps-default": "2022.06.04-1"}
    assert {r.split for r in back} <= {"train", "val", "test"}
    again = build_corpus(fake_tree, tmp_path / "again", seed=0, max_side=128)
    assert [(r.file, r.split) for r in again] == [(r.file, r.split) for r in records]
    other = build_corpus(fake_tree, tmp_path / "other", seed=0, max_side=128, fractions=(0.0, 0.0, 1.0))
    assert {r.split for r in other} == {"test"}
    assert corpus_photos(tmp_path / "other", split="test", kind="object") == sorted(
        tmp_path / "other" / r.file for r in other if r.kind == "object")
    assert json.loads((out / "corpus.json").read_text())["counts"]


def test_licence_line_fallbacks():
    assert licence_line("Files: *\nLicense: MIT\n\nFiles: x/*\nLicense: BSD\n", "x/y.png") == "License: BSD"
    assert licence_line("Files: a/*\nLicense: MIT\n", "b/c.png") == "License: MIT"
    assert licence_line("no licence here", "a") == ""
