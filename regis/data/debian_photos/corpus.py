"""The offline real-photo corpus (issue 22): the photographs inside a few Debian packages, de-duplicated, with
their package and licence, split by photo into train / val / test.

Layout of a corpus folder (``build_corpus``):

    DIR/corpus.json                      the manifest: packages and versions, seed, split fractions, and per photo
                                         its file, package, source path, kind, licence line, size, perceptual hash,
                                         split and the duplicates dropped in its favour
    DIR/photos/<package>/<name>.jpg      the photos (RGB; longest side at most ``max_side`` px, JPEG q95; a JPEG
                                         already small enough is copied byte for byte)

Read it with ``read_corpus`` / ``corpus_photos``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from regis.data.debian_photos.sources import PACKAGES, Candidate, find_photos, licence_line
from regis.errors import ConfigError

CORPUS_FILE = "corpus.json"
FORMAT = 1
SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.6, 0.1, 0.3)
DEFAULT_MAX_SIDE = 1024
# Two photos are the same photo when their pHashes differ in at most this many bits of 64 AND their 16 x 16
# thumbnails differ by at most MAX_THUMB_DIFF (mean absolute difference, 0-1): on these packages the copies of one
# photo differ by 0-2 bits and 0.001-0.003, while distinct round objects on white (coins, fruit, planets) come
# within 8-12 bits but differ by 0.04 or more.
DEFAULT_HASH_DISTANCE = 6
MAX_THUMB_DIFF = 0.03
DEFAULT_CACHE = Path(os.environ.get("REGIS_CACHE", Path.home() / ".cache" / "regis"))


@dataclass
class PhotoRecord:
    """One photo of the corpus (a row of ``corpus.json``).

    Attributes:
        file: path relative to the corpus folder ("photos/<package>/<name>.jpg").
        package, version: the Debian package it came from.
        source: its path in the package (``fetch``'s extracted tree; ``bundle.rcc:resource/path`` inside a Qt bundle).
        kind: "scene" or "object" (``regis.data.debian_photos.sources``).
        licence: the ``License:`` line of the package's copyright file that covers it.
        copyright: the package's copyright file the line comes from.
        width, height: pixels, as written; original_size: (w, h) in the package.
        phash: 64-bit perceptual hash (imagehash.phash), hex.
        split: "train", "val" or "test".
        duplicates: the other copies dropped in its favour: [{"package", "source"}].
    """

    file: str
    package: str
    version: str
    source: str
    kind: str
    licence: str
    copyright: str
    width: int
    height: int
    original_size: tuple[int, int]
    phash: str
    split: str = ""
    duplicates: list[dict] = field(default_factory=list)


def split_of(package: str, name: str, seed: int, fractions: tuple[float, float, float]) -> str:
    """The split of one photo: a seeded hash of its package and name against the cumulative fractions, so that a
    photo keeps its split when others are added or removed."""
    digest = hashlib.sha256(f"{seed}:{package}/{name}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < fractions[0]:
        return "train"
    return "val" if u < fractions[0] + fractions[1] else "test"


def _load_rgb(data: bytes, max_side: int) -> tuple[Image.Image, tuple[int, int]]:
    img = Image.open(io.BytesIO(data))
    size = img.size
    if img.format == "JPEG" and max_side:
        img.draft("RGB", (max_side, max_side))
    if img.mode in ("RGBA", "LA", "P", "PA") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        img = Image.new("RGB", rgba.size, (255, 255, 255))
        img.paste(rgba, mask=rgba.getchannel("A"))
    else:
        img = img.convert("RGB")
    if max_side and max(img.size) > max_side:
        scale = max_side / max(img.size)
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.LANCZOS)
    return img, size


def _hamming(a: int, b: int) -> int:
    return bin(a ^ b).count("1")


def _thumb(img: Image.Image) -> np.ndarray:
    return np.asarray(img.resize((16, 16), Image.BILINEAR), dtype=np.float32) / 255.0


def _dedup(items: list[tuple[Candidate, Image.Image, tuple[int, int], int]], max_distance: int) -> list[list[int]]:
    """Groups of indices that are the same photo (pHash within ``max_distance`` bits and thumbnails within
    ``MAX_THUMB_DIFF``; transitively), largest original first."""
    parent = list(range(len(items)))
    thumbs = [_thumb(it[1]) for it in items]

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            if (_hamming(items[i][3], items[j][3]) <= max_distance
                    and float(np.abs(thumbs[i] - thumbs[j]).mean()) <= MAX_THUMB_DIFF):
                parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(items)):
        groups.setdefault(root(i), []).append(i)
    size = lambda i: items[i][2][0] * items[i][2][1]  # noqa: E731
    return [sorted(g, key=lambda i: (-size(i), i)) for g in groups.values()]


def build_corpus(
    roots: dict[str, tuple[Path, str]],
    out_dir: Path,
    seed: int = 0,
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
    max_side: int = DEFAULT_MAX_SIDE,
    max_distance: int = DEFAULT_HASH_DISTANCE,
    progress: bool = False,
) -> list[PhotoRecord]:
    """Write the corpus from extracted packages (``fetch.fetch_packages``' output, or any tree laid out the same).

    Args:
        roots: {package: (extracted root, version)}; packages not in ``sources.PACKAGES`` are refused.
        out_dir: the corpus folder (created; ``photos/`` and ``corpus.json`` are replaced).
        seed: the split seed (``split_of``).
        fractions: (train, val, test), summing to 1.
        max_side: longest side of a written photo, px (0: keep the size).
        max_distance: pHash Hamming distance (bits of 64) within which photos are duplicates.
        progress: show a progress bar.

    Returns:
        The records written to ``corpus.json``, sorted by file.

    Raises:
        ConfigError: an unknown package, bad fractions, or no photo found.
    """
    import imagehash
    from tqdm import tqdm

    unknown = set(roots) - set(PACKAGES)
    if unknown:
        raise ConfigError(f"not a package of the photo corpus: {sorted(unknown)}; the corpus uses {PACKAGES}")
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
        raise ConfigError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    candidates = [(c, roots[p][1], roots[p][0]) for p in PACKAGES if p in roots for c in find_photos(p, roots[p][0])]
    if not candidates:
        raise ConfigError("no photo found in the packages given")
    items, raw = [], []
    for cand, _version, _root in tqdm(candidates, desc="photos", disable=not progress, unit="photo"):
        data = cand.read()
        img, size = _load_rgb(data, max_side)
        items.append((cand, img, size, int(str(imagehash.phash(img)), 16)))
        raw.append(data)
    out_dir = Path(out_dir)
    photos_dir = out_dir / "photos"
    photos_dir.mkdir(parents=True, exist_ok=True)
    licences: dict[str, str] = {}
    records = []
    for group in _dedup(items, max_distance):
        keep = group[0]
        cand, img, size, phash = items[keep]
        version, root = candidates[keep][1], Path(candidates[keep][2])
        copyright_path = f"usr/share/doc/{cand.package}/copyright"
        if cand.package not in licences:
            path = root / copyright_path
            licences[cand.package] = path.read_text(errors="replace") if path.is_file() else ""
        stem = Path(cand.name).stem
        rel = f"photos/{cand.package}/{stem}.jpg"
        dest = out_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if raw[keep][:3] == b"\xff\xd8\xff" and img.size == size:
            dest.write_bytes(raw[keep])
        else:
            img.save(dest, format="JPEG", quality=95)
        records.append(PhotoRecord(
            file=rel, package=cand.package, version=version, source=cand.source, kind=cand.kind,
            licence=licence_line(licences[cand.package], cand.licence_key), copyright=copyright_path,
            width=img.width, height=img.height, original_size=size, phash=f"{phash:016x}",
            split=split_of(cand.package, stem, seed, fractions),
            duplicates=[{"package": items[i][0].package, "source": items[i][0].source} for i in group[1:]],
        ))
    records.sort(key=lambda r: r.file)
    keep_files = {r.file for r in records}
    for path in photos_dir.rglob("*"):
        if path.is_file() and str(path.relative_to(out_dir)) not in keep_files:
            path.unlink()
    manifest = {
        "format": FORMAT, "seed": seed, "fractions": list(fractions), "max_side": max_side,
        "max_hash_distance": max_distance,
        "packages": {p: roots[p][1] for p in PACKAGES if p in roots},
        "counts": {s: {k: sum(r.split == s and r.kind == k for r in records) for k in ("scene", "object")}
                   for s in SPLITS},
        "photos": [asdict(r) for r in records],
    }
    tmp = out_dir / (CORPUS_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(out_dir / CORPUS_FILE)
    return records


def read_corpus(corpus_dir: Path) -> tuple[dict, list[PhotoRecord]]:
    """The manifest (without its photo list) and the records of a corpus folder.

    Raises:
        ConfigError: no ``corpus.json`` there (build it with ``regis photos --source debian DIR``), or a format
            this regis does not read.
    """
    path = Path(corpus_dir) / CORPUS_FILE
    if not path.is_file():
        raise ConfigError(f"{path} not found: build the corpus with `regis photos --source debian {corpus_dir}`")
    raw = json.loads(path.read_text())
    if raw.get("format") != FORMAT:
        raise ConfigError(f"{path} has corpus format {raw.get('format')!r}; this regis reads {FORMAT}")
    photos = raw.pop("photos")
    return raw, [PhotoRecord(**{**p, "original_size": tuple(p["original_size"])}) for p in photos]


def corpus_photos(corpus_dir: Path, split: str | None = None, kind: str | None = None) -> list[Path]:
    """The photo files of a corpus, sorted, optionally only one split ("train", "val", "test") and kind
    ("scene", "object").

    Raises:
        ConfigError: as ``read_corpus``; an unknown split or kind.
    """
    if split not in (None, *SPLITS):
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    if kind not in (None, "scene", "object"):
        raise ConfigError(f"kind must be scene or object, got {kind!r}")
    _, records = read_corpus(corpus_dir)
    return [Path(corpus_dir) / r.file for r in records
            if (split is None or r.split == split) and (kind is None or r.kind == kind)]


def fetch_and_build(out_dir: Path, cache: Path = DEFAULT_CACHE, packages: tuple[str, ...] = PACKAGES,
                    progress: bool = True, **kwargs) -> list[PhotoRecord]:
    """``fetch.fetch_packages`` into ``cache`` (debs and extracted trees), then ``build_corpus`` into ``out_dir``."""
    from regis.data.debian_photos.fetch import fetch_packages

    return build_corpus(fetch_packages(packages, Path(cache)), out_dir, progress=progress, **kwargs)
