"""Backbone tokens, computed once and cached, so that thousands of head-training steps fit on 2 CPU cores.

The head is per token (``regis.models.head``), so what it needs from an image is the untrained encoder's query
tokens before any projection: ``RegisEncoder.query_readout``'s (m, F) unit-norm tokens (for EfficientNet-Lite0:
the 10 index tokens, then the 5 cues of the 160 px pass; F = 1280), the first T of which are the index's tokens.
Stored as float16. With ``tail_stages`` S > 0 it holds instead the activations at the input of the backbone's last
S stages, (P, C) per image (``training.photos.tail``: training then runs those stages too).

``instance_cache`` builds the training cache of a split: per photo the whole photo and random regions
(instances); per instance its clean image (what an index holds) and ``views`` strong edits of it
(``training.photos.edits.train_edit``, what queries look like), with every region's box in the photo.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from regis.images.decode import decode_image
from regis.models.encoder import RegisEncoder
from regis.models.transforms import eval_transform
from training.photos import edits

CACHE_FORMAT = 1
REGION_MAX_SIDE = 512
PARTIAL_EVERY = 10


@torch.inference_mode()
def encode_tokens(encoder: RegisEncoder, images: list[Image.Image], batch: int = 16,
                  tail_stages: int = 0) -> torch.Tensor:
    """(n, m, F) float16 unit-norm query tokens of ``images`` (``RegisEncoder.query_readout``; m = the encoder's
    ``query_tokens_per_image``), through the encoder's evaluation transform; ``tail_stages`` S > 0: (n, P, C)
    float16 activations at the input of the last S stages instead (``training.photos.tail.pre_tail``)."""
    from training.photos.tail import pre_tail

    tf = eval_transform(encoder.config)
    out = []
    for i in range(0, len(images), batch):
        x = torch.stack([tf(im) for im in images[i : i + batch]])
        if tail_stages:
            out.append(pre_tail(encoder, x, tail_stages)[0].to(torch.float16))
            continue
        out.append(encoder.forward_with_buddies(x, query=True)[0].to(torch.float16))
    if not out:
        m = encoder.config.query_tokens_per_image
        return torch.empty(0, m, encoder.config.dim, dtype=torch.float16)
    return torch.cat(out)


@dataclass
class InstanceCache:
    """The cached tokens of a split's instances.

    Attributes:
        clean: (I, m, F) float16 tokens of each instance's clean image.
        views: (I, V, m, F) float16 tokens of its V edited views.
        photo: (I,) int64 photo index of each instance (into ``photos``).
        box: (I, 4) float32 the instance's region in its photo, px.
        view_box: (I, V, 4) float32 each view's region in the photo, px (rotation ignored).
        photos: the photo files (relative names).
        config: how it was made (seed, regions, views, encoder config, seconds).
    """

    clean: torch.Tensor
    views: torch.Tensor
    photo: torch.Tensor
    box: torch.Tensor
    view_box: torch.Tensor
    photos: list[str]
    config: dict

    def save(self, path: Path) -> None:
        """Write with ``torch.save`` (a temporary file, then renamed)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save({"format": CACHE_FORMAT, **self.__dict__}, tmp)
        tmp.replace(path)

    @classmethod
    def concat(cls, caches: list[InstanceCache]) -> InstanceCache:
        """One cache of several (their photos renumbered after each other); ``config`` lists theirs."""
        offsets = np.cumsum([0] + [len(c.photos) for c in caches[:-1]])
        return cls(
            clean=torch.cat([c.clean for c in caches]), views=torch.cat([c.views for c in caches]),
            photo=torch.cat([c.photo + int(o) for c, o in zip(caches, offsets, strict=True)]),
            box=torch.cat([c.box for c in caches]), view_box=torch.cat([c.view_box for c in caches]),
            photos=[p for c in caches for p in c.photos], config={"parts": [c.config for c in caches]},
        )

    @classmethod
    def load(cls, path: Path) -> InstanceCache:
        raw = torch.load(path, map_location="cpu", weights_only=False)
        raw.pop("format", None)
        return cls(**raw)


def instance_boxes(w: int, h: int, kind: str, rng: np.random.Generator, scene_regions: int,
                   object_regions: int) -> list[edits.Box]:
    """The whole photo, then ``scene_regions`` (scenes) or ``object_regions`` (objects) random regions keeping
    10-60 % of the area."""
    n = scene_regions if kind == "scene" else object_regions
    return [(0, 0, w, h)] + [edits.random_box(w, h, rng, 0.1, 0.6) for _ in range(n)]


def instance_cache(encoder: RegisEncoder, photos: list[tuple[Path, str]], seed: int = 0, views: int = 4,
                   scene_regions: int = 4, object_regions: int = 0, progress: bool = True,
                   max_side: int = REGION_MAX_SIDE, partial: Path | None = None,
                   tail_stages: int = 0) -> InstanceCache:
    """Build the instance cache of ``photos`` [(file, "scene" | "object")] (module docstring).

    Args:
        encoder: the untrained encoder whose tokens are cached (frozen backbone).
        seed: seeds the regions and the edits.
        views: edited views per instance.
        scene_regions, object_regions: random regions per scene / object photo, besides the whole photo.
        max_side: a region is downscaled to this longest side (px) before it is edited and encoded (the encoder
            sees 224 px; editing 1,024 px regions costs more than the backbone on a shared CPU).
        partial: a file that keeps the work done every ``PARTIAL_EVERY`` photos; an interrupted run given the
            same file continues where it stopped, with the same draws.
        tail_stages: S > 0 caches the activations at the input of the backbone's last S stages instead of the
            tokens (module docstring); the regions and edits drawn are the same as with S = 0.
    """
    from tqdm import tqdm

    rng = np.random.default_rng([seed, 7])
    t0 = time.perf_counter()
    clean, view_tok, photo_idx, boxes, vboxes, names = [], [], [], [], [], []
    done, spent = 0, 0.0
    if partial is not None and Path(partial).is_file():
        state = torch.load(partial, map_location="cpu", weights_only=False)
        clean, view_tok, photo_idx, boxes, vboxes, names = (state[k] for k in (
            "clean", "views", "photo", "box", "view_box", "photos"))
        rng.bit_generator.state, done, spent = state["rng"], state["done"], state["seconds"]
    for pi, (path, kind) in enumerate(tqdm(photos, desc="instances", disable=not progress, unit="photo",
                                           initial=done), start=0):
        if pi < done:
            continue
        img = decode_image(path).image
        names.append(f"{path.parent.name}/{path.name}")
        for box in instance_boxes(img.width, img.height, kind, rng, scene_regions, object_regions):
            region = img.crop(tuple(int(v) for v in box))
            f = min(1.0, max_side / max(region.size))
            small = edits.scale(region, f, min_side=8) if f < 1 else region
            edited = [edits.train_edit(small, rng) for _ in range(views)]
            tokens = encode_tokens(encoder, [small] + [e[0] for e in edited], tail_stages=tail_stages)
            clean.append(tokens[0])
            view_tok.append(tokens[1:])
            photo_idx.append(pi)
            boxes.append(box)
            vboxes.append([(box[0] + b[0] / f, box[1] + b[1] / f, box[0] + b[2] / f, box[1] + b[3] / f)
                           for _, b in edited])
        if partial is not None and ((pi + 1) % PARTIAL_EVERY == 0 or pi + 1 == len(photos)):
            tmp = Path(partial).with_suffix(".tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"clean": clean, "views": view_tok, "photo": photo_idx, "box": boxes, "view_box": vboxes,
                        "photos": names, "rng": rng.bit_generator.state, "done": pi + 1,
                        "seconds": spent + time.perf_counter() - t0}, tmp)
            tmp.replace(partial)
    config = {"seed": seed, "views": views, "scene_regions": scene_regions, "object_regions": object_regions,
              "encoder": encoder.config.model_dump(), "weights": encoder.weights_info.sha256,
              "max_side": max_side, "seconds": round(spent + time.perf_counter() - t0, 1)}
    if tail_stages:  # absent otherwise: a token cache's config (and the head file's metadata) is unchanged
        from training.photos.tail import pre_tail

        probe = torch.zeros(1, 3, encoder.config.image_size, encoder.config.image_size)
        config["tail"] = {"stages": tail_stages, "grids": pre_tail(encoder, probe, tail_stages)[1]}
    return InstanceCache(
        clean=torch.stack(clean), views=torch.stack(view_tok), photo=torch.tensor(photo_idx),
        box=torch.tensor(boxes, dtype=torch.float32), view_box=torch.tensor(vboxes, dtype=torch.float32),
        photos=names, config=config,
    )
